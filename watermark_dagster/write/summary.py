"""Every count and check a write needs, in one aggregate over the persisted output, or
in no job at all when the driver holds the output's keys.

The transform's output is persisted once; this single Spark action then gives the rows,
the deletes, a duplicated key if any, and the key ranges the MERGE condition uses to skip
files, so the transform is evaluated once per batch and no other action runs before the
write.

A declared batch's changes are one per touched key, and the driver holds those keys
(:class:`~watermark_dagster.read.derive.DerivedOutput`): :func:`summary_of_keys` takes the
ranges from them, the keys are checked unique inside the MERGE's own source
(:mod:`~watermark_dagster.write.duplicate_keys`), and the commit's ``operationMetrics``
count what was inserted, updated and deleted. The
output is then evaluated once, by the MERGE, with no job before it.
"""

import datetime
import decimal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.core.columns import CHANGE_TYPE, UNTOUCHED
from watermark_dagster.frames.changes import is_delete, quoted

# Key types whose values come back from Spark as Python values that turn into literals of
# the same type (timestamps are left out: their round trip depends on time zones).
_RANGE_TYPES = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.DecimalType,
    T.StringType,
    T.DateType,
)


@dataclass(frozen=True)
class OutputSummary:
    """What the one aggregate found.

    Attributes:
        rows: rows in the output, deletes included.
        deletes: rows whose ``_change_type`` is ``delete``.
        duplicate: a key with several rows, when duplicates were checked (else None).
        key_ranges: per range-eligible key column, (min, max) over the output's non-NULL
            values.
        null_keys: the range-eligible key columns that are NULL in some output row (a
            NULL key is a key like any other: a file-skipping range must keep its rows).
        drift: keys whose change the batch's own changes did not cause (the output's
            ``_wm_untouched`` rows), None when the output does not say.
        drift_sample: up to two such keys (the least and the greatest).
    """

    rows: int
    deletes: int
    duplicate: dict[str, Any] | None = None
    key_ranges: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    null_keys: frozenset[str] = frozenset()
    drift: int | None = None
    drift_sample: tuple[dict[str, Any], ...] = ()

    @property
    def upserts(self) -> int:
        """Rows that are not deletes."""
        return self.rows - self.deletes


def range_keys(frame: DataFrame, keys: Sequence[str]) -> list[str]:
    """The key columns whose min/max can become a file-skipping condition."""
    return [k for k in keys if isinstance(frame.schema[k].dataType, _RANGE_TYPES)]


def summarize(
    frame: DataFrame,
    *,
    keys: Sequence[str] = (),
    check_duplicates: bool = False,
    ranges: Sequence[str] = (),
) -> OutputSummary:
    """Count rows and deletes, find a duplicated key, and take key ranges, in one action.

    Args:
        frame: the persisted output.
        keys: the key columns (for the duplicate check).
        check_duplicates: look for keys with several rows.
        ranges: key columns to take min and max of.
    """
    delete = (
        is_delete(F.col(CHANGE_TYPE)).cast("long") if CHANGE_TYPE in frame.columns else F.lit(0)
    )
    range_aggs: list[Column] = []
    for i, k in enumerate(ranges):
        range_aggs += [
            F.min(quoted(k)).alias(f"_wm_lo{i}"),
            F.max(quoted(k)).alias(f"_wm_hi{i}"),
            F.max(quoted(k).isNull().cast("int")).alias(f"_wm_null{i}"),
        ]
    flagged = UNTOUCHED in frame.columns and bool(keys)
    key_struct = F.struct(*[quoted(k) for k in keys])

    def drift_aggs(flag: Column) -> list[Column]:
        if not flagged:
            return [F.lit(None).alias("drift"), F.lit(None).alias("lo"), F.lit(None).alias("hi")]
        drifted = F.when(flag, key_struct)
        return [
            F.sum(flag.cast("long")).alias("drift"),
            F.min(drifted).alias("lo"),
            F.max(drifted).alias("hi"),
        ]

    if check_duplicates and keys:
        untouched = [F.max(F.col(UNTOUCHED)).alias(UNTOUCHED)] if flagged else []
        per_key = frame.groupBy(*[quoted(k) for k in keys]).agg(
            F.count(F.lit(1)).alias("_wm_n"), F.sum(delete).alias("_wm_d"), *untouched
        )
        row = per_key.agg(
            F.sum("_wm_n").alias("rows"),
            F.sum("_wm_d").alias("deletes"),
            F.max("_wm_n").alias("most"),
            F.max_by(key_struct, F.col("_wm_n")).alias("example"),
            *drift_aggs(F.col(UNTOUCHED)),
            *range_aggs,
        ).first()
    else:
        row = frame.agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum(delete).alias("deletes"),
            F.lit(None).alias("most"),
            F.lit(None).alias("example"),
            *drift_aggs(F.col(UNTOUCHED) if flagged else F.lit(False)),
            *range_aggs,
        ).first()
    assert row is not None
    duplicate = None
    if row["most"] is not None and row["most"] > 1 and row["example"] is not None:
        duplicate = row["example"].asDict()
    key_ranges = {
        k: (row[f"_wm_lo{i}"], row[f"_wm_hi{i}"])
        for i, k in enumerate(ranges)
        if row[f"_wm_lo{i}"] is not None
    }
    sample = [row[e].asDict() for e in ("lo", "hi") if row[e] is not None]
    return OutputSummary(
        drift=int(row["drift"] or 0) if flagged else None,
        drift_sample=tuple(sample[:1] if len(sample) == 2 and sample[0] == sample[1] else sample),
        rows=int(row["rows"] or 0),
        deletes=int(row["deletes"] or 0),
        duplicate=duplicate,
        key_ranges=key_ranges,
        null_keys=frozenset(k for i, k in enumerate(ranges) if row[f"_wm_null{i}"] == 1),
    )


