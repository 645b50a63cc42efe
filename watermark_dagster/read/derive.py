"""The incremental transform of a declared pipeline, derived from its full transform.

For a batch, the touched target keys are the union over the upstreams of:

* for an upstream holding the target keys itself, the key values of its change rows
  (before- and after-images both, deletes included);
* for an upstream reached through a join path, the values of its first columns among its
  change rows, carried hop by hop through the other upstreams' pinned snapshots.

Why that is every key whose row can differ: take a key whose row differs between the
previous batch's snapshots and this one's. Some row reaching it (before or after) changed;
take the changed row nearest the key along its path. Every row after it is unchanged, so
it is in this batch's snapshots, and the walk from the changed row's before- or
after-image reaches the key through them.

The full transform then runs over the pinned snapshots, with each upstream that holds the
target keys cut down to the touched keys first (its rows for other keys cannot reach a
touched key), and :func:`~watermark_dagster.read.changes.recompute` turns the result into
upserts for keys that still have a row and deletes for keys that no longer do. A full load
is the full transform itself.

Cost: the touched keys are computed once. Up to ``INLINE_KEYS_LIMIT`` of them, the values
are collected to the driver at each step of the walk and written into the plans that use
them: an ``IN`` filter on the next snapshot (which Delta also skips files with) instead of
a join with the change feed, and one join that streams the keys and broadcasts the
recomputed rows instead of a semi-join and an anti-join that would each evaluate the
change feed and the hops again. On the demo pipelines this took an incremental batch from
59-63 Spark jobs to 39-41 (``python -m benchmarks.jobs``); Delta's MERGE runs 15-19 of
them, whatever form it is written in. Past the limit the keys stay a plan, joined where
they are used.

Every match above is null-safe (:func:`~watermark_dagster.read.changes.matching_keys`): a
NULL target key (the group of customers without a region) is touched, recomputed and
deleted like any other. Carrying NULL through a hop may select rows the full transform's
own ``=`` join would not reach: that can only add keys to recompute, never lose one.
"""

import operator
import statistics
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.config.declared import Declared, paths_for_batch
from watermark_dagster.config.key_paths import Hop, KeyPath, key_input, restrictable
from watermark_dagster.config.pipeline import (
    BatchContext,
    ChangeFeed,
    Pipeline,
    Strategy,
    StrategyChoice,
    StrategyRun,
    Transform,
)
from watermark_dagster.core.columns import CDF_COLUMNS, CHANGE_TYPE, DELETE, UNTOUCHED, UPSERT
from watermark_dagster.errors import TerminalError
from watermark_dagster.read.changes import matching_keys, quoted, recompute
from watermark_dagster.read.inputs import UpstreamInput
from watermark_dagster.read.transform_checks import computes_per_key, reads_only_upstreams

# The strategies that run the full transform over the pinned snapshots.
_WHOLE = (Strategy.FULL, Strategy.REWRITE)


def transform_of(pipeline: Pipeline) -> Transform:
    """The function a batch runs for ``pipeline``: its hand-written transform (or, on a
    batch whose strategy is ``full``, its full transform diffed against the target, and on
    one whose strategy is ``rewrite`` its full transform, which overwrites the target), or
    the one derived from its declaration."""
    declared = pipeline.declared
    if declared is None:
        hand_written = pipeline.transform
        assert hand_written is not None  # Pipeline checks one of the two is given
        full_transform = pipeline.full_transform
        if full_transform is None:
            return hand_written

        def chosen(batch: BatchContext) -> DataFrame:
            choice = batch.strategy
            if batch.full_load or choice is None or choice.strategy not in _WHOLE:
                return hand_written(batch)
            snapshots = {u: batch[u].snapshot for u in pipeline.upstreams}
            whole = _checked(pipeline, full_transform(**snapshots))
            reads_only_upstreams(pipeline, batch, whole)
            reserved = [c for c in whole.columns if c in CDF_COLUMNS]
            if reserved:
                raise TerminalError(
                    f"Pipeline '{pipeline.name}': its full transform's output has "
                    f"{reserved}, which only a change feed carries; a full transform "
                    "computes the target's rows.",
                    pipeline=pipeline.name,
                    fix="return the target's columns from the full transform (drop "
                    f"{reserved}); nothing was written.",
                )
            if choice.strategy is Strategy.REWRITE:
                return whole  # the target is overwritten with it (run_pipeline)
            return diff_against_target(batch.spark, whole, pipeline)

        chosen.__doc__ = hand_written.__doc__
        return chosen

    def derived(batch: BatchContext) -> DataFrame:
        return derive(pipeline, declared, batch)

    derived.__doc__ = pipeline.description
    return derived


