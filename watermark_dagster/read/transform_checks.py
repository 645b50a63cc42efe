"""Checks of a full transform on the plan Spark analyzed, before anything is written.

What the declared form's key paths cannot show, the plan does: :func:`reads_only_upstreams`
refuses a transform that reads a table outside its upstreams (not pinned to the batch),
or rows no batch pins; :func:`computes_per_key` refuses one that mixes keys (a window not
partitioned by them, an aggregate across them) or is non-deterministic. No Spark job
runs: the analyzed plan, or over Spark Connect the client's plan, is read.
"""

import json
import re
from collections.abc import Iterable
from typing import Any, cast

from py4j.protocol import Py4JError
from pyspark.sql import DataFrame

from watermark_dagster.config.batch_context import BatchContext
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.errors import TerminalError
from watermark_dagster.read.plan_text import TRUNCATED, PlanNode, analyzed_tree
from watermark_dagster.read.tables import comparable_location


def reads_only_upstreams(
    pipeline: Pipeline, batch: BatchContext, output: DataFrame, *, declared_sql: bool = False
) -> None:
    """Check that the full transform (``output``) reads no table but its upstreams.

    A table the transform is not given is not pinned to the batch's versions, and its
    changes touch no key, so the target would silently drift from a full recompute. The
    check compares where Spark's plan reads with the upstreams' locations: the root paths
    of the analyzed plan's file relations, or over Spark Connect the paths of the client's
    plan's reads (no Spark job either way), or, where those cannot be told (a relation
    that is not file-based, a table name or SQL text over Connect), the files of
    ``DataFrame.inputFiles()``, which leave out a subquery's: over Spark Connect a Python
    transform's table read in a subquery of SQL text or by name is refused, as unlocated.
    Rows computed before the batch (a checkpoint, an RDD) and rows held by the driver
    (``createDataFrame``, of collected rows or literals) are refused too: no batch pins
    them. With ``declared_sql`` the tables were proven to be the upstreams' views when the
    definitions loaded, and ``VALUES`` are the query's own text: both pass. It cannot
    tell an upstream read again at another version from its pinned snapshot (both are
    under the same location).

    Raises:
        TerminalError: naming the pipeline, what it reads outside and the fix.
    """
    roots = tuple(
        comparable_location(batch[u].location).rstrip("/") + "/" for u in pipeline.upstreams
    )
    read = relation_roots(output)
    if read is None:
        read = list(output.inputFiles())
        if getattr(output, "_jdf", None) is None and not declared_sql:
            read += _unlocated_in_subqueries(_connect_plan(pipeline, output))
    read = [*read, *_unpinned(_leaves(pipeline, output), literal_rows=declared_sql)]
    outside = sorted(
        {r for r in read if not (comparable_location(r).rstrip("/") + "/").startswith(roots)}
    )
    if outside:
        raise TerminalError(
            f"Pipeline '{pipeline.name}': its full transform reads "
            f"{', '.join(outside[:3])}{' ...' if len(outside) > 3 else ''}, outside its "
            f"upstreams {list(pipeline.upstreams)}. A table the transform is not given is "
            "not pinned to the batch and its changes touch no key, so the target would "
            "drift from a full recompute; nothing was written.",
            pipeline=pipeline.name,
            fix="read only the DataFrames the full transform receives (one per upstream), "
            "and declare any other table it needs as an upstream of the pipeline"
            + (" with a key path." if pipeline.declared is not None else "."),
        )


def _root(location: str) -> str:
    return comparable_location(location).rstrip("/") + "/"


# Leaves of an analyzed plan that read no storage.
_READS_NOTHING = frozenset({"Range", "OneRowRelation"})
# Leaves whose rows no batch pins, as the refusal names them: rows computed before
# (localCheckpoint, checkpoint, an RDD), what they read cannot be told; rows the driver
# holds (createDataFrame of collected rows, or of literals: the two look the same).
_UNPINNED = {
    "LogicalRDD": "rows computed before the batch (LogicalRDD: a checkpoint or an RDD)",
    "LocalRelation": "rows held by the driver (LocalRelation: createDataFrame of collected "
    "or literal rows; put them in an upstream)",
}


