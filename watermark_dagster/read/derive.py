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

Every match above is null-safe (:func:`~watermark_dagster.read.changes.matching_keys`): a
NULL target key (the group of customers without a region) is touched, recomputed and
deleted like any other. Carrying NULL through a hop may select rows the full transform's
own ``=`` join would not reach: that can only add keys to recompute, never lose one.
"""

from collections.abc import Mapping

from pyspark.sql import DataFrame

from watermark_dagster.config.declared import Declared, KeyPath
from watermark_dagster.config.pipeline import BatchContext, Pipeline, Transform
from watermark_dagster.errors import TerminalError
from watermark_dagster.read.changes import matching_keys, quoted, recompute


def transform_of(pipeline: Pipeline) -> Transform:
    """The function a batch runs for ``pipeline``: its hand-written transform, or the one
    derived from its declaration."""
    declared = pipeline.declared
    if declared is None:
        assert pipeline.transform is not None  # Pipeline checks one of the two is given
        return pipeline.transform

    def derived(batch: BatchContext) -> DataFrame:
        return derive(pipeline, declared, batch)

    derived.__doc__ = pipeline.description
    return derived


def derive(pipeline: Pipeline, declared: Declared, batch: BatchContext) -> DataFrame:
    """The changes that bring ``pipeline``'s target up to the batch's pinned snapshots."""
    keys = list(pipeline.keys)
    snapshots = {u: batch[u].snapshot for u in pipeline.upstreams}
    for path in declared.key_paths.values():
        _check_columns(pipeline, path, snapshots)
    if batch.full_load:
        return _checked(pipeline, full(declared, snapshots, batch))
    touched = _touched_keys(declared, batch, snapshots, keys)
    restricted = {
        u: (
            matching_keys(snapshots[u], touched, list(path.start), keys)
            if path.direct
            else snapshots[u]
        )
        for u, path in declared.key_paths.items()
    }
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
    declared: Declared, batch: BatchContext, snapshots: Mapping[str, DataFrame], keys: list[str]
) -> DataFrame:
    found: DataFrame | None = None
    for upstream, path in declared.key_paths.items():
        values = batch[upstream].changed_keys(list(path.start))
        carried = list(path.start)
        for hop in path.hops:
            # No distinct per hop: a semi-join ignores repeats on its right side, and the
            # union of every path is made distinct once, at the end.
            values = matching_keys(
                snapshots[hop.upstream], values, list(hop.match), carried
            ).select(*[quoted(c) for c in hop.carry])
            carried = list(hop.carry)
        keyed = _as(values, carried, keys)
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
