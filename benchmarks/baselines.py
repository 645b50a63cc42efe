"""What a user would run instead of watermark-dagster, and the projection every contender
shares: a full recompute, and Structured Streaming over the change data feed.

Used by ``benchmarks/incremental.py`` in its own warm Spark session, and run cold here, one
fresh Python process and JVM per call, timed by the parent from outside:

    python -m benchmarks.baselines recompute '{"spark": {...}, "upstream": ..., ...}'
    python -m benchmarks.baselines streaming '{"spark": {...}, "upstream": ..., ...}'

A cold baseline imports PySpark and the project's ``build_spark_session`` (loaded from its
file, so the package, and Dagster with it, is not imported: a plain PySpark job would not
pay for that either). Nothing here imports ``watermark_dagster`` at module level, so the
benchmark's code location can import the projection cheaply.
"""

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

# The columns every contender's target holds; the correctness check compares these.
TARGET_COLUMNS = ("id", "customer_id", "amount_cents", "day", "payload")
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"


def project(rows: DataFrame) -> DataFrame:
    """The per-row projection every contender applies (a cheap, typical cleaning step).

    Keeps ``_change_type`` and ``_commit_version`` when the input has them, so the same
    function serves a change feed (our transform, streaming) and a snapshot (recompute).
    """
    carried = [c for c in (CHANGE_TYPE, COMMIT_VERSION) if c in rows.columns]
    return rows.select(
        "id",
        "customer_id",
        F.round(F.col("amount") * 100).cast("long").alias("amount_cents"),
        F.to_date("ts").alias("day"),
        "payload",
        *carried,
    )


def build_session(master: str, conf: Mapping[str, str], app_name: str) -> SparkSession:
    """A Spark session made by the project's ``build_spark_session`` (its module imports
    neither Dagster nor delta-rs, so a cold baseline process pays only for Spark)."""
    from watermark_dagster.runtime.spark import build_spark_session

    return build_spark_session(master=master, app_name=app_name, conf=dict(conf))


def recompute(spark: SparkSession, upstream: str, target: str, version: int) -> None:
    """Full recompute: read the upstream as of ``version``, project, overwrite ``target``."""
    snapshot = spark.read.format("delta").option("versionAsOf", version).load(upstream)
    (
        project(snapshot)
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .save(target)
    )


def create_streaming_target(
    spark: SparkSession, upstream: str, target: str, *, our_layout: bool = False
) -> None:
    """The empty target the streaming query merges into (its schema is the projection's).

    With ``our_layout`` it is created as watermark-dagster creates a merge target
    (deletion vectors on, clustered on ``id``): the floor a MERGE of the same changes into
    the same kind of table costs, without anything of ours around it.
    """
    empty = project(spark.read.format("delta").load(upstream)).limit(0)
    if not our_layout:
        empty.write.format("delta").mode("errorifexists").save(target)
        return
    from watermark_dagster.write.layout import create_target, target_layout

    layout = target_layout(spark, empty.schema, keys=("id",), merge=True)
    create_target(spark, target, empty.schema, layout)


def _merge_latest_per_key(target: str) -> Callable[[DataFrame, int], None]:
    from delta.tables import DeltaTable

    def apply(batch: DataFrame, batch_id: int) -> None:
        latest_first = Window.partitionBy("id").orderBy(F.col(COMMIT_VERSION).desc())
        latest = (
            batch.where(F.col(CHANGE_TYPE) != "update_preimage")
            .withColumn("_rank", F.row_number().over(latest_first))
            .where(F.col("_rank") == 1)
        )
        source = project(latest)
        is_delete: Column = F.col(f"s.{CHANGE_TYPE}") == "delete"
        values = {c: F.col(f"s.{c}") for c in TARGET_COLUMNS}
        (
            DeltaTable.forPath(batch.sparkSession, target)
            .alias("t")
            .merge(source.alias("s"), F.col("t.id") == F.col("s.id"))
            .whenMatchedDelete(condition=is_delete)
            .whenMatchedUpdate(condition=~is_delete, set=values)
            .whenNotMatchedInsert(condition=~is_delete, values=values)
            .execute()
        )

    return apply


def streaming_catch_up(spark: SparkSession, upstream: str, target: str, checkpoint: str) -> int:
    """Structured Streaming: ``readStream`` of the change feed, ``availableNow``, checkpointed,
    ``foreachBatch`` MERGE of the latest change per key. Returns the micro-batches run.

    The first run reads the table's snapshot as inserts (Delta's change feed source without
    a starting version), later runs only the commits after the checkpoint.
    """
    changes = spark.readStream.format("delta").option("readChangeFeed", "true").load(upstream)
    query = (
        changes.writeStream.foreachBatch(_merge_latest_per_key(target))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"streaming query failed: {query.exception()}")
    return len(query.recentProgress)


def _cold(kind: str, spec: dict[str, Any]) -> None:
    spark = build_session(spec["spark"]["master"], spec["spark"]["conf"], f"bench-cold-{kind}")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        if kind == "recompute":
            recompute(spark, spec["upstream"], spec["target"], int(spec["version"]))
        elif kind == "streaming":
            streaming_catch_up(spark, spec["upstream"], spec["target"], spec["checkpoint"])
        else:
            raise SystemExit(f"unknown baseline {kind!r}: use recompute or streaming")
    finally:
        spark.stop()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m benchmarks.baselines recompute|streaming SPEC_JSON")
    _cold(sys.argv[1], json.loads(sys.argv[2]))