def _unlocated_in_subqueries(plan: PlanNode) -> list[str]:
    """What a Spark Connect plan reads in a subquery that no location is known for (the
    server's ``inputFiles`` leave subqueries out, and its plan text shows no paths), as
    the refusal names it."""
    inside = [n for sub in _subquery_plans(plan) for n in sub.walk() if not n.children]
    if any(n.name not in _READS_NOTHING and n.name not in _UNPINNED for n in inside):
        return [
            "a table in a subquery of SQL text or read by name (over Spark Connect its "
            "location cannot be told; read it with the DataFrame API to have it checked)"
        ]
    return []


def _subquery_plans(plan: PlanNode) -> list[PlanNode]:
    """The plans of every subquery expression in ``plan``, outermost first."""
    found: list[PlanNode] = []
    for node in plan.walk():
        found += node.subqueries
    return found


def _unpinned(leaves: Iterable[str], *, literal_rows: bool) -> list[str]:
    """What the leaves named ``leaves`` read that no batch pins, as the refusal says it."""
    allowed = {"LocalRelation"} if literal_rows else set()
    return [_UNPINNED[n] for n in dict.fromkeys(leaves) if n in _UNPINNED and n not in allowed]


def _leaves(pipeline: Pipeline, output: DataFrame) -> list[str]:
    """The kinds of every leaf of ``output``'s analyzed plan, subquery plans' included:
    from the plan itself in a local session, from its text over Spark Connect."""
    jdf = getattr(output, "_jdf", None)
    if jdf is None:
        return [n.name for n in _connect_plan(pipeline, output).walk() if not n.children]
    return [leaf.nodeName() for leaf in _analyzed_leaves(jdf)]


def _analyzed_leaves(jdf: Any) -> list[Any]:
    """The leaves of a local DataFrame's analyzed plan and of every subquery in it (a
    scalar, IN or EXISTS subquery's plan is an expression's, not a child's)."""
    analyzed = jdf.queryExecution().analyzed()
    plans = [analyzed]
    nested = analyzed.subqueriesAll()
    plans += [nested.apply(i) for i in range(nested.size())]
    groups = [p.collectLeaves() for p in plans]
    return [group.apply(i) for group in groups for i in range(group.size())]


def relation_roots(output: DataFrame) -> list[str] | None:
    """The root paths every leaf of ``output``'s plan reads, or None when some leaf's
    location cannot be told here (a relation without files, a table name, SQL text): the
    analyzed plan's leaves in a classic session, the client's own plan over Spark Connect
    (no round trip to the server)."""
    jdf = getattr(output, "_jdf", None)
    if jdf is None:
        return _connect_read_roots(output)
    roots: list[str] = []
    for leaf in _analyzed_leaves(jdf):
        kind = leaf.nodeName()
        if kind in _READS_NOTHING or kind in _UNPINNED:  # unpinned: see reads_only_upstreams
            continue
        if kind != "LogicalRelation":
            return None
        try:
            paths = leaf.relation().location().rootPaths()
        except Py4JError:  # not a file-based relation
            return None
        roots += [paths.apply(j).toString() for j in range(paths.size())]
    return roots


# Leaves of a Spark Connect plan that read no storage.
_CONNECT_READS_NOTHING = frozenset({"local_relation", "cached_local_relation", "range"})