def derive(pipeline: Pipeline, declared: Declared, batch: BatchContext) -> DataFrame:
    """The changes that bring ``pipeline``'s target up to the batch's pinned snapshots."""
    keys = list(pipeline.keys)
    snapshots = {u: batch[u].snapshot for u in pipeline.upstreams}
    paths = key_paths(pipeline, declared, snapshots)
    for path in (p for ps in paths.values() for p in ps):
        _check_columns(pipeline, path, snapshots)
    _check_computed_ends(pipeline, paths, snapshots)
    # The full transform over the whole snapshots: Spark analyses it (no job) so that what
    # it reads and how it computes can be checked before anything is written.
    whole = _checked(pipeline, full(declared, snapshots, batch))
    # Declared SQL proved its windows per key when it loaded (key_inference); a Python
    # full transform's windows are refused here.
    computes_per_key(pipeline, whole, windows_proven=declared.sql is not None)
    reads_only_upstreams(pipeline, batch, whole, declared_sql=declared.sql is not None)
    if batch.full_load:
        return whole
    choice = batch.strategy
    if choice is not None and choice.strategy is Strategy.REWRITE:
        return whole  # the target is overwritten with it (run_pipeline): no key is read
    values = _touched_values(paths, batch, snapshots)
    if choice is not None and choice.strategy is Strategy.FULL:
        # The diff's keys that the batch's own changes did not touch had drifted: the
        # write counts them (write/summary.py) and still writes the correct rows.
        return flag_untouched(diff_against_target(batch.spark, whole, pipeline), keys, values)
    if (
        values is None
        and choice is not None
        and pipeline.strategy is Strategy.AUTO
        and not choice.fixed  # a replay stays incremental however many keys it touches
    ):
        choice.strategy = choice.whole
        choice.switched = True
        choice.reason = (
            f"auto: the batch touched more than {INLINE_KEYS_LIMIT:,} keys "
            f"(INLINE_KEYS_LIMIT); {choice.reason}"
        )
        if choice.whole is Strategy.REWRITE:
            return whole
        return diff_against_target(batch.spark, whole, pipeline)
    if values is None:  # more touched keys than the driver holds: joins with a plan
        return _derived_by_joins(pipeline, declared, paths, batch, snapshots, keys)
    restricted = {
        u: _where_keys(snapshots[u], path, values)
        if (path := restrictable(paths[u]))
        else snapshots[u]
        for u in paths
    }
    current = _checked(pipeline, full(declared, restricted, batch))
    return _changes_for_values(batch.spark, values, current, keys)


# Up to this many touched keys are collected to the driver, once, and written into the
# plans that use them (a filter on the cut-down snapshots' scans, which Delta also uses to
# skip files, and a broadcast of the recomputed rows); more, and they stay a plan joined
# where it is used.
INLINE_KEYS_LIMIT = 50_000


def _collected(frame: DataFrame, limit: int) -> list[tuple[object, ...]] | None:
    """The rows of ``frame`` as tuples, or None when it has more than ``limit``.

    PySpark gives a TIMESTAMP as a naive datetime in the driver's local time zone and
    writes a naive one back ignoring its ``fold``: the two instants of an hour that
    daylight saving repeats would come back as one. They are kept as UTC-aware values,
    which go back exactly (TIMESTAMP_NTZ values are naive by nature and stay so)."""
    rows = frame.limit(limit + 1).collect()
    if len(rows) > limit:
        return None
    stamps = {
        i for i, f in enumerate(frame.schema.fields) if isinstance(f.dataType, T.TimestampType)
    }
    return [
        tuple(
            v.astimezone(UTC) if i in stamps and isinstance(v, datetime) and not v.tzinfo else v
            for i, v in enumerate(r)
        )
        for r in rows
    ]


