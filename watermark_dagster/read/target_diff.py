"""The whole form of a ``full`` batch: the full transform's output diffed against the
target, so that the MERGE writes only the rows that changed."""

import operator
from functools import reduce

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.core.columns import CHANGE_TYPE, DELETE, UPSERT
from watermark_dagster.frames.changes import quoted

_OLD = "_wm_old_"
_FOUND = "_wm_found"
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
