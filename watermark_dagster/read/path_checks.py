"""Checks of a declared pipeline's key paths against the pinned snapshots' schemas (no
Spark job), before anything is written: every column a path names exists, and the values
a path ends at name the target keys as the query computes them (of the key's own type;
for a key computed by an expression, from columns that are identical, not only equal)."""

from collections.abc import Mapping

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from watermark_dagster.config.key_paths import KeyPath
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.errors import TerminalError


def check_columns(pipeline: Pipeline, path: KeyPath, snapshots: Mapping[str, DataFrame]) -> None:
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


def check_computed_ends(
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


def check_end_types(
    pipeline: Pipeline,
    paths: Mapping[str, tuple[KeyPath, ...]],
    snapshots: Mapping[str, DataFrame],
    whole: DataFrame,
) -> None:
    """A path's end column gives the touched keys' values as they are: refused (from the
    schemas, no Spark job) where its type differs from the target key's, save between
    integral types. The query holds the two equal after a conversion (a BIGINT
    ``customers.customer_id`` joined to the STRING ``o.customer_id`` the target is keyed
    by: ``1 = '01'``), so a changed row's value names a key that is not the target's
    (1, for the rows '01' and '1'). A key computed by an expression is checked by
    :func:`check_computed_ends`."""
    for position, key in enumerate(pipeline.keys):
        wanted = whole.schema[key].dataType
        for path in (p for ps in paths.values() for p in ps):
            if position < len(path.computed) and path.computed[position] is not None:
                continue
            table = path.hops[-1].upstream if path.hops else path.upstream
            column = path.end[position]
            found = snapshots[table].schema[column].dataType
            if _same_values(found, wanted):
                continue
            raise TerminalError(
                f"Pipeline '{pipeline.name}': the key path of '{path.upstream}' ({path}) "
                f"ends at {table}.{column} {found.simpleString()}, but the target key "
                f"'{key}' ({wanted.simpleString()}) is another column the query holds equal "
                "to it only after a conversion (1 = '01'): a changed row's value would not "
                "name the target keys it reaches.",
                pipeline=pipeline.name,
                upstream=path.upstream,
                fix=f"give {table}.{column} the key's type {wanted.simpleString()} in its "
                f"upstream (a CAST in the query relates no column: the join would lead "
                f"nowhere), or key the target by {table}.{column} itself; nothing was "
                "written.",
            )


def _same_values(found: T.DataType, wanted: T.DataType) -> bool:
    """Values of ``found`` are the values of ``wanted`` that they equal: the same type,
    or two integral ones."""
    if isinstance(found, T.IntegralType) and isinstance(wanted, T.IntegralType):
        return True
    return found.simpleString() == wanted.simpleString()


def _equal_not_identical(dtype: T.DataType) -> bool:
    """Values of ``dtype`` can be equal under ``=`` and still differ (floating point's
    -0.0 and 0.0, strings under a collation other than the binary one)."""
    if isinstance(dtype, T.FloatType | T.DoubleType):
        return True
    if isinstance(dtype, T.StringType):
        return getattr(dtype, "collation", "UTF8_BINARY") not in ("UTF8_BINARY", None)
    return "float" in dtype.simpleString() or "double" in dtype.simpleString()