def key_paths(
    pipeline: Pipeline, declared: Declared, snapshots: Mapping[str, DataFrame]
) -> dict[str, tuple[KeyPath, ...]]:
    """Every key path a batch of ``pipeline`` follows, per upstream, its columns spelled
    as the snapshots spell them (:func:`~watermark_dagster.config.declared.paths_for_batch`;
    for SQL that the definitions could not prove without the schemas, proven here, before
    anything is written).

    Raises:
        ConfigurationError: the SQL is refused once the schemas place its columns.
    """
    schemas = {u: snapshots[u].columns for u in pipeline.upstreams}
    paths = paths_for_batch(pipeline.name, declared, pipeline.keys, schemas)

    def spelled(upstream: str, columns: tuple[str, ...]) -> tuple[str, ...]:
        names = {c.lower(): c for c in schemas.get(upstream, ())}
        return tuple(names.get(c.lower(), c) for c in columns)

    return {
        u: tuple(
            KeyPath(
                p.upstream,
                spelled(p.upstream, p.start),
                tuple(
                    Hop(h.upstream, spelled(h.upstream, h.match), spelled(h.upstream, h.carry))
                    for h in p.hops
                ),
                p.computed,
            )
            for p in ps
        )
        for u, ps in paths.items()
    }


def _touched_values(
    paths: Mapping[str, tuple[KeyPath, ...]],
    batch: BatchContext,
    snapshots: Mapping[str, DataFrame],
) -> list[tuple[object, ...]] | None:
    """The touched target keys' values, each once (see the module's docstring), walked
    hop by hop with the values collected at each step; None past ``INLINE_KEYS_LIMIT``."""
    limit = INLINE_KEYS_LIMIT
    found: set[tuple[object, ...]] = set()
    for upstream, path in ((u, p) for u, ps in paths.items() for p in ps):
        frame = batch[upstream].changed_keys(list(path.start))
        values: list[tuple[object, ...]] | None = []
        for hop in path.hops:
            values = _collected(frame, limit)
            if not values:  # None (too many) or none at all: nothing more to carry
                break
            reached = where_in(snapshots[hop.upstream], list(hop.match), values)
            frame = reached.select(*[quoted(c) for c in hop.carry]).distinct()
        else:
            keyed = _computed_keys(frame, path)
            # The frame is distinct already; keys computed from it may repeat.
            values = _collected(keyed.distinct() if path.computed else keyed, limit)
        if values is None:
            return None
        found.update(values)
        if len(found) > limit:
            return None
    return list(found)


def _computed_keys(
    frame: DataFrame, path: KeyPath, names: Sequence[str] | None = None
) -> DataFrame:
    """The target keys from ``frame``'s columns ``path.end``, named ``names`` (default
    the end columns' names), and nothing else."""
    names = list(names or path.end)
    if not path.computed:
        return _as(frame, list(path.end), names)
    return _with_keys(frame, path, names).select(*[quoted(n) for n in names])


def _with_keys(frame: DataFrame, path: KeyPath, names: Sequence[str]) -> DataFrame:
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


def _matching_keys(
    frame: DataFrame, path: KeyPath, touched: DataFrame, keys: Sequence[str]
) -> DataFrame:
    """:func:`_where_keys` with the touched ``keys`` as a plan."""
    if not path.computed:
        return matching_keys(frame, touched, list(path.start), keys)
    names = [f"_wm_computed{i}" for i in range(len(path.start))]
    return matching_keys(_with_keys(frame, path, names), touched, names, keys).drop(*names)


def _where_keys(frame: DataFrame, path: KeyPath, values: list[tuple[object, ...]]) -> DataFrame:
    """The rows of ``frame`` (the upstream ``path`` starts at, direct) whose key is one of
    ``values``: :func:`where_in` on the start columns, or on the keys the query computes
    from them."""
    if not path.computed:
        return where_in(frame, list(path.start), values)
    names = [f"_wm_computed{i}" for i in range(len(path.start))]
    return where_in(_with_keys(frame, path, names), names, values).drop(*names)


