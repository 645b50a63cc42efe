"""Reading a database upstream through Spark's JDBC source.

The table is named by its validated, quoted identifiers (``dbtable``), never by SQL text.
The window is applied by :func:`~watermark_dagster.read.cursor.in_window` as filters on the
raw cursor (and tie-break) columns against typed literals, which Spark's JDBC relation
compiles into the ``WHERE`` clause of its query: the database serves a window from an index
on ``(cursor, *tie_break)``. Credentials are read from the environment here, at use, and go
to the driver as connection properties only.
"""

from datetime import UTC, date, datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.core.columns import CHANGE_TYPE, DELETE

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DAY = date(1970, 1, 1)


def read_table(
    spark: SparkSession,
    upstream: DatabaseUpstream,
    bounds: tuple[object, object] | None = None,
) -> DataFrame:
    """The database table as a DataFrame (nothing is read until an action).

    Args:
        spark: the session to read with.
        upstream: the database upstream.
        bounds: the lowest and highest cursor value a read covers: with ``partitions`` > 1
            the read is split into that many ranges between them (JDBC ``partitionColumn``);
            rows outside them are still read, by the first and last range.

    Raises:
        ConfigurationError: a referenced credential variable is not set.
    """
    credentials = resolved_options(
        {
            k: v
            for k, v in (("user", upstream.user), ("password", upstream.password))
            if v is not None
        },
        upstream.owner,
    )
    url = upstream.url
    reader = spark.read.format("jdbc")
    if upstream.database != "postgresql":
        # Spark picks its SQL dialect by the URL (backquoted identifiers for jdbc:mysql:);
        # MariaDB's driver takes that scheme when its URL says so.
        url = "jdbc:mysql:" + url.split(":", 2)[2]
        url += ("&" if "?" in url else "?") + "permitMysqlScheme"
        # TIMESTAMP values are shown, and compared, in the session's zone: UTC, as the
        # window's end is pinned (read/database_pin.py).
        reader = reader.option("sessionInitStatement", "SET time_zone = '+00:00'")
    reader = (
        reader.option("url", url)
        .option("driver", upstream.driver)
        .option("dbtable", upstream.quoted_table)
        .option("fetchsize", str(upstream.fetch_size))
    )
    for key, value in (credentials or {}).items():
        reader = reader.option(key, value)
    if upstream.partitions > 1 and bounds is not None and None not in bounds:
        low, high = (_bound(v) for v in bounds)
        if low < high:
            reader = (
                reader.option("partitionColumn", upstream.cursor)
                .option("lowerBound", low)
                .option("upperBound", high)
                .option("numPartitions", str(upstream.partitions))
            )
    return reader.load()


def _bound(value: object) -> str:
    """A partition bound as the JDBC source parses it for the cursor's type."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return str(value)


def literal_of(dtype: T.DataType, position: object) -> Column:
    """A window position's value (µs since the epoch for timestamps, days for dates, the
    value itself otherwise) as a literal of the cursor column's own type, so a comparison
    with the raw column is pushed to the database."""
    return F.lit(value_of(dtype, position))


def value_of(dtype: T.DataType, position: object) -> object:
    """A window position's value as a Python value of the cursor column's type."""
    if isinstance(position, int) and isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        moment = _EPOCH + timedelta(microseconds=position)
        return moment.replace(tzinfo=None) if isinstance(dtype, T.TimestampNTZType) else moment
    if isinstance(position, int) and isinstance(dtype, T.DateType):
        return _EPOCH_DAY + timedelta(days=position)
    return position


def with_deletes(rows: DataFrame, upstream: DatabaseUpstream) -> DataFrame:
    """Change rows whose soft-delete column is true turned into deletes."""
    if upstream.soft_delete is None:
        return rows
    flagged = F.coalesce(F.col(f"`{upstream.soft_delete}`").cast("boolean"), F.lit(False))
    return rows.withColumn(
        CHANGE_TYPE, F.when(flagged, F.lit(DELETE)).otherwise(F.col(CHANGE_TYPE))
    )


def live_rows(rows: DataFrame, upstream: DatabaseUpstream) -> DataFrame:
    """Rows not flagged deleted by the soft-delete column (all rows without one)."""
    if upstream.soft_delete is None:
        return rows
    return rows.where(~F.coalesce(F.col(f"`{upstream.soft_delete}`").cast("boolean"), F.lit(False)))


__all__ = ["literal_of", "live_rows", "read_table", "value_of", "with_deletes"]
