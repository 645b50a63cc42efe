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
them, whatever form it is written in (:mod:`~watermark_dagster.read.key_values`). Past
the limit the keys stay a plan, joined where they are used; an ``auto`` batch (not a
replay) switches to the whole form instead, as a new
:class:`~watermark_dagster.core.strategy.StrategyChoice` that the run records (the
strategy decided before the transform, :mod:`~watermark_dagster.core.strategy`, is not
changed).

Every match above is null-safe (:func:`~watermark_dagster.read.changes.matching_keys`): a
NULL target key (the group of customers without a region) is touched, recomputed and
deleted like any other. Carrying NULL through a hop may select rows the full transform's
own ``=`` join would not reach: that can only add keys to recompute, never lose one.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame

from watermark_dagster.config.batch_context import BatchContext, Transform
from watermark_dagster.config.declared import Declared, paths_for_batch
from watermark_dagster.config.key_paths import Hop, KeyPath, restrictable
from watermark_dagster.config.maintained import Unmaintainable, form_of
from watermark_dagster.config.pipeline import Pipeline, Strategy
from watermark_dagster.core.columns import CDF_COLUMNS
from watermark_dagster.core.strategy import StrategyChoice
from watermark_dagster.errors import TerminalError
from watermark_dagster.frames.changes import quoted
from watermark_dagster.read.changes import matching_keys, recompute
from watermark_dagster.read.key_values import (
    changes_for_values,
    collected,
    flag_untouched,
    where_in,
)
from watermark_dagster.read.maintain import maintained_rows, state_views
from watermark_dagster.read.path_checks import check_columns, check_computed_ends, check_end_types
from watermark_dagster.read.reach import reaching_rows, with_keys
from watermark_dagster.read.target_diff import diff_against_target
from watermark_dagster.read.transform_checks import computes_per_key, reads_only_upstreams

# The strategies that run the full transform over the pinned snapshots.
_WHOLE = (Strategy.FULL, Strategy.REWRITE)


@dataclass(frozen=True)
class DerivedOutput:
    """What a batch's transform gave: the changes to write (``frame``), the strategy they
    were computed with, and the keys of those changes when the driver holds them.

    Attributes:
        keys: every key of ``frame``, as tuples in the pipeline's key order, each the key
            of one change (an upsert or a delete), when the touched keys were collected
            (:data:`INLINE_KEYS_LIMIT`); the write then needs no job of its own to learn
            the changes' key ranges (:mod:`~watermark_dagster.write.merge`). None when the
            keys stayed a plan, or the output is not per touched key.
    """

    frame: DataFrame
    strategy: StrategyChoice | None
    keys: tuple[tuple[object, ...], ...] | None = None


def transform_of(pipeline: Pipeline) -> Transform:
    """The function a batch runs for ``pipeline``: its hand-written transform (or, on a
    batch whose strategy is ``full``, its full transform diffed against the target, and on
    one whose strategy is ``rewrite`` its full transform, which overwrites the target), or
    the one derived from its declaration (:func:`transformed`'s changes)."""
    declared = pipeline.declared
    if declared is None and pipeline.full_transform is None:
        assert pipeline.transform is not None  # Pipeline checks one of the two is given
        return pipeline.transform

    def transform(batch: BatchContext) -> DataFrame:
        return transformed(pipeline, batch).frame

    transform.__doc__ = (
        pipeline.description if pipeline.transform is None else pipeline.transform.__doc__
    )
    return transform


def transformed(pipeline: Pipeline, batch: BatchContext) -> DerivedOutput:
    """The changes a batch of ``pipeline`` writes (:func:`transform_of`), and the strategy
    they were computed with: the batch's own (``batch.strategy``), or for a declared
    ``auto`` batch that touched more than ``INLINE_KEYS_LIMIT`` keys, a new value for the
    whole form it switched to
    (:meth:`~watermark_dagster.core.strategy.StrategyChoice.switched_to_whole`), which the
    run records."""
    declared = pipeline.declared
    if declared is not None:
        return derive(pipeline, declared, batch)
    hand_written = pipeline.transform
    full_transform = pipeline.full_transform
    assert hand_written is not None  # Pipeline checks one of the two is given
    choice = batch.strategy
    if full_transform is None or batch.full_load or choice is None or choice.strategy not in _WHOLE:
        return DerivedOutput(hand_written(batch), choice)
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
        return DerivedOutput(whole, choice)  # the target is overwritten with it (run_pipeline)
    return DerivedOutput(diff_against_target(batch.spark, whole, pipeline), choice)