def flag_untouched(
    changes: DataFrame, keys: list[str], values: list[tuple[object, ...]] | None
) -> DataFrame:
    """``changes`` with ``_wm_untouched`` set on the rows whose key is not one of the
    touched ``values`` (NULL equal to NULL); unchanged when the values were too many to
    hold (drift is then not measured)."""
    if values is None:
        return changes
    hit = "_wm_hit"
    if len(keys) == 1:
        touched = _one_of(quoted(keys[0]), values, changes.schema[keys[0]].dataType)
        return changes.withColumn(UNTOUCHED, ~F.coalesce(touched, F.lit(False)))
    names = [f"_wm_touched{i}" for i in range(len(keys))]
    schema = changes.select(*[quoted(k).alias(n) for k, n in zip(keys, names, strict=True)])
    local = changes.sparkSession.createDataFrame(values, schema.schema).withColumn(hit, F.lit(True))
    on = reduce(
        operator.and_, [quoted(k).eqNullSafe(F.col(n)) for k, n in zip(keys, names, strict=True)]
    )
    joined = changes.join(F.broadcast(local), on, "left_outer")
    return joined.withColumn(UNTOUCHED, F.col(hit).isNull()).drop(hit, *names)


def _one_of(column: Column, values: list[tuple[object, ...]], dtype: T.DataType) -> Column:
    """``column`` (of type ``dtype``) equals the first item of one of ``values``, NULL
    equal to NULL: an ``IN`` (which Delta also skips files with), or'd with ``IS NULL``
    for a NULL value.

    A TIMESTAMP_NTZ value goes in as its text cast back to TIMESTAMP_NTZ: PySpark would
    make a naive datetime a TIMESTAMP in the driver's own time zone, which the comparison
    then reads in the session's, so a driver outside the session's zone matched nothing."""
    present = [v[0] for v in values if v[0] is not None]
    if isinstance(dtype, T.TimestampNTZType):
        items: list[object] = [
            F.lit(v.isoformat(sep=" ")).cast(dtype) if isinstance(v, datetime) else v
            for v in present
        ]
    else:
        items = list(present)
    condition = column.isin(items) if items else F.lit(False)
    if len(present) < len(values):
        condition = condition | column.isNull()
    return condition


def where_in(frame: DataFrame, columns: list[str], values: list[tuple[object, ...]]) -> DataFrame:
    """The rows of ``frame`` whose ``columns`` equal one of ``values`` (NULL equal to
    NULL), as a filter: ``IN`` for one column (Delta skips files with it), else a
    semi-join with the values as a local relation."""
    if not values:
        return frame.where(F.lit(False))
    if len(columns) == 1:
        dtype = frame.select(quoted(columns[0])).schema.fields[0].dataType
        return frame.where(_one_of(quoted(columns[0]), values, dtype))
    schema = frame.select(*[quoted(c) for c in columns]).schema
    local = frame.sparkSession.createDataFrame(values, schema)
    return matching_keys(frame, local, columns)


def _changes_for_values(
    spark: SparkSession, values: list[tuple[object, ...]], current: DataFrame, keys: list[str]
) -> DataFrame:
    """:func:`~watermark_dagster.read.changes.recompute` for touched keys held by the
    driver: each key's recomputed rows as upserts, and a delete for a key with none, in
    one join that streams the keys and broadcasts the recomputed rows (at most a few per
    key: a target holds one row per key)."""
    names = [f"_wm_key{i}" for i in range(len(keys))]
    schema = current.select(*[quoted(k).alias(n) for k, n in zip(keys, names, strict=True)])
    wanted = spark.createDataFrame(values, schema.schema)
    found = where_in(current, keys, values).withColumn(_FOUND, F.lit(True))
    on = reduce(
        operator.and_,
        [quoted(k).eqNullSafe(F.col(n)) for k, n in zip(keys, names, strict=True)],
    )
    joined = wanted.join(F.broadcast(found), on, "left_outer")
    columns = [
        F.col(names[keys.index(c)]).alias(c) if c in keys else quoted(c) for c in current.columns
    ]
    change = F.when(F.col(_FOUND).isNull(), F.lit(DELETE)).otherwise(F.lit(UPSERT))
    return joined.select(*columns, change.alias(CHANGE_TYPE))