def _connect_read_roots(output: DataFrame) -> list[str] | None:
    """The paths the leaves of a Spark Connect DataFrame's plan read, from the plan the
    client holds, or None when a leaf is not a read of files by path (a table name, SQL
    text, a relation cached on the server...), which only the server can resolve."""
    plan = getattr(output, "_plan", None)
    session = getattr(output, "sparkSession", None)
    if plan is None or session is None:
        return None
    from google.protobuf.message import Message
    from pyspark.sql.connect.proto import relations_pb2

    roots: list[str] = []
    pending = [plan.plan(session.client)]
    while pending:
        relation = pending.pop()
        kind = relation.WhichOneof("rel_type")
        if kind is None:
            return None
        node = getattr(relation, kind)
        children = []
        for _, value in node.ListFields():  # every relation it holds, lists included
            if isinstance(value, relations_pb2.Relation):
                children.append(value)
            elif not isinstance(value, (Message, str, bytes)) and isinstance(value, Iterable):
                children.extend(v for v in value if isinstance(v, relations_pb2.Relation))
        if children:
            pending.extend(children)
        elif kind in _CONNECT_READS_NOTHING:
            continue
        elif kind == "read" and node.WhichOneof("read_type") == "data_source":
            paths = list(node.data_source.paths) or [
                v for k, v in node.data_source.options.items() if k.lower() == "path"
            ]
            if not paths:
                return None
            roots += paths
        else:
            return None
    return roots


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
_NON_DETERMINISTIC_EXPRESSIONS = {
    "Rand": "rand",
    "Randn": "randn",
    "RandStr": "randstr",
    "Uniform": "uniform",
    "Uuid": "uuid",
    "Shuffle": "shuffle",
    "Now": "now",
    "CurrentTimestamp": "current_timestamp",
    "CurrentDate": "current_date",
    "LocalTimestamp": "localtimestamp",
    "MonotonicallyIncreasingID": "monotonically_increasing_id",
    "SparkPartitionID": "spark_partition_id",
    "InputFileName": "input_file_name",
    "InputFileBlockStart": "input_file_block_start",
    "InputFileBlockLength": "input_file_block_length",
    # A local session asks the plan's own `deterministic` flag for these (and for a
    # non-deterministic UDF); the plan's text over Spark Connect shows only their names.
    "CallMethodViaReflection": "reflect",
    "JavaMethod": "java_method",
    "TryReflect": "try_reflect",
    # The rows in the order they are read (sorted or not: Spark's flag says so).
    "CollectList": "collect_list",
    "CollectSet": "collect_set",
    "ListAgg": "listagg",
}
# A call of one of them in a line of the plan's text: `rand(42)`, `uuid(Some(7))`.
_NON_DETERMINISTIC_CALL = re.compile(
    r"(?<![\w.`])(" + "|".join(sorted(set(_NON_DETERMINISTIC_EXPRESSIONS.values()))) + r")\(",
    re.IGNORECASE,
)
# Subquery expressions: their plans are not walked (see computes_per_key).
_SUBQUERIES = frozenset({"ScalarSubquery", "ListQuery", "Exists", "LateralSubquery"})


def computes_per_key(
    pipeline: Pipeline, output: DataFrame, *, windows_proven: bool = False
) -> None:
    """Refuse a full transform whose analyzed plan mixes keys or is non-deterministic.

    The plan (one call: Catalyst's JSON form of the analyzed plan) is searched for windows,
    limits, offsets, samples, aggregates over all rows and non-deterministic functions:
    what the SQL form is refused for when it loads, here for a Python full transform too.
    Subquery plans are searched too (in a correlated one an aggregate over its rows is per
    outer row), and Spark's own ``deterministic`` flag of the plan is consulted for what
    the list does not name. Over Spark Connect the analyzed plan is the server's text of
    it (:func:`_connect_plan`), searched for the same constructs by name; a Python UDF
    marked non-deterministic does not show there. With ``windows_proven`` (declared SQL,
    whose windows :mod:`~watermark_dagster.config.key_inference` proved partitioned by the
    keys) windows pass.

    Raises:
        TerminalError: naming the pipeline, the construct and the fix; nothing is written.
    """
    jdf = getattr(output, "_jdf", None)
    skip = frozenset({"Window"}) if windows_proven else frozenset()
    if jdf is None:  # a Spark Connect DataFrame: the server's plan, as text
        found = _first_across_keys_in_text(_connect_plan(pipeline, output), skip)
    else:
        analyzed = jdf.queryExecution().analyzed()
        found = _first_across_keys(json.loads(analyzed.toJSON()), skip)
        if found is None and not analyzed.deterministic():
            # Spark's own verdict, for what the list above does not name (reflect, a
            # non-deterministic UDF ...).
            found = (
                "computes a non-deterministic expression (Spark's plan says so): a "
                "recomputed key would not get the value a full recompute gives"
            )
    if found is not None:
        raise TerminalError(
            f"Pipeline '{pipeline.name}': its full transform {found}, so the incremental "
            "form cannot be derived from it; nothing was written.",
            pipeline=pipeline.name,
            fix="compute each target row from the rows its key paths reach (join, or group "
            "by the target keys), with deterministic functions; or write the pipeline's "
            "incremental transform by hand with @pipeline.",
        )


