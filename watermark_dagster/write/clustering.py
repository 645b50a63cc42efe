"""A target's clustering kept across writes: reading it (:func:`clustering_columns`,
:func:`is_clustered`), setting it again after a schema replacement cleared it
(:func:`recluster`), and finishing it when a run died between the two
(:func:`finish_layout`).
"""

import logging
from collections.abc import Sequence

from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from watermark_dagster.config.names import validate_name
from watermark_dagster.config.pipeline import Pipeline, WriteMode
from watermark_dagster.frames.changes import quoted_identifier
from watermark_dagster.frames.delta import delta_location
from watermark_dagster.write.layout import target_layout

log = logging.getLogger("watermark_dagster")


def is_clustered(table: RsDeltaTable | None) -> bool:
    """True when the target (as it was before the write) is clustered."""
    if table is None:
        return False
    protocol = table.protocol()
    return "clustering" in (protocol.writer_features or [])


def clustering_columns(spark: SparkSession, target: str) -> tuple[str, ...]:
    """The target's clustering columns now (Delta's table detail)."""
    detail = spark.sql("DESCRIBE DETAIL " + delta_location(target)).first()
    columns = None if detail is None else detail["clusteringColumns"]
    return tuple(columns or ())


def finish_layout(spark: SparkSession, pipeline: Pipeline, table: RsDeltaTable) -> None:
    """Set the clustering again on a target a committed write left without it: an overwrite
    that replaced the schema clears clustering and sets it back in a second statement,
    and a run killed between the two, retried, skips the committed write (its Delta
    transaction). Only a target that was clustered (its protocol says so) and whose layout
    asks for clustering columns, when it has none now."""
    if not is_clustered(table):
        return
    layout = target_layout(
        spark,
        read_schema(spark, pipeline.target),
        keys=pipeline.keys,
        merge=pipeline.write is WriteMode.MERGE,
        partition_by=pipeline.partition_by,
        cluster_by=pipeline.cluster_by,
        change_feed=pipeline.feed_on_create,
    )
    if layout.cluster_by and not clustering_columns(spark, pipeline.target):
        log.info(
            "pipeline=%s: target %s lost its clustering in a write that was not finished; "
            "clustering it by %s again",
            pipeline.name,
            pipeline.target,
            list(layout.cluster_by),
        )
        recluster(spark, pipeline.target, layout.cluster_by)


def read_schema(spark: SparkSession, target: str) -> StructType:
    """The target's current schema."""
    return spark.read.format("delta").load(target).schema


def recluster(spark: SparkSession, target: str, cluster_by: Sequence[str]) -> None:
    """Set the clustering columns again (replacing a schema clears them). No API does
    this, and Delta's ALTER TABLE takes no parameter markers here, so the statement is
    built only from quoted identifiers: the location with backticks escaped, and column
    names validated as plain identifiers."""
    columns = ", ".join(
        quoted_identifier(validate_name("cluster_by column", c)) for c in cluster_by
    )
    spark.sql("ALTER TABLE " + delta_location(target) + " CLUSTER BY (" + columns + ")")