_FOUND = "_wm_found"


def _derived_by_joins(
    pipeline: Pipeline,
    declared: Declared,
    paths: Mapping[str, tuple[KeyPath, ...]],
    batch: BatchContext,
    snapshots: Mapping[str, DataFrame],
    keys: list[str],
) -> DataFrame:
    """The derivation with the touched keys as a plan, semi-joined where they are used."""
    touched = _touched_keys(paths, batch, snapshots, keys)
    restricted = {
        u: _matching_keys(snapshots[u], path, touched, keys)
        if (path := restrictable(paths[u]))
        else snapshots[u]
        for u in paths
    }
    current = _checked(pipeline, full(declared, restricted, batch))
    return recompute(touched, current, keys)


# `auto`'s size rule: the whole form (``rewrite``, or ``full`` for a ``minimal`` change
# feed) when the batch's ranges changed at least this share of the pinned snapshots'
# bytes, or when the snapshots are this small in all: below it, the incremental form's
# fixed cost (collecting the touched keys, Delta's MERGE) is more than reading everything
# once (benchmarks/declared.py, --strategy).
AUTO_FULL_FRACTION = 0.2
AUTO_FULL_BELOW_BYTES = 16 * 1024 * 1024
# With measured incremental runs and none of the whole form, `auto` runs the whole form
# once to measure it when the snapshots hold fewer bytes than this; past it a recompute is
# too dear to try on the off chance.
AUTO_MEASURE_WHOLE_BELOW_BYTES = 1024**3


# `auto` weighs at most this many of each strategy's newest measured runs (their median).
MEASURED_RUNS = 5


def choose_strategy(
    pipeline: Pipeline,
    inputs: Mapping[str, UpstreamInput],
    *,
    replay: bool,
    history: Sequence[StrategyRun] = (),
    change_feed: ChangeFeed = ChangeFeed.MINIMAL,
) -> StrategyChoice | None:
    """How ``pipeline`` computes an incremental batch over ``inputs``, decided from the
    Delta log and the pipeline's measured ``history`` alone (no Spark job); None for a
    hand-written pipeline without a full transform.

    ``incremental``, ``full`` and ``rewrite`` are taken as configured. ``auto`` weighs the
    strategies the target allows: ``rewrite`` only when its ``change_feed`` is ``any``
    (:func:`decide_strategy` says how). A replay is always ``incremental``: its snapshots
    are older than the target, which a full diff or a rewrite would roll back.
    """
    if not pipeline.chooses_strategy:
        return None
    changed, total = _sizes(inputs)
    return decide_strategy(
        Strategy(pipeline.strategy),
        changed,
        total,
        replay=replay,
        history=history,
        rewrite=change_feed is ChangeFeed.ANY,
    )


def _sizes(inputs: Mapping[str, UpstreamInput]) -> tuple[int | None, int | None]:
    """The bytes the inputs' ranges changed and the bytes of their snapshots, over every
    upstream (None when the log cannot say for one of them)."""
    estimates = [i.bytes_estimate() for i in inputs.values()]
    if any(e is None for e in estimates):
        return None, None
    known = [e for e in estimates if e is not None]
    return sum(c for c, _ in known), sum(t for _, t in known)


