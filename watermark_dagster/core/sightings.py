"""The lag of an integer cursor: how far a window may end, from what looks saw when.

A timestamp cursor's lag ends a window at ``now - lag``: a writer is assumed to commit a
row within ``lag_seconds`` of its cursor value. An integer cursor (an id from a sequence)
has no time in it, so the looks' sightings stand in for one: the window ends at the
greatest cursor value a look saw at least ``lag_seconds`` ago. A row at or below that
value took its id before the look saw it (ids are taken in increasing order), so under the
same assumption, a writer commits within the lag of taking its id, it has committed by
now. A transaction that took id 1 and commits after id 2 was seen is loaded, provided it
commits within the lag.

The sightings are the looks that planned a batch: each batch records, per upstream, the
look's state (``db:`` and its top position) and when it was planned (after the look, so
the sighting is never younger than it says). They are durable and the control root's own.
Plain Python: no database, Spark or Delta here.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

Sighting = tuple[datetime, str | None]
"""When a batch was planned, and the look's state it recorded for the upstream."""


def sighted_cursor(state: str | None) -> int | None:
    """The integer cursor value a database look's state shows (``db:42`` or
    ``db:42|...`` -> 42; ``db:empty``, another state or None -> None)."""
    if not state or not state.startswith("db:"):
        return None
    head = state[3:].split("|", 1)[0]
    try:
        return int(head)
    except ValueError:
        return None


@dataclass(frozen=True)
class SightedCeiling:
    """How far an integer cursor's window may end now.

    Attributes:
        ceiling: the greatest cursor value sighted at least the lag ago (None: none was,
            so no row may be read yet).
        recheck_at: when the next sighting above the ceiling passes the lag (µs since the
            epoch; None: no such sighting).
    """

    ceiling: int | None
    recheck_at: int | None


def sighted_ceiling(
    sightings: Iterable[Sighting], now: datetime, lag_seconds: float
) -> SightedCeiling:
    """The ceiling of an integer cursor's window at ``now`` (see the module)."""
    lag = timedelta(seconds=lag_seconds)
    cutoff = now - lag
    seen = [(at, c) for at, state in sightings if (c := sighted_cursor(state)) is not None]
    ceiling = max((c for at, c in seen if at <= cutoff), default=None)
    pending = [at for at, c in seen if at > cutoff and (ceiling is None or c > ceiling)]
    recheck = None
    if pending:
        passes = min(pending) + lag
        recheck = (passes - datetime(1970, 1, 1, tzinfo=passes.tzinfo)) // timedelta(microseconds=1)
    return SightedCeiling(ceiling, recheck)


__all__ = ["Sighting", "SightedCeiling", "sighted_ceiling", "sighted_cursor"]