def derive(pipeline: Pipeline, declared: Declared, batch: BatchContext) -> DerivedOutput:
    """The changes that bring ``pipeline``'s target up to the batch's pinned snapshots,
    and the strategy they were computed with (:func:`transformed`)."""
    keys = list(pipeline.keys)
    snapshots = {u: batch[u].snapshot for u in pipeline.upstreams}
    paths = key_paths(pipeline, declared, snapshots)
    for path in (p for ps in paths.values() for p in ps):
        check_columns(pipeline, path, snapshots)
    check_computed_ends(pipeline, paths, snapshots)
    # The full transform over the whole snapshots: Spark analyses it (no job) so that what
    # it reads and how it computes can be checked before anything is written.
    whole = _checked(pipeline, full(declared, snapshots, batch))
    check_end_types(pipeline, paths, snapshots, whole)
    # Declared SQL proved its windows per key when it loaded (key_inference); a Python
    # full transform's windows are refused here.
    computes_per_key(pipeline, whole, windows_proven=declared.sql is not None)
    reads_only_upstreams(pipeline, batch, whole, declared_sql=declared.sql is not None)
    choice = batch.strategy
    if batch.full_load:
        return DerivedOutput(whole, choice)
    if choice is not None and choice.strategy is Strategy.REWRITE:
        # The target is overwritten with it (run_pipeline): no key is read.
        return DerivedOutput(whole, choice)
    values = _touched_values(paths, batch, snapshots)
    if choice is not None and choice.strategy is Strategy.FULL:
        # The diff's keys that the batch's own changes did not touch had drifted: the
        # write counts them (write/summary.py) and still writes the correct rows.
        diff = diff_against_target(batch.spark, whole, pipeline)
        return DerivedOutput(flag_untouched(diff, keys, values), choice)
    if (
        values is None
        and choice is not None
        and pipeline.strategy is Strategy.AUTO
        and not choice.fixed  # a replay stays incremental however many keys it touches
    ):
        switched = choice.switched_to_whole(INLINE_KEYS_LIMIT)
        if switched.strategy is Strategy.REWRITE:
            return DerivedOutput(whole, switched)
        return DerivedOutput(diff_against_target(batch.spark, whole, pipeline), switched)
    if choice is not None and choice.strategy is Strategy.MAINTAIN:
        maintained, choice = _maintained(pipeline, paths, batch, snapshots, values, choice)
        if maintained is not None:
            return maintained
    if values is None:  # more touched keys than the driver holds: joins with a plan
        derived = _derived_by_joins(pipeline, declared, paths, batch, snapshots, keys)
        return DerivedOutput(derived, choice)
    restricted = _restricted(paths, snapshots, values, keys)
    current = _checked(pipeline, full(declared, restricted, batch))
    return _for_values(batch, values, current, keys, choice)


def _for_values(
    batch: BatchContext,
    values: list[tuple[object, ...]],
    current: DataFrame,
    keys: list[str],
    choice: StrategyChoice | None,
) -> DerivedOutput:
    """The changes for the touched ``values`` (:func:`changes_for_values`: one change per
    value), which the output carries as its keys."""
    frame = changes_for_values(batch.spark, values, current, keys)
    return DerivedOutput(frame, choice, keys=tuple(values))