def estimate_seconds(
    history: Sequence[StrategyRun], strategy: Strategy, changed: int, total: int
) -> tuple[float, int] | None:
    """``strategy``'s estimated seconds for a batch that changed ``changed`` bytes of
    ``total`` snapshot bytes, and how many measured runs it rests on: the median of its
    newest ``MEASURED_RUNS`` runs, each run's seconds scaled up by how much larger this
    batch's input to it is (the snapshots' bytes for ``full`` and ``rewrite``, the changed
    bytes for ``incremental``; never scaled down, since a batch's fixed cost does not
    shrink); None when ``history`` holds no run of it.

    A batch that began incremental and switched to the whole form past
    ``INLINE_KEYS_LIMIT`` touched keys is a run of ``incremental``: what trying it cost
    (the touched keys, then the whole form), not a measure of the whole form alone."""
    if strategy is Strategy.INCREMENTAL:
        mine = [r for r in history if r.strategy is strategy or r.switched]
    else:
        mine = [r for r in history if r.strategy is strategy and not r.switched]
    runs = mine[-MEASURED_RUNS:]
    if not runs:
        return None
    scaled = []
    for run in runs:
        if strategy is Strategy.INCREMENTAL:
            now, then = changed, run.changed_bytes
        else:
            now, then = total, run.snapshot_bytes
        scaled.append(run.seconds * (max(1.0, now / then) if then else 1.0))
    return statistics.median(scaled), len(runs)


def decide_strategy(
    configured: Strategy,
    changed: int | None,
    total: int | None,
    *,
    replay: bool,
    history: Sequence[StrategyRun] = (),
    rewrite: bool = False,
) -> StrategyChoice:
    """:func:`choose_strategy`'s rule, from the bytes the ranges changed, the snapshots'
    bytes (None when unknown), the pipeline's measured runs (oldest first) and whether its
    target may be rewritten.

    ``auto`` compares the incremental form with the whole one (``rewrite`` when allowed,
    else ``full``):

    * once both have measured runs, the cheapest of the estimates
      (:func:`estimate_seconds`) of every allowed strategy with runs;
    * with neither measured, the size rule: the whole form when the ranges changed at least
      ``AUTO_FULL_FRACTION`` of the snapshots' bytes or the snapshots hold less than
      ``AUTO_FULL_BELOW_BYTES``, else ``incremental``;
    * with one measured, the other once where the size rule would pick it, and the whole
      form once anyway under ``AUTO_MEASURE_WHOLE_BELOW_BYTES`` (a first load is not a
      measure of ``rewrite``: it also creates and lays out the target, on a cold session).
    """
    whole = Strategy.REWRITE if rewrite else Strategy.FULL
    if replay:
        return StrategyChoice(
            Strategy.INCREMENTAL, "a replay", changed, total, fixed=True, whole=whole
        )
    if configured is not Strategy.AUTO:
        return StrategyChoice(
            configured, f"configured strategy={configured}", changed, total, whole=whole
        )
    if changed is None or total is None:
        return StrategyChoice(
            Strategy.INCREMENTAL,
            "auto: sizes unknown (a cursor upstream)",
            changed,
            total,
            whole=whole,
        )
    allowed = [Strategy.INCREMENTAL, Strategy.FULL, *([Strategy.REWRITE] if rewrite else [])]
    measured = {s: cost for s in allowed if (cost := estimate_seconds(history, s, changed, total))}
    share = changed / total if total else 1.0
    if total < AUTO_FULL_BELOW_BYTES:
        sized = f"the snapshots hold {total:,} bytes, under {AUTO_FULL_BELOW_BYTES:,}"
        by_size = whole
    elif share >= AUTO_FULL_FRACTION:
        sized, by_size = f"the ranges changed {share:.1%} of the snapshots' bytes", whole
    else:
        sized = f"the ranges changed {share:.1%} of {total:,} snapshot bytes"
        by_size = Strategy.INCREMENTAL

    def choice(strategy: Strategy, reason: str) -> StrategyChoice:
        estimates = {str(s): round(cost[0], 3) for s, cost in measured.items()}
        return StrategyChoice(
            strategy, f"auto: {reason}", changed, total, estimates=estimates, whole=whole
        )

    if Strategy.INCREMENTAL in measured and whole in measured:
        ranked = sorted(measured, key=lambda s: measured[s][0])
        weighed = " against ".join(f"{s} ~{measured[s][0]:.2f} s" for s in ranked)
        runs = " and ".join(str(measured[s][1]) for s in ranked)
        reason = f"measured {weighed} for this batch's sizes (medians of the newest {runs} runs)"
        return choice(ranked[0], reason)
    if whole in measured and by_size is Strategy.INCREMENTAL:
        return choice(Strategy.INCREMENTAL, f"{sized}; measuring incremental once")
    if (
        Strategy.INCREMENTAL in measured
        and by_size is Strategy.INCREMENTAL
        and total < AUTO_MEASURE_WHOLE_BELOW_BYTES
    ):
        return choice(whole, f"{sized}; measuring {whole} once")
    return choice(by_size, sized)


