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

import json
import posixpath
from collections.abc import Mapping
from typing import cast
from urllib.parse import unquote, urlsplit

from py4j.protocol import Py4JError
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
    # The full transform over the whole snapshots: Spark analyses it (no job) so that what
    # it reads and how it computes can be checked before anything is written.
    whole = _checked(pipeline, full(declared, snapshots, batch))
    _computes_per_key(pipeline, whole)
    _reads_only_upstreams(pipeline, batch, whole)
    if batch.full_load:
        return whole
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


def _reads_only_upstreams(pipeline: Pipeline, batch: BatchContext, output: DataFrame) -> None:
    """Check that the full transform (``output``) reads no table but its upstreams.

    A table the transform is not given is not pinned to the batch's versions, and its
    changes touch no key, so the target would silently drift from a full recompute. The
    check compares where Spark's plan reads with the upstreams' locations: the root paths
    of the analyzed plan's file relations (no Spark job), or, where those cannot be told
    (Spark Connect, a relation that is not file-based), the files of
    ``DataFrame.inputFiles()``. A frame built from local data reads nothing and passes. It
    cannot tell an upstream read again at another version from its pinned snapshot (both
    are under the same location).

    Raises:
        TerminalError: naming the pipeline, what it reads outside and the fix.
    """
    roots = tuple(_normalized(batch[u].location).rstrip("/") + "/" for u in pipeline.upstreams)
    read = _relation_roots(output)
    if read is None:
        read = output.inputFiles()
    outside = sorted({r for r in read if not (_normalized(r).rstrip("/") + "/").startswith(roots)})
    if outside:
        raise TerminalError(
            f"Pipeline '{pipeline.name}': its full transform reads "
            f"{', '.join(outside[:3])}{' ...' if len(outside) > 3 else ''}, outside its "
            f"upstreams {list(pipeline.upstreams)}. A table the transform is not given is "
            "not pinned to the batch and its changes touch no key, so the target would "
            "drift from a full recompute; nothing was written.",
            pipeline=pipeline.name,
            fix="read only the DataFrames the full transform receives (one per upstream), "
            "and declare any other table it needs as an upstream of the pipeline with a key "
            "path.",
        )


# Leaves of an analyzed plan that read no storage.
_READS_NOTHING = frozenset({"LocalRelation", "LogicalRDD", "Range", "OneRowRelation"})


def _relation_roots(output: DataFrame) -> list[str] | None:
    """The root paths every leaf of ``output``'s analyzed plan reads, or None when some
    leaf's location cannot be told here (a Connect DataFrame, a relation without files)."""
    jdf = getattr(output, "_jdf", None)
    if jdf is None:
        return None
    leaves = jdf.queryExecution().analyzed().collectLeaves()
    roots: list[str] = []
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        kind = leaf.nodeName()
        if kind in _READS_NOTHING:
            continue
        if kind != "LogicalRelation":
            return None
        try:
            paths = leaf.relation().location().rootPaths()
        except Py4JError:  # not a file-based relation
            return None
        roots += [paths.apply(j).toString() for j in range(paths.size())]
    return roots


def _normalized(location: str) -> str:
    """``location`` as a comparable URI: local paths and ``file:`` URIs as ``file:/path``."""
    parsed = urlsplit(location)
    if parsed.scheme in ("", "file"):
        return "file:" + posixpath.normpath(unquote(parsed.path))
    return f"{parsed.scheme}://{parsed.netloc}{posixpath.normpath(unquote(parsed.path))}"


# Plan nodes and expressions whose rows or values depend on other keys' rows, or that are
# non-deterministic, by the simple name of their Catalyst class.
_ACROSS_KEYS_NODES = {
    "Window": "a window function computes a row from other keys' rows",
    "GlobalLimit": "a limit keeps rows depending on the other keys present",
    "LocalLimit": "a limit keeps rows depending on the other keys present",
    "Offset": "an offset drops rows depending on the other keys present",
    "Tail": "a tail keeps rows depending on the other keys present",
    "Sample": "a sample keeps a random subset of rows",
}
_NON_DETERMINISTIC_EXPRESSIONS = frozenset(
    {
        "Rand",
        "Randn",
        "RandStr",
        "Uniform",
        "Uuid",
        "Shuffle",
        "Now",
        "CurrentTimestamp",
        "CurrentDate",
        "LocalTimestamp",
        "MonotonicallyIncreasingID",
        "SparkPartitionID",
        "InputFileName",
        "InputFileBlockStart",
        "InputFileBlockLength",
    }
)
# Subquery expressions: their plans are not walked (see _computes_per_key).
_SUBQUERIES = frozenset({"ScalarSubquery", "ListQuery", "Exists", "LateralSubquery"})


def _computes_per_key(pipeline: Pipeline, output: DataFrame) -> None:
    """Refuse a full transform whose analyzed plan mixes keys or is non-deterministic.

    The plan (one call: Catalyst's JSON form of the analyzed plan) is searched for windows,
    limits, offsets, samples, aggregates over all rows and non-deterministic functions:
    what the SQL form is refused for when it loads, here for a Python full transform too.
    Subquery plans are not searched; the SQL form's subqueries are analysed when it loads
    (:mod:`~watermark_dagster.config.declared_sql`). On Spark Connect the analyzed plan is
    not reachable from the client, so this check does not run there: the load-time SQL
    analysis and the input-file check still do.

    Raises:
        TerminalError: naming the pipeline, the construct and the fix; nothing is written.
    """
    jdf = getattr(output, "_jdf", None)
    if jdf is None:  # a Spark Connect DataFrame
        return
    found = _first_across_keys(json.loads(jdf.queryExecution().analyzed().toJSON()))
    if found is not None:
        raise TerminalError(
            f"Pipeline '{pipeline.name}': its full transform {found}, so the incremental "
            "form cannot be derived from it; nothing was written.",
            pipeline=pipeline.name,
            fix="compute each target row from the rows its key paths reach (join, or group "
            "by the target keys), with deterministic functions; or write the pipeline's "
            "incremental transform by hand with @pipeline.",
        )


def _first_across_keys(tree: object) -> str | None:
    """The first construct in a Catalyst JSON tree that mixes keys, described, or None."""
    if isinstance(tree, list):
        for item in cast("list[object]", tree):
            found = _first_across_keys(item)
            if found is not None:
                return found
        return None
    if not isinstance(tree, dict):
        return None
    node = cast("dict[str, object]", tree)
    kind = str(node.get("class", "")).rsplit(".", 1)[-1].rstrip("$")
    if kind in _SUBQUERIES:
        return None
    if kind in _ACROSS_KEYS_NODES:
        return f"uses {kind}: {_ACROSS_KEYS_NODES[kind]}"
    if kind in _NON_DETERMINISTIC_EXPRESSIONS:
        return (
            f"calls {kind}, which is non-deterministic: a recomputed key would not get the "
            "value a full recompute gives"
        )
    if kind == "Aggregate" and node.get("groupingExpressions") == []:
        return "aggregates all rows into one (an aggregate with no grouping)"
    for value in node.values():
        found = _first_across_keys(value)
        if found is not None:
            return found
    return None