def _first_across_keys(
    tree: object, skip: frozenset[str] = frozenset(), *, correlated: bool = False
) -> str | None:
    """The first construct in a Catalyst JSON tree that mixes keys, described, or None.

    A subquery's plan is searched too; in a correlated one an aggregate over all its rows
    is per outer row (``SUM(x) ... WHERE p.k = outer.k``), in an uncorrelated one it is
    over every key's rows."""
    if isinstance(tree, list):
        for item in cast("list[object]", tree):
            found = _first_across_keys(item, skip, correlated=correlated)
            if found is not None:
                return found
        return None
    if not isinstance(tree, dict):
        return None
    node = cast("dict[str, object]", tree)
    kind = str(node.get("class", "")).rsplit(".", 1)[-1].rstrip("$")
    if kind in _SUBQUERIES:
        inner = bool(node.get("outerAttrs")) or correlated
        return _first_across_keys(node.get("plan"), skip, correlated=inner)
    if kind in _ACROSS_KEYS_NODES and kind not in skip:
        return f"uses {kind}: {_ACROSS_KEYS_NODES[kind]}"
    if kind in _NON_DETERMINISTIC_EXPRESSIONS:
        return (
            f"calls {kind}, which is non-deterministic: a recomputed key would not get the "
            "value a full recompute gives"
        )
    if kind == "Aggregate" and node.get("groupingExpressions") == [] and not correlated:
        return "aggregates all rows into one (an aggregate with no grouping)"
    for value in node.values():
        found = _first_across_keys(value, skip, correlated=correlated)
        if found is not None:
            return found
    return None


def _first_across_keys_in_text(
    node: PlanNode, skip: frozenset[str] = frozenset(), *, correlated: bool = False
) -> str | None:
    """:func:`_first_across_keys` for a plan read from its text (Spark Connect)."""
    if TRUNCATED.search(node.text):
        return (
            "has a plan whose text Spark shortened (spark.sql.debug.maxToStringFields), "
            "so what it computes cannot be checked"
        )
    if node.name in _ACROSS_KEYS_NODES and node.name not in skip:
        return f"uses {node.name}: {_ACROSS_KEYS_NODES[node.name]}"
    call = _NON_DETERMINISTIC_CALL.search(node.text)
    if call is not None:
        return (
            f"calls {call[1]}, which is non-deterministic: a recomputed key would not get "
            "the value a full recompute gives"
        )
    if node.name == "Aggregate" and not node.grouped and not correlated:
        return "aggregates all rows into one (an aggregate with no grouping)"
    for sub in node.subqueries:
        found = _first_across_keys_in_text(sub, skip, correlated=correlated or sub.correlated)
        if found is not None:
            return found
    for child in node.children:
        found = _first_across_keys_in_text(child, skip, correlated=correlated)
        if found is not None:
            return found
    return None


_MAX_FIELDS = "spark.sql.debug.maxToStringFields"
# The plan last read from a Connect server, with its frame: the two checks of one full
# transform read it once.
_last_plan: list[tuple[DataFrame, PlanNode]] = []


def _connect_plan(pipeline: Pipeline, output: DataFrame) -> PlanNode:
    """The analyzed plan of a Spark Connect DataFrame, from the server's ``EXPLAIN
    EXTENDED`` (one round trip; analysis and planning, no job), with every field shown.

    Raises:
        TerminalError: the client cannot ask for it, or its text is not a plan this
            reader knows (nothing is written: what the transform computes is unproven).
    """
    if _last_plan and _last_plan[0][0] is output:
        return _last_plan[0][1]
    explain = getattr(output, "_explain_string", None)
    problem = "the Spark Connect client cannot ask the server for it"
    if explain is not None:
        conf = output.sparkSession.conf
        before = conf.get(_MAX_FIELDS, None)
        conf.set(_MAX_FIELDS, str(2**31 - 1))
        try:
            text = str(explain(extended=True))
        finally:
            if before is None:
                conf.unset(_MAX_FIELDS)
            else:
                conf.set(_MAX_FIELDS, before)
        try:
            plan = analyzed_tree(text)
        except ValueError as e:
            problem = f"its text is not a plan this check reads ({e})"
        else:
            _last_plan[:] = [(output, plan)]
            return plan
    raise TerminalError(
        f"Pipeline '{pipeline.name}': the analyzed plan of its full transform could not be "
        f"read ({problem}), so what it reads and computes cannot be checked; nothing was "
        "written.",
        pipeline=pipeline.name,
        fix="run the pipeline with the PySpark version the package pins, or report the "
        "plan text with the issue.",
    )