_OLD = "_wm_old_"
_ROWS = "_wm_rows"


def diff_against_target(spark: SparkSession, whole: DataFrame, pipeline: Pipeline) -> DataFrame:
    """The changes that turn ``pipeline``'s target into ``whole`` (the full transform's
    output): an upsert for each row that is new or differs in any of ``whole``'s columns,
    a delete for each target key ``whole`` no longer has, nothing for the rest. So the
    MERGE rewrites no unchanged row, and the target's change feed, which other pipelines
    read, carries only the keys that changed, as after an incremental batch."""
    keys = list(pipeline.keys)
    target = spark.read.format("delta").load(pipeline.target)
    shared = [c for c in whole.columns if c in target.columns]
    # Rows per key, over the same partitioning as the join (no extra shuffle): a key the
    # full transform gives several rows is kept whatever the target holds, so the write's
    # duplicate check refuses it, as it refuses an incremental batch's.
    computed = whole.columns
    whole = whole.withColumn(
        _ROWS, F.count(F.lit(1)).over(Window.partitionBy(*[quoted(k) for k in keys]))
    )
    old = target.select(
        *[quoted(c).alias(_OLD + c) for c in shared], F.lit(True).alias(_OLD + _FOUND)
    )
    on = reduce(operator.and_, [quoted(k).eqNullSafe(F.col(_OLD + k)) for k in keys])
    joined = whole.withColumn(_FOUND, F.lit(True)).join(old, on, "full_outer")
    present = F.col(_FOUND).isNotNull()
    was = F.col(_OLD + _FOUND).isNotNull()
    same = reduce(
        operator.and_,
        [quoted(c).eqNullSafe(F.col(_OLD + c)) for c in shared],
        F.lit(len(shared) == len(computed)),
    )
    columns = [
        F.when(present, quoted(c)).otherwise(F.col(_OLD + c)).alias(c) if c in keys else quoted(c)
        for c in computed
    ]
    change = F.when(present, F.lit(UPSERT)).otherwise(F.lit(DELETE))
    several = F.coalesce(F.col(_ROWS) > 1, F.lit(False))
    return joined.where(several | (present & ~(was & same)) | (~present & was)).select(
        *columns, change.alias(CHANGE_TYPE)
    )


def full(declared: Declared, snapshots: Mapping[str, DataFrame], batch: BatchContext) -> DataFrame:
    """The declared full transform over ``snapshots`` (one per upstream)."""
    if declared.function is not None:
        return declared.function(**snapshots)
    assert declared.sql is not None
    # Spark parses the text against views named after the upstreams. The names are
    # validated identifiers; each view is replaced per call, so a session running several
    # pipelines or batches one after another always reads the frames given here.
    for upstream, frame in snapshots.items():
        frame.createOrReplaceTempView(upstream)
    return batch.spark.sql(declared.sql)


def _touched_keys(
    paths: Mapping[str, tuple[KeyPath, ...]],
    batch: BatchContext,
    snapshots: Mapping[str, DataFrame],
    keys: list[str],
) -> DataFrame:
    found: DataFrame | None = None
    for upstream, path in ((u, p) for u, ps in paths.items() for p in ps):
        values = batch[upstream].changed_keys(list(path.start))
        carried = list(path.start)
        for hop in path.hops:
            # No distinct per hop: a semi-join ignores repeats on its right side, and the
            # union of every path is made distinct once, at the end.
            values = matching_keys(
                snapshots[hop.upstream], values, list(hop.match), carried
            ).select(*[quoted(c) for c in hop.carry])
            carried = list(hop.carry)
        keyed = _computed_keys(values, path, keys)
        found = keyed if found is None else found.unionByName(keyed)
    assert found is not None  # a pipeline reads at least one upstream
    return found.distinct()


