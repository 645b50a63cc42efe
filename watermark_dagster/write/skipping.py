"""The target-only conditions a MERGE carries so that Delta skips the target files its
changes cannot touch, and the broadcast of a source small enough to send to every task.

Per key column the condition is the min..max range of the changes; for the first key,
when its changed values are known, up to :data:`MAX_INTERVALS` intervals around them,
where those skip files the one range does not.
"""

import operator
import re
from collections.abc import Sequence
from functools import reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.frames.changes import quoted
from watermark_dagster.write.summary import OutputSummary, intervals

# Up to this many changed keys are fetched to the driver (one small job) to build a
# file-skipping condition finer than one min..max range, of at most this many intervals.
# Beyond it, keys spread over the whole range leave the intervals little to skip.
KEY_LIST_LIMIT = 2_000
MAX_INTERVALS = 32
BROADCAST_THRESHOLD_CONF = "spark.sql.autoBroadcastJoinThreshold"


def _literal(value: Any, dtype: T.DataType) -> Column:
    # Cast to the column's own type, so the comparison keeps the bare column (a cast on the
    # column side would make it ineligible for Delta's data skipping).
    return F.lit(value).cast(dtype)


def skipping_condition(
    prepared: DataFrame,
    summary: OutputSummary,
    keys: Sequence[str],
    key_spans: Sequence[tuple[Any, Any]],
    target_schema: T.StructType | None = None,
) -> Column | None:
    """A condition on the target's key columns alone that every row a change can match
    satisfies: Delta uses it to skip files whose min/max statistics lie outside it.

    Per key column, the min..max range of the changes; for the first key, when its
    changed values were fetched, the intervals ``key_spans`` around them (at most
    :data:`MAX_INTERVALS`, from :func:`~watermark_dagster.write.summary.intervals`); either
    or'ed with ``IS NULL`` when a change's key is NULL (the MERGE matches NULL keys). A key
    whose type differs in the target is left out (a cast on the target's column would
    defeat skipping, and a value may not fit the target's type).
    """
    parts: list[Column] = []
    for k, (lo, hi) in summary.key_ranges.items():
        dtype = prepared.schema[k].dataType
        if target_schema is not None and (
            k not in target_schema.fieldNames() or target_schema[k].dataType != dtype
        ):
            continue
        target = quoted(k)
        if k == keys[0] and key_spans:
            spans = [
                (target == _literal(a, dtype))
                if a == b
                else ((target >= _literal(a, dtype)) & (target <= _literal(b, dtype)))
                for a, b in key_spans
            ]
            part = reduce(operator.or_, spans)
        else:
            part = (target >= _literal(lo, dtype)) & (target <= _literal(hi, dtype))
        if k in summary.null_keys:
            part = part | target.isNull()
        parts.append(part)
    return reduce(operator.and_, parts) if parts else None


def first_key_spans(
    prepared: DataFrame,
    keys: Sequence[str],
    summary: OutputSummary,
    files: pa.Table | None,
    known_keys: Sequence[tuple[object, ...]] | None = None,
) -> list[tuple[Any, Any]]:
    """Up to :data:`MAX_INTERVALS` intervals around the first key's changed values, when
    the driver holds them (``known_keys``) or they are few enough to fetch (a small job over
    the persisted output), and the intervals let Delta skip target files that the key's
    one min..max range does not (:func:`intervals_skip_more`); else none."""
    key = keys[0]
    if key not in summary.key_ranges:
        return []
    if known_keys is not None:
        values: list[Any] = [v[0] for v in known_keys if v[0] is not None]
    elif summary.rows > KEY_LIST_LIMIT:
        return []
    else:
        values = [r[0] for r in prepared.select(quoted(key)).collect() if r[0] is not None]
    spans = intervals(values, MAX_INTERVALS)
    if files is not None and not intervals_skip_more(files, key, spans, summary.key_ranges[key]):
        return []
    return spans


def intervals_skip_more(
    files: pa.Table, key: str, spans: Sequence[tuple[Any, Any]], key_range: tuple[Any, Any]
) -> bool:
    """True when a MERGE condition on ``spans`` makes Delta read fewer of the target's
    ``files`` (its add actions, with flattened statistics) than one on ``key_range``.

    From each file's min/max of ``key`` in the log: a file overlapping the range but no
    span is skipped only by the spans. A file without statistics is read either way; keys
    whose statistics cannot be compared with the values give False. When the spans skip
    nothing more (changes spread over every file), the one range is the cheaper condition:
    32 intervals cost Delta's scans of a 2M-row target with deletion vectors 2-3x the time
    of one range (``python -m benchmarks.incremental --sizes 2M --changes 0.1%``).
    """
    low, high = f"min.{key}", f"max.{key}"
    if low not in files.column_names or high not in files.column_names:
        return False
    lo, hi = key_range
    by_range = by_spans = 0
    try:
        for first, last in zip(
            files.column(low).to_pylist(), files.column(high).to_pylist(), strict=True
        ):
            if first is None or last is None or last < lo or first > hi:
                continue
            by_range += 1
            by_spans += any(not (last < a or first > b) for a, b in spans)
    except TypeError:  # statistics of another type than the changed values
        return False
    return by_spans < by_range


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}


def _size_setting(text: str) -> int:
    """A Spark byte-size setting (``10MB``, ``10485760b``, ``-1``) in bytes."""
    match = re.fullmatch(r"\s*(-?\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        return -1
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def _row_bytes(schema: T.StructType) -> int:
    """A rough width of a row (Spark's own default sizes, strings counted generously)."""
    width = 0
    for f in schema.fields:
        dtype = f.dataType
        if isinstance(dtype, T.StringType | T.BinaryType):
            width += 64
        elif isinstance(dtype, T.ArrayType | T.MapType | T.StructType):
            width += 256
        else:
            width += 8
    return width


def broadcastable(spark: SparkSession, prepared: DataFrame, rows: int) -> bool:
    """True when the changes are small enough, by Spark's own broadcast threshold, to be
    sent to every task instead of shuffling the target."""
    threshold = _size_setting(spark.conf.get(BROADCAST_THRESHOLD_CONF, "10MB") or "-1")
    return threshold > 0 and rows * _row_bytes(prepared.schema) <= threshold
