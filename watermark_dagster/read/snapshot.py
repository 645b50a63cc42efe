"""The SNAPSHOT reader: an upstream as of one version (Delta time travel)."""

from pyspark.sql import DataFrame, SparkSession

from watermark_dagster.config.upstream import Upstream
from watermark_dagster.read.frames import spark_reader


def read_snapshot(spark: SparkSession, upstream: Upstream, version: int) -> DataFrame:
    """The upstream as of ``version`` (Delta time travel)."""
    return spark_reader(spark, upstream).option("versionAsOf", version).load(upstream.path)