def _as(frame: DataFrame, columns: list[str], names: list[str]) -> DataFrame:
    """``frame``'s ``columns`` renamed to ``names`` (positionally), and nothing else."""
    return frame.select(*[quoted(c).alias(n) for c, n in zip(columns, names, strict=True)])


def _check_columns(pipeline: Pipeline, path: KeyPath, snapshots: Mapping[str, DataFrame]) -> None:
    """Every column a key path names exists (checked from the schemas: no Spark job)."""
    wanted = [(path.upstream, c) for c in path.start]
    for hop in path.hops:
        wanted += [(hop.upstream, c) for c in (*hop.match, *hop.carry)]
    for upstream, column in wanted:
        if column not in snapshots[upstream].columns:
            raise TerminalError(
                f"Pipeline '{pipeline.name}': the key path of '{path.upstream}' ({path}) names "
                f"column '{column}', which upstream '{upstream}' does not have (it has "
                f"{snapshots[upstream].columns}).",
                pipeline=pipeline.name,
                upstream=upstream,
                fix="fix the key path in the pipeline's declaration; nothing was written.",
            )


def _check_computed_ends(
    pipeline: Pipeline,
    paths: Mapping[str, tuple[KeyPath, ...]],
    snapshots: Mapping[str, DataFrame],
) -> None:
    """A key computed by an expression is applied to the values each path reaches at its
    end column; refused (from the schemas: no Spark job) where those columns are only
    equal under ``=``, not identical: of different types (the query compares them after
    a conversion: '07' = 7), or of several columns whose equal values can differ as the
    expression reads them (-0.0 = 0.0 for a floating type, 'A' = 'a' under a collation).
    A changed row's value would then give another key than the query computes."""
    for position, key in enumerate(pipeline.keys):
        ends: dict[tuple[str, str], T.DataType] = {}
        for path in (p for ps in paths.values() for p in ps):
            if position >= len(path.computed) or path.computed[position] is None:
                continue
            table = path.hops[-1].upstream if path.hops else path.upstream
            column = path.end[position]
            ends[(table, column)] = snapshots[table].schema[column].dataType
        kinds = {d.simpleString() for d in ends.values()}
        loose = len(ends) > 1 and any(_equal_not_identical(d) for d in ends.values())
        if len(kinds) > 1 or loose:
            columns = ", ".join(f"{t}.{c} {d.simpleString()}" for (t, c), d in ends.items())
            raise TerminalError(
                f"Pipeline '{pipeline.name}': its key '{key}' is computed from columns the "
                f"query holds equal ({columns}) whose equal values can differ as the "
                "expression reads them (compared after a conversion, or -0.0 = 0.0, or "
                "under a collation): a changed row's value would give another key than the "
                "query computes.",
                pipeline=pipeline.name,
                fix="join those columns as one type (CAST in the query's own terms on both "
                "sides, or in the upstreams), or key the target by the column itself; nothing "
                "was written.",
            )


def _equal_not_identical(dtype: T.DataType) -> bool:
    """Values of ``dtype`` can be equal under ``=`` and still differ (floating point's
    -0.0 and 0.0, strings under a collation other than the binary one)."""
    if isinstance(dtype, T.FloatType | T.DoubleType):
        return True
    if isinstance(dtype, T.StringType):
        return getattr(dtype, "collation", "UTF8_BINARY") not in ("UTF8_BINARY", None)
    return "float" in dtype.simpleString() or "double" in dtype.simpleString()


def _checked(pipeline: Pipeline, output: object) -> DataFrame:
    if not isinstance(output, DataFrame):
        raise TerminalError(
            f"Pipeline '{pipeline.name}': the full transform returned {type(output).__name__}, "
            "not a Spark DataFrame.",
            pipeline=pipeline.name,
            fix="return the target's rows, computed from the upstream DataFrames it receives.",
        )
    missing = [k for k in pipeline.keys if k not in output.columns]
    if missing:
        raise TerminalError(
            f"Pipeline '{pipeline.name}': the full transform's output has no key column(s) "
            f"{missing} (it has {output.columns}).",
            pipeline=pipeline.name,
            fix="select the target's key columns in the full transform; nothing was written.",
        )
    return output
