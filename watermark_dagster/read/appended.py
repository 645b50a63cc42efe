"""The APPEND_ONLY reader: exactly the files a range's commits added, as
:func:`~watermark_dagster.read.append_log.scan_appends` found them in the Delta log.
"""

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.config.upstream import Upstream
from watermark_dagster.core.columns import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, INSERT
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.errors import (
    UpstreamUnreadableError,
    reset_command,
)
from watermark_dagster.read.append_log import AppendScan, absolute_file
from watermark_dagster.read.frames import as_changes, spark_reader
from watermark_dagster.read.snapshot import read_snapshot
from watermark_dagster.read.tables import configuration, partition_columns


def read_appended(
    spark: SparkSession, upstream: Upstream, rng: VersionRange, scan: AppendScan
) -> DataFrame:
    """Rows of exactly the files the range's commits added, with their commit version.

    The files are read directly (OPTIMIZE may have rewritten them into files that also
    hold older rows, which must not be read again); partition values come from the log.
    """
    schema = read_snapshot(spark, upstream, rng.end).schema
    partitions = set(partition_columns(upstream, rng.end))
    mapping_schema = T.StructType(
        [T.StructField("_wm_file", T.StringType()), T.StructField(COMMIT_VERSION, T.LongType())]
        + [T.StructField(f"_wm_p_{c}", T.StringType()) for c in sorted(partitions)]
    )
    if not scan.files:
        return as_changes(spark.createDataFrame([], schema), None).where(F.lit(False))
    if configuration(upstream, rng.end).get("delta.columnmapping.mode", "none") != "none":
        raise UpstreamUnreadableError(
            f"Upstream '{upstream.name}' uses column mapping, which an append-only read of its "
            "files cannot follow.",
            upstream=upstream.name,
            versions=f"range={rng}",
            fix="enable the change data feed on the table and run "
            f"`{reset_command(upstream.name)}`, or set mode='snapshot'.",
        )
    data_schema = T.StructType([f for f in schema.fields if f.name not in partitions])
    paths = [absolute_file(upstream, f.path) for f in scan.files]
    mapping = spark.createDataFrame(
        [
            (
                p.rsplit("/", 1)[-1],
                f.version,
                *[f.partition_values.get(c) for c in sorted(partitions)],
            )
            for p, f in zip(paths, scan.files, strict=True)
        ],
        mapping_schema,
    )
    rows = (
        spark_reader(spark, upstream, "parquet")
        .schema(data_schema)
        .load(paths)
        .withColumn("_wm_file", F.col("_metadata.file_name"))
        .join(F.broadcast(mapping), "_wm_file")
    )
    columns = [
        F.col(f"_wm_p_{f.name}").cast(f.dataType).alias(f.name)
        if f.name in partitions
        else F.col(f"`{f.name}`")
        for f in schema.fields
    ]
    return (
        rows.select(*columns, F.col(COMMIT_VERSION))
        .withColumn(CHANGE_TYPE, F.lit(INSERT))
        .withColumn(COMMIT_TIMESTAMP, F.lit(None).cast(T.TimestampType()))
    )
