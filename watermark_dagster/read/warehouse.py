"""A warehouse target's rows read back into Spark through its JDBC driver, for
``watermark verify`` (:func:`~watermark_dagster.operations.verify.verify_pipeline`)."""

from pyspark.sql import DataFrame, SparkSession

from watermark_dagster.config.warehouse import PostgresTarget
from watermark_dagster.observe.warehouse_sql import qualified
from watermark_dagster.observe.warehouse_state import credentials_of


def read_warehouse(spark: SparkSession, target: PostgresTarget) -> DataFrame:
    """The warehouse table as a DataFrame (read when an action runs; credentials from the
    environment now)."""
    reader = (
        spark.read.format("jdbc")
        .option("url", target.url)
        .option("driver", "org.postgresql.Driver")
        .option("dbtable", qualified(target.schema, target.name))
        .option("fetchsize", "10000")
    )
    for key, value in credentials_of(target).items():
        reader = reader.option(key, value)
    return reader.load()


__all__ = ["read_warehouse"]
