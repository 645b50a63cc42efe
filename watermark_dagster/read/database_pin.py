"""Pinning a database window's end in the database itself.

A database window is filtered by the database (``in_window``'s filters, which Spark pushes
into its query), so its end is pinned by the database too: one order decides every
comparison of a window position, the column's collation for text (a case-insensitive or
ICU collation orders ``'a'``, ``'A'`` and ``'B'`` otherwise than bytes do, and a row
between two orders would be in no window). Over one connection and one snapshot, through
the look's pure-Python driver (:mod:`watermark_dagster.observe.database_state`), without a
Spark job:

- the greatest position after the window's start at or below the ceiling
  (``ORDER BY cursor DESC, *tie_break DESC LIMIT 1``, the look's index);
- the rows after the start above the ceiling (held back) and the lowest of their cursors;
- the rows without a position (a NULL cursor or tie-break value), in no window.

Positions are stored as today: microseconds since the epoch for timestamps (a value
without a zone read as UTC; the session is in UTC, which MariaDB's ``TIMESTAMP`` values
depend on), days since the epoch for dates, the value itself otherwise. The queries are
made of validated identifiers quoted for the database; every value is a bound parameter.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from watermark_dagster.config.database import DRIVERS, DatabaseUpstream
from watermark_dagster.core.ranges import CursorPosition, CursorWindow
from watermark_dagster.core.sightings import Sighting, sighted_ceiling
from watermark_dagster.errors import ConfigurationError, UpstreamUnavailableError
from watermark_dagster.observe.database_state import (
    columns_query,
    connect,
    credentials_of,
    driver_message,
    is_integer_type,
    is_timestamp_type,
    null_cursor_query,
)

_EPOCH = datetime(1970, 1, 1)
_EPOCH_DAY = date(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class PinnedEnd:
    """What the data said when a window's end was pinned.

    Attributes:
        end: the greatest position at or below the ceiling (None: no such row).
        held_back: rows after the start whose position is above the ceiling (the lag).
        recheck_at: when the earliest held-back row passes the lag (µs since the epoch).
        no_cursor: rows whose cursor (and fallback) is NULL: never read.
    """

    end: CursorPosition | None
    held_back: int
    recheck_at: int | None
    no_cursor: int


def stored_value(value: object) -> object:
    """A value the driver returned as a position stores it: µs since the epoch for a
    timestamp (one without a zone is UTC's wall clock, as Spark's UTC JVM reads it), days
    since the epoch for a date, the value itself otherwise."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return (value - _EPOCH) // _MICROSECOND
    if isinstance(value, date):
        return (value - _EPOCH_DAY).days
    return value


def bound_value(type_name: str, value: object) -> object:
    """A stored position's value as a parameter of the column's catalog type (the inverse
    of :func:`stored_value`): a timestamp with a zone as a UTC instant, one without as UTC's
    wall clock, a date as a date."""
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    kind = type_name.lower()
    if is_timestamp_type(kind):
        moment = _EPOCH + value * _MICROSECOND
        return moment.replace(tzinfo=UTC) if "with time zone" in kind else moment
    if kind.startswith("date"):
        return _EPOCH_DAY + timedelta(days=value)
    return value


def _lexicographic(names: Sequence[str], values: Sequence[object], last: str) -> tuple[str, list]:
    """``(names) > (values)`` (``last`` ``>``) or ``<=`` (``last`` ``<=``, first ops ``<``),
    spelled out column by column (a row comparison would not use the collation of each
    column on every database), with its parameters."""
    first = ">" if last == ">" else "<"
    sql, params = f"{names[-1]} {last} %s", [values[-1]]
    for name, value in reversed(list(zip(names[:-1], values[:-1], strict=True))):
        sql = f"({name} {first} %s OR ({name} = %s AND {sql}))"
        params = [value, value, *params]
    return f"({sql})", params


# The looks' sightings of an upstream from a moment on (core/sightings.py), newest first.
Sightings = Callable[[datetime], Sequence[Sighting]]


def pin_in_database(
    upstream: DatabaseUpstream,
    window: CursorWindow,
    now: datetime,
    sightings: Sightings | None = None,
) -> PinnedEnd:
    """The end a new window should have, asked of the database: the greatest position
    after the window's start whose cursor is at or below the ceiling. The ceiling of a
    timestamp cursor is ``now`` minus ``lag_seconds``; with a lag, that of a date cursor is
    the last day (UTC) that ended at least the lag ago, and that of an integer cursor the
    greatest value a look saw at least the lag ago (``sightings``; none given: none was).

    Raises:
        ConfigurationError: ``lag_seconds`` is set on a cursor that is not a timestamp, a
            date or an integer.
        UpstreamUnavailableError: the database did not answer, or has no such table or
            column (the message names the upstream and the driver's reason).
    """
    credentials: dict[str, Any] = {}
    try:
        credentials = credentials_of(upstream)
        connection = connect(upstream, credentials)
        try:
            return _pin(connection, upstream, window, now, sightings)
        finally:
            connection.close()
    except (UpstreamUnavailableError, ConfigurationError):
        raise
    except Exception as e:  # the drivers' errors share no base class
        raise UpstreamUnavailableError(
            f"Upstream '{upstream.name}': the database at {upstream.url} did not answer "
            f"pinning the window {window} of {upstream.source_table} "
            f"({driver_message(e, credentials.values())}).",
            upstream=upstream.name,
            fix="check that the database is up and reachable from the run, that the "
            "credential variables are set there, and that the table and its cursor columns "
            "exist; then retry the batch (`watermark run --retry`).",
        ) from None


