"""What every reader shares: a Spark reader with the upstream's options, and rows dressed
as change rows."""

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.upstream import CursorUpstream, Upstream
from watermark_dagster.core.columns import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, INSERT


def spark_reader(spark: SparkSession, upstream: Upstream, fmt: str = "delta") -> DataFrameReader:
    """A reader of ``fmt`` carrying the upstream's storage options (and a cursor or landing
    upstream's read options)."""
    reader = spark.read.format(fmt)
    read_options = (
        upstream.read_options if isinstance(upstream, CursorUpstream | LandingUpstream) else None
    )
    for key, value in {**(upstream.storage_options or {}), **(read_options or {})}.items():
        reader = reader.option(key, value)
    return reader


def as_changes(rows: DataFrame, version: int | None) -> DataFrame:
    """Rows presented as change rows: all inserts, at ``version``."""
    return (
        rows.withColumn(CHANGE_TYPE, F.lit(INSERT))
        .withColumn(COMMIT_VERSION, F.lit(version).cast(T.LongType()))
        .withColumn(COMMIT_TIMESTAMP, F.lit(None).cast(T.TimestampType()))
    )
