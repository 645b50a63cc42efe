"""The CDF reader: the change data feed of a pinned version range."""

from pyspark.sql import DataFrame, SparkSession

from watermark_dagster.config.upstream import Upstream
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.read.frames import spark_reader


def read_changes(spark: SparkSession, upstream: Upstream, rng: VersionRange) -> DataFrame:
    """The change data feed of ``upstream`` for the inclusive range ``rng``."""
    return (
        spark_reader(spark, upstream)
        .option("readChangeFeed", "true")
        .option("startingVersion", rng.start)
        .option("endingVersion", rng.end)
        .load(upstream.path)
    )