@dataclass(frozen=True)
class _Ceiling:
    """How far a window may end: the cursor's ceiling (None: none), or ``closed`` (no row
    may be read yet), and when the rows held above it pass the lag (``recheck_at``, or
    from the lowest held cursor by ``recheck_after``)."""

    cursor: int | None = None
    closed: bool = False
    recheck_at: int | None = None
    recheck_after: Callable[[object], int] | None = None


def _ceiling(
    upstream: DatabaseUpstream, kind: str, now: datetime, sightings: Sightings | None
) -> _Ceiling:
    lag = timedelta(seconds=upstream.lag_seconds)
    lag_micros = lag // _MICROSECOND
    if is_timestamp_type(kind):
        return _Ceiling(_stored_int(now - lag), recheck_after=lambda v: _stored_int(v) + lag_micros)
    if not upstream.lag_seconds:
        return _Ceiling()
    if kind.lower() == "date":  # a day's rows are written until it ends
        last_day = _stored_int((now - lag).astimezone(UTC).date()) - 1
        return _Ceiling(last_day, recheck_after=lambda v: (_stored_int(v) + 1) * _DAY + lag_micros)
    if is_integer_type(kind):
        seen = sightings(now - lag) if sightings is not None else ()
        found = sighted_ceiling(seen, now, upstream.lag_seconds)
        return _Ceiling(found.ceiling, found.ceiling is None, recheck_at=found.recheck_at)
    raise ConfigurationError(
        f"Upstream '{upstream.name}': lag_seconds={upstream.lag_seconds:g} applies to a "
        f"timestamp, date or integer cursor only; {upstream.cursor} is {kind}, where a lag "
        "has no meaning. Nothing was read.",
        upstream=upstream.name,
        fix="remove lag_seconds, or read the source by a timestamp, date or integer cursor.",
    )


def _pin(
    connection: Any,
    upstream: DatabaseUpstream,
    window: CursorWindow,
    now: datetime,
    sightings: Sightings | None,
) -> PinnedEnd:
    cursor = connection.cursor()
    if upstream.database == "postgresql":  # one snapshot for every count below
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
    query, params = columns_query(upstream)
    cursor.execute(query, params)
    found = cursor.fetchall()
    types = {str(n): str(t) for n, t, _ in found}
    nullable = {str(n) for n, _, may_be_null in found if str(may_be_null).upper() in _YES}
    read = list(upstream.columns_read)
    missing = [c for c in read if c not in types]
    if missing:
        raise UpstreamUnavailableError(
            f"Upstream '{upstream.name}': {upstream.source_table} has no column "
            f"{', '.join(missing)}, so no window can be pinned.",
            upstream=upstream.name,
            fix="restore the column, or declare the upstream's cursor and tie_break as the "
            "table now has them; then retry the batch (`watermark run --retry`).",
        )
    kind = types[read[0]]
    ceiling = _ceiling(upstream, kind, now, sightings)
    quote = DRIVERS[upstream.database][1]
    names = [f"{quote}{c}{quote}" for c in read]
    start = [bound_value(types[c], v) for c, v in zip(read, window.start or (), strict=False)]
    present = " AND ".join(f"{n} IS NOT NULL" for n in names)
    after, after_params = ("", [])
    if window.start:
        after, after_params = _lexicographic(names, start, ">")
        after = f" AND {after}"
    below, below_params = "", []
    if ceiling.closed:
        below = "1 = 0"
    elif ceiling.cursor is not None:
        below, below_params = f"{names[0]} <= %s", [bound_value(kind, ceiling.cursor)]
    where = f"{present}{after}"
    order = ", ".join(f"{n} DESC" for n in names)
    cursor.execute(
        f"SELECT {', '.join(names)} FROM {upstream.quoted_table} "
        f"WHERE {where}{f' AND {below}' if below else ''} ORDER BY {order} LIMIT 1",
        (*after_params, *below_params),
    )
    top = cursor.fetchone()
    held_back, first_held = 0, None
    if below:
        cursor.execute(
            f"SELECT count(*), min({names[0]}) FROM {upstream.quoted_table} "
            f"WHERE {where} AND NOT ({below})",
            (*after_params, *below_params),
        )
        counted = cursor.fetchone()
        if counted is not None:
            held_back, first_held = int(counted[0] or 0), counted[1]
    cursor.execute(null_cursor_query(upstream, nullable))
    without = cursor.fetchone()
    connection.commit()
    recheck_at = None
    if held_back and ceiling.recheck_after is not None and first_held is not None:
        recheck_at = ceiling.recheck_after(first_held)
    elif held_back:
        recheck_at = ceiling.recheck_at
    return PinnedEnd(
        end=None if top is None else tuple(stored_value(v) for v in top),
        held_back=held_back,
        recheck_at=recheck_at,
        no_cursor=int(without[0] if without else 0),
    )


_YES = ("YES", "TRUE", "T", "1")
_DAY = 86_400_000_000


def _stored_int(value: object) -> int:
    found = stored_value(value)
    assert isinstance(found, int)
    return found


__all__ = [
    "PinnedEnd",
    "Sightings",
    "bound_value",
    "pin_in_database",
    "stored_value",
]