def _maintained(
    pipeline: Pipeline,
    paths: Mapping[str, tuple[KeyPath, ...]],
    batch: BatchContext,
    snapshots: Mapping[str, DataFrame],
    values: list[tuple[object, ...]] | None,
    choice: StrategyChoice,
) -> tuple[DerivedOutput | None, StrategyChoice]:
    """The changes of a ``maintain`` batch (:mod:`~watermark_dagster.read.maintain`) and
    its strategy, its reason saying what became of each state; or None and the fallback
    to ``incremental`` when the batch cannot be maintained (an ``auto`` batch: a
    configured ``maintain`` is refused, with nothing written)."""
    keys = list(pipeline.keys)
    form = form_of(pipeline.declared.sql if pipeline.declared else None, pipeline.upstreams)
    why = form if isinstance(form, Unmaintainable) else None
    if not isinstance(form, Unmaintainable):
        touched = values if values is not None else _touched_keys(paths, batch, snapshots, keys)
        restricted = _restricted(paths, snapshots, touched, keys)
        found = maintained_rows(pipeline, form, batch, paths, restricted, touched)
        if not isinstance(found, Unmaintainable):
            current = _checked(pipeline, found[0])
            rebuilt = any(step.action == "rebuilt" for step in found[1])
            choice = choice.maintained(state_views(found[1]), rebuilt=rebuilt)
            if values is None:
                assert isinstance(touched, DataFrame)
                return DerivedOutput(recompute(touched, current, keys), choice), choice
            return _for_values(batch, values, current, keys, choice), choice
        why = found
    if pipeline.strategy is Strategy.MAINTAIN:
        raise TerminalError(
            f"Pipeline '{pipeline.name}' sets strategy='maintain', but batch {batch.batch_id} "
            f"cannot be maintained: {why}. Nothing was written.",
            pipeline=pipeline.name,
            batch_id=batch.batch_id,
            fix="set strategy='auto' (it runs incremental where maintain cannot) or "
            "'incremental'; the batch then runs again.",
        )
    return None, choice.fell_back(str(why))


def _restricted(
    paths: Mapping[str, tuple[KeyPath, ...]],
    snapshots: Mapping[str, DataFrame],
    touched: list[tuple[object, ...]] | DataFrame,
    keys: list[str],
) -> dict[str, DataFrame]:
    """Every snapshot cut down to the rows that can reach a touched key: an upstream
    holding the keys to their rows; one reached through a join path, with the keys held
    as values and the walk turned on, to its rows that walk to one
    (:mod:`~watermark_dagster.read.reach`), else whole."""
    if isinstance(touched, DataFrame):
        return {
            u: _matching_keys(snapshots[u], path, touched, keys)
            if (path := restrictable(paths[u]))
            else snapshots[u]
            for u in paths
        }
    restricted = {
        u: _where_keys(snapshots[u], p, touched) for u in paths if (p := restrictable(paths[u]))
    }
    for u in (u for u in paths if u not in restricted):  # read only for the keys it reaches
        reached = reaching_rows(u, paths[u], snapshots, touched, INLINE_KEYS_LIMIT)
        restricted[u] = snapshots[u] if reached is None else reached
    return restricted


# Up to this many touched keys are collected to the driver, once, and written into the
# plans that use them (a filter on the cut-down snapshots' scans, which Delta also uses to
# skip files, and a broadcast of the recomputed rows); more, and they stay a plan joined
# where it is used.
INLINE_KEYS_LIMIT = 50_000


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
            values = collected(frame, limit)
            if not values:  # None (too many) or none at all: nothing more to carry
                break
            # Compared with the hop's columns as the query's `=` compares them, in the
            # type it converts both to where theirs differ (where_in).
            types = [f.dataType for f in frame.schema.fields]
            reached = where_in(snapshots[hop.upstream], list(hop.match), values, types)
            frame = reached.select(*[quoted(c) for c in hop.carry]).distinct()
        else:
            keyed = _computed_keys(frame, path)
            # The frame is distinct already; keys computed from it may repeat.
            values = collected(keyed.distinct() if path.computed else keyed, limit)
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
    return with_keys(frame, path, names).select(*[quoted(n) for n in names])


def _matching_keys(
    frame: DataFrame, path: KeyPath, touched: DataFrame, keys: Sequence[str]
) -> DataFrame:
    """:func:`_where_keys` with the touched ``keys`` as a plan."""
    if not path.computed:
        return matching_keys(frame, touched, list(path.start), keys)
    names = [f"_wm_computed{i}" for i in range(len(path.start))]
    return matching_keys(with_keys(frame, path, names), touched, names, keys).drop(*names)


def _where_keys(frame: DataFrame, path: KeyPath, values: list[tuple[object, ...]]) -> DataFrame:
    """The rows of ``frame`` (the upstream ``path`` starts at, direct) whose key is one of
    ``values``: :func:`where_in` on the start columns, or on the keys the query computes
    from them."""
    if not path.computed:
        return where_in(frame, list(path.start), values)
    names = [f"_wm_computed{i}" for i in range(len(path.start))]
    return where_in(with_keys(frame, path, names), names, values).drop(*names)


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
    restricted = _restricted(paths, snapshots, touched, keys)
    current = _checked(pipeline, full(declared, restricted, batch))
    return recompute(touched, current, keys)


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
