"""The other side of a join read only for what a batch touched: the rows of an upstream
reached through a join path (:class:`~watermark_dagster.config.key_paths.KeyPath` with
hops) that can reach a touched target key, found by walking each path backwards from the
keys.

This is the read side of the delta rule (ΔA⋈B ∪ A⋈ΔB): the touched keys are ΔA's keys and
the keys B's changes reach (:mod:`~watermark_dagster.read.derive`); recomputing them needs
A's rows for those keys (an upstream holding the keys is cut down to them) and only the
rows of B that join them, not the whole of B. Each step is an ``IN`` filter on a pinned
snapshot (which Delta also skips files with, by the log's per-file statistics) and a
collect of at most ``limit`` values; past it the upstream is read whole. Off unless the
Spark setting :data:`BY_KEYS_CONF` is true (see there for what it costs).

Why the rows kept are enough. Take a touched key ``k`` and the rows of an upstream ``U``
whose walk along none of its paths reaches ``k`` in the pinned snapshots. Removing them is
a change like any other, so by the derivation's own rule (the module docstring of
:mod:`~watermark_dagster.read.derive`), ``k``'s row can differ only if one of the removed
rows reaches ``k`` through rows the change left alone, which are rows of the snapshots:
none does, so ``k``'s row is the same. Cutting several upstreams down one after another
keeps this true, since each walk runs through the whole snapshots, a superset of what is
left. NULL is matched to NULL at every step (:func:`~watermark_dagster.read.key_values.
where_in`), which can keep more rows than the query's own ``=`` joins, never fewer.
"""

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.config.key_paths import KeyPath, key_input
from watermark_dagster.errors import TerminalError
from watermark_dagster.frames.changes import quoted
from watermark_dagster.read.key_values import collected, compared_alike, one_of, where_in

# Our own Spark setting, off by default: "true" reads a joined upstream only for the rows
# that reach the touched keys. The walk scans the upstreams its paths hop through once more
# to skip rows of the joined one, which pays only where the joined upstream is the larger
# and Delta can skip its files by the join key (clustered by it). On the demo it does not:
# orders_enriched took 14.4 s against 12.2 s read whole at 2M orders, since the walk scans
# the 2M orders again to spare a read of the 200k customers (benchmarks/declared.py, the
# contender declared_by_keys; docs/benchmarks.md).
BY_KEYS_CONF = "spark.watermark.declared.readJoinedByKeys"


def by_keys(spark: SparkSession) -> bool:
    """Whether joined upstreams are read only for the touched keys (:data:`BY_KEYS_CONF`,
    default false).

    Raises:
        TerminalError: the setting is neither true nor false.
    """
    text = (spark.conf.get(BY_KEYS_CONF, None) or "false").strip().lower()
    if text not in ("true", "false"):
        raise TerminalError(
            f"Spark setting {BY_KEYS_CONF}={text!r} is neither true nor false.",
            fix="set it to true (a joined upstream is read only for the rows that reach the "
            "touched keys) or false (the default: read whole); nothing was written.",
        )
    return text == "true"


def reaching_rows(
    upstream: str,
    paths: Sequence[KeyPath],
    snapshots: Mapping[str, DataFrame],
    touched: list[tuple[object, ...]],
    limit: int,
) -> DataFrame | None:
    """The rows of ``upstream``'s snapshot that reach one of the ``touched`` keys along
    one of its ``paths``; None when that cannot be said by values the driver holds (a
    path starting from several columns beside another path, a key computed from a
    column on a direct path beside another path, more than ``limit`` values at a step,
    or :data:`BY_KEYS_CONF` not set to true): the caller then reads the whole snapshot.

    Raises:
        TerminalError: :data:`BY_KEYS_CONF` is neither true nor false.
    """
    frame = snapshots[upstream]
    if not paths or not by_keys(frame.sparkSession):
        return None
    if len(paths) == 1:
        [path] = paths
        starts = _start_values(path, snapshots, touched, limit)
        if starts is None:
            return None
        return where_in(frame, list(path.start), starts, _start_types(path, snapshots))
    # Several paths (a query joining the upstream to itself): a row is kept when one of
    # them reaches a touched key, as one filter (a union would repeat a row that two
    # paths reach, and the query would count it twice).
    conditions: list[Column] = []
    for path in paths:
        if len(path.start) != 1 or (path.direct and path.computed):
            return None
        starts = _start_values(path, snapshots, touched, limit)
        if starts is None:
            return None
        column = path.start[0]
        dtype = frame.schema[column].dataType
        types = _start_types(path, snapshots)
        if types is not None and not compared_alike(dtype, types[0]):
            # An IN would compare them otherwise than the query's `=` (where_in): the
            # filter of one IN per path cannot say it, so the snapshot is read whole.
            return None
        conditions.append(one_of(quoted(column), starts, dtype))
    condition = conditions[0]
    for other in conditions[1:]:
        condition = condition | other
    return frame.where(condition)


