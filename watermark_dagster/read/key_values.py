"""The touched keys held by the driver as values (up to ``INLINE_KEYS_LIMIT`` of them,
:mod:`~watermark_dagster.read.derive`): collected once, then written into the plans that
use them: a filter on a snapshot's scan (an ``IN``, which Delta also skips files with), a
flag on a full diff's untouched keys, and the recomputed rows' join as upserts and deletes.
Every match is null-safe: a NULL key equals a NULL key.
"""

import operator
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.core.columns import CHANGE_TYPE, DELETE, UNTOUCHED, UPSERT
from watermark_dagster.frames.changes import quoted
from watermark_dagster.read.changes import matching_keys

_FOUND = "_wm_found"


def collected(frame: DataFrame, limit: int) -> list[tuple[object, ...]] | None:
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
        touched = one_of(quoted(keys[0]), values, changes.schema[keys[0]].dataType)
        return changes.withColumn(UNTOUCHED, ~F.coalesce(touched, F.lit(False)))
    names = [f"_wm_touched{i}" for i in range(len(keys))]
    schema = changes.select(*[quoted(k).alias(n) for k, n in zip(keys, names, strict=True)])
    local = changes.sparkSession.createDataFrame(values, schema.schema).withColumn(hit, F.lit(True))
    on = reduce(
        operator.and_, [quoted(k).eqNullSafe(F.col(n)) for k, n in zip(keys, names, strict=True)]
    )
    joined = changes.join(F.broadcast(local), on, "left_outer")
    return joined.withColumn(UNTOUCHED, F.col(hit).isNull()).drop(hit, *names)


def one_of(column: Column, values: list[tuple[object, ...]], dtype: T.DataType) -> Column:
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
    condition = _isin(column, items) if items else F.lit(False)
    if len(present) < len(values):
        condition = condition | column.isNull()
    return condition


def _isin(column: Column, items: Sequence[object]) -> Column:
    """``column IN (items)``, the same expression as ``Column.isin``, built with one py4j
    call per value instead of about three.

    PySpark's ``isin`` makes each value a literal from the driver (``functions.lit``, a
    look-up and a call each) before handing the JVM the list; the JVM's own ``isin`` makes
    the same literals from the values themselves (PySpark's converters turn a date, a
    timestamp or a Decimal into the same Java object either way). With a few thousand
    touched keys, in each scan they filter, the literals were most of a declared batch's
    driver time (``python -m benchmarks.jobs``: 4-6 s of the transform's build at 200k
    orders). Spark Connect's columns are built on the client, and keep ``isin``."""
    java = getattr(column, "_jc", None)
    if java is None:
        return column.isin(list(items))
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    assert context is not None, "a classic column without a Spark context"
    assert context._jvm is not None, "a Spark context without its JVM"
    values = [getattr(v, "_jc", v) for v in items]  # a Column (TIMESTAMP_NTZ) as its own
    return Column(java.isin(context._jvm.PythonUtils.toSeq(values)))  # type: ignore[call-arg]


def where_in(
    frame: DataFrame,
    columns: list[str],
    values: list[tuple[object, ...]],
    types: Sequence[T.DataType] | None = None,
) -> DataFrame:
    """The rows of ``frame`` whose ``columns`` equal one of ``values`` (NULL equal to
    NULL), as a filter: ``IN`` for one column (Delta skips files with it), else a
    semi-join with the values as a local relation.

    ``types`` are the types of the columns the values were taken from (default:
    ``columns``' own). Where one of them is compared otherwise by ``IN`` than by ``=``
    (:func:`compared_alike`: a STRING and a BIGINT, which ``IN`` compares as strings with
    ``spark.sql.ansi.enabled=false`` and ``=`` as numbers, ``'01' = 1``), the values go
    into a semi-join as their own types, whose ``<=>`` converts them as the query's
    ``=`` between those columns does."""
    if not values:
        return frame.where(F.lit(False))
    schema = frame.select(*[quoted(c) for c in columns]).schema
    if types is not None and not all(
        compared_alike(f.dataType, t) for f, t in zip(schema.fields, types, strict=True)
    ):
        names = [f"_wm_value{i}" for i in range(len(columns))]
        typed = T.StructType([T.StructField(n, t, True) for n, t in zip(names, types, strict=True)])
        local = frame.sparkSession.createDataFrame(values, typed)
        return matching_keys(frame, local, columns, names)
    if len(columns) == 1:
        return frame.where(one_of(quoted(columns[0]), values, schema.fields[0].dataType))
    local = frame.sparkSession.createDataFrame(values, schema)
    return matching_keys(frame, local, columns)


def compared_alike(left: T.DataType, right: T.DataType) -> bool:
    """Whether values of ``left`` and ``right`` compare the same under ``IN`` as under
    ``=``, whatever ``spark.sql.ansi.enabled`` says: the same type (nullability aside), or
    two numeric types (both widen to a common numeric type). Others, a STRING beside a
    number, a date or a timestamp among them, Spark compares under ``=`` by converting the
    string, under ``IN`` (ANSI off) as strings."""
    if isinstance(left, T.NumericType) and isinstance(right, T.NumericType):
        return True
    return left.simpleString() == right.simpleString()


def changes_for_values(
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