def intervals(values: Sequence[Any], limit: int) -> list[tuple[Any, Any]]:
    """Cover sorted distinct ``values`` with at most ``limit`` closed intervals.

    Numbers and dates are split at the widest gaps between neighbours (changed keys often
    come in runs: new ids, a recent range); other types are split into runs of equal
    length. Every value lies in some interval, so a condition built from them never
    excludes a row holding one of the values.
    """
    ordered = sorted(set(values))
    if not ordered:
        return []
    if len(ordered) <= limit:
        return [(v, v) for v in ordered]
    sample = ordered[0]
    if isinstance(sample, int | decimal.Decimal | datetime.date):

        def gap(i: int) -> Any:
            a, b = ordered[i], ordered[i + 1]
            if isinstance(a, datetime.date):
                return b.toordinal() - a.toordinal()
            return b - a

        cuts = sorted(sorted(range(len(ordered) - 1), key=gap, reverse=True)[: limit - 1])
    else:
        step = len(ordered) / limit
        cuts = sorted({int(step * j) - 1 for j in range(1, limit)})
    spans, start = [], 0
    for cut in cuts:
        spans.append((ordered[start], ordered[cut]))
        start = cut + 1
    spans.append((ordered[start], ordered[-1]))
    return spans


def summary_of_keys(
    frame: DataFrame, keys: Sequence[str], values: Sequence[tuple[object, ...]]
) -> OutputSummary:
    """The summary of an output with one change per key of ``values`` (tuples in the order
    of ``keys``, held by the driver), with no Spark job.

    ``rows`` is the number of keys. The deletes among them are not known before the
    MERGE, whose commit counts them, so ``deletes`` is 0; the MERGE path reads neither.
    Key ranges are taken of the range-eligible keys whose ordering Python shares with
    Spark (a string with a collation other than the binary one is left out).
    """
    ranges = [
        k
        for k in range_keys(frame, keys)
        if not isinstance(frame.schema[k].dataType, T.StringType)
        or frame.schema[k].dataType == T.StringType()
    ]
    key_ranges: dict[str, tuple[Any, Any]] = {}
    nulls: set[str] = set()
    for k in ranges:
        i = list(keys).index(k)
        present = [v[i] for v in values if v[i] is not None]
        if len(present) < len(values):
            nulls.add(k)
        if present:
            key_ranges[k] = (min(present), max(present))  # pyright: ignore[reportArgumentType]
    return OutputSummary(
        rows=len(values), deletes=0, key_ranges=key_ranges, null_keys=frozenset(nulls)
    )
