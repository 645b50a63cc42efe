"""Key paths: how one upstream's rows reach a declared pipeline's target keys.

Written by a user (:func:`~watermark_dagster.config.declared.parse_key_path`) or inferred
from a declared query (:mod:`~watermark_dagster.config.key_inference`); followed by every
batch to find the keys it touched (:mod:`~watermark_dagster.read.derive`).
"""

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Hop:
    """One step of a key path: rows of ``upstream`` whose ``match`` columns equal the
    values carried so far; their ``carry`` columns go on."""

    upstream: str
    match: tuple[str, ...]
    carry: tuple[str, ...]


@dataclass(frozen=True)
class KeyPath:
    """How one upstream's rows reach the target's keys.

    ``start`` are the upstream's own columns whose changed values start the walk; each hop
    joins the pinned snapshot of another upstream (or of the same one, for a query that
    joins an upstream to itself). With no hops, ``start`` are the columns holding the
    target keys (in the order of the target's ``keys``).

    ``computed``: empty when the walk ends at the keys themselves; else one entry per
    target key, the Spark SQL expression that gives the key from the walk's ``end``
    column of the same position (named :func:`key_input` there), or None where that
    column is the key. A query keyed by ``DATE(o.created_at)`` ends its paths at
    ``created_at`` and computes the key from it (:mod:`~watermark_dagster.config.key_inference`).
    """

    upstream: str
    start: tuple[str, ...]
    hops: tuple[Hop, ...] = ()
    computed: tuple[str | None, ...] = ()

    @property
    def direct(self) -> bool:
        """True when the upstream holds the target keys itself."""
        return not self.hops

    @property
    def end(self) -> tuple[str, ...]:
        """The columns the walk ends at: the target keys, in order (or the columns they
        are ``computed`` from)."""
        return self.hops[-1].carry if self.hops else self.start

    def folded(self) -> "KeyPath":
        """The path with its names in lower case (Spark's identifiers are
        case-insensitive), for comparing a declared path with an inferred one."""
        return KeyPath(
            self.upstream.lower(),
            tuple(c.lower() for c in self.start),
            tuple(
                Hop(
                    h.upstream.lower(),
                    tuple(c.lower() for c in h.match),
                    tuple(c.lower() for c in h.carry),
                )
                for h in self.hops
            ),
            self.computed,
        )

    def __str__(self) -> str:
        def step(table: str, columns: tuple[str, ...]) -> str:
            return (
                f"{table}.{columns[0]}" if len(columns) == 1 else f"{table}.({', '.join(columns)})"
            )

        if self.direct:
            walk = ", ".join(self.start)
        else:
            parts = [step(self.upstream, self.start)]
            for hop in self.hops:
                parts += [step(hop.upstream, hop.match), step(hop.upstream, hop.carry)]
            walk = " -> ".join(parts)
        if not self.computed:
            return walk
        shown = [
            column if e is None else e.replace(f"`{key_input(i)}`", column)
            for i, (column, e) in enumerate(zip(self.end, self.computed, strict=True))
        ]
        return f"{walk} => {', '.join(shown)}"


def key_input(position: int) -> str:
    """The name a :attr:`KeyPath.computed` expression gives the end column it reads."""
    return f"_wm_key_input{position}"


def restrictable(paths: Iterable[KeyPath]) -> KeyPath | None:
    """The path by which an upstream read along ``paths`` can be cut down to the touched
    keys before the full transform runs (the rows whose start columns give one): the one
    path when every path is direct from the same columns, else None (a row of it may
    reach a key other than its own, as a manager's row reaches their reports')."""
    distinct = set(paths)
    if len(distinct) != 1 or not all(p.direct for p in distinct):
        return None
    return next(iter(distinct))