def _start_values(
    path: KeyPath,
    snapshots: Mapping[str, DataFrame],
    touched: list[tuple[object, ...]],
    limit: int,
) -> list[tuple[object, ...]] | None:
    """The values of ``path.start`` whose walk reaches one of ``touched``: the touched
    keys themselves for a direct path, else each hop walked backwards from its ``carry``
    columns (the keys, for the last) to its ``match`` columns; None past ``limit``."""
    if path.direct:
        if not path.computed:
            return touched
        # Values of the start columns that compute a touched key: from the snapshot.
        return _ends_reaching(snapshots[path.upstream], path, touched, limit, path.start)
    last = path.hops[-1]
    values = _ends_reaching(snapshots[last.upstream], path, touched, limit, last.match)
    for position in range(len(path.hops) - 2, -1, -1):
        if not values:  # None (too many) or none at all
            return values
        hop, after = path.hops[position], path.hops[position + 1]
        # The values are the next hop's match columns: compared with this hop's carry
        # columns as the query's `=` compares the two (where_in).
        types = _types(snapshots[after.upstream], after.match)
        reached = where_in(snapshots[hop.upstream], list(hop.carry), values, types)
        values = collected(reached.select(*[quoted(c) for c in hop.match]).distinct(), limit)
    return values


def _start_types(path: KeyPath, snapshots: Mapping[str, DataFrame]) -> list[T.DataType] | None:
    """The types of the values :func:`_start_values` gives for ``path``: its first hop's
    match columns (None for a direct path: the touched keys, or the start columns'
    own values)."""
    if path.direct:
        return None
    first = path.hops[0]
    return _types(snapshots[first.upstream], first.match)


def _types(frame: DataFrame, columns: Sequence[str]) -> list[T.DataType]:
    """The types of ``frame``'s ``columns`` (from its schema: no Spark job)."""
    return [frame.schema[c].dataType for c in columns]


def _ends_reaching(
    frame: DataFrame,
    path: KeyPath,
    touched: list[tuple[object, ...]],
    limit: int,
    columns: Sequence[str],
) -> list[tuple[object, ...]] | None:
    """The distinct ``columns`` of ``frame``'s rows whose walk ends (``path.end``, or the
    keys computed from it) at one of ``touched``; None past ``limit``."""
    if path.computed:
        names = [f"_wm_reach{i}" for i in range(len(path.end))]
        keyed = with_keys(frame, path, names)
        reached = where_in(keyed, names, touched)
    else:
        reached = where_in(frame, list(path.end), touched)
    return collected(reached.select(*[quoted(c) for c in columns]).distinct(), limit)


def with_keys(frame: DataFrame, path: KeyPath, names: Sequence[str]) -> DataFrame:
    """``frame`` with the target keys added as ``names``: each its ``path.end`` column, or
    the expression the query computes it by from that column
    (:attr:`~watermark_dagster.config.key_paths.KeyPath.computed`)."""
    inputs = {key_input(i): quoted(c) for i, c in enumerate(path.end)}
    computed = path.computed or (None,) * len(names)
    # The expression is the declared query's own, parsed and written back by sqlglot with
    # its one column replaced by the input's name: no text of the user's is joined.
    keys = {
        n: F.col(i) if e is None else F.expr(e)
        for i, e, n in zip(inputs, computed, names, strict=True)
    }
    return frame.withColumns(inputs).withColumns(keys).drop(*inputs)
