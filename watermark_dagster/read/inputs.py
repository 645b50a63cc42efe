"""What a transform gets for one upstream: the pinned changes and the pinned snapshot."""

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.registry import Upstream

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CDF_COLUMNS = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)
PREIMAGE = "update_preimage"


def _reader(spark: SparkSession, upstream: Upstream):  # noqa: ANN202 - DataFrameReader
    reader = spark.read.format("delta")
    for key, value in (upstream.storage_options or {}).items():
        reader = reader.option(key, value)
    return reader


def read_snapshot(spark: SparkSession, upstream: Upstream, version: int) -> DataFrame:
    """The upstream as of ``version`` (Delta time travel)."""
    return _reader(spark, upstream).option("versionAsOf", version).load(upstream.path)


def read_changes(spark: SparkSession, upstream: Upstream, rng: VersionRange) -> DataFrame:
    """The change data feed of ``upstream`` for the inclusive range ``rng``."""
    return (
        _reader(spark, upstream)
        .option("readChangeFeed", "true")
        .option("startingVersion", rng.start)
        .option("endingVersion", rng.end)
        .load(upstream.path)
    )


@dataclass
class UpstreamInput:
    """One upstream as a batch pinned it.

    Attributes:
        name: the upstream's name.
        mode: how it is read in this batch (CDF, or NOOP when nothing changed).
        range: the inclusive version range, None for NOOP.
        snapshot_version: the version ``snapshot`` is read at (the range's end).
    """

    name: str
    mode: ReadMode
    range: VersionRange | None
    snapshot_version: int
    _spark: SparkSession
    _upstream: Upstream

    @classmethod
    def pinned(
        cls, spark: SparkSession, upstream: Upstream, planned: PlannedInput
    ) -> "UpstreamInput":
        """Bind a planned input to Spark (nothing is read until a DataFrame is used)."""
        return cls(
            name=upstream.name,
            mode=planned.mode,
            range=planned.range,
            snapshot_version=planned.snapshot_version,
            _spark=spark,
            _upstream=upstream,
        )

    @cached_property
    def snapshot(self) -> DataFrame:
        """The table as of the range's end (as of the committed version for NOOP)."""
        return read_snapshot(self._spark, self._upstream, self.snapshot_version)

    @cached_property
    def changes(self) -> DataFrame:
        """Every change row in the range, with ``_change_type``, ``_commit_version`` and
        ``_commit_timestamp``; update pre-images included. Empty for NOOP."""
        if self.range is None:
            return (
                self.snapshot.limit(0)
                .withColumn(CHANGE_TYPE, F.lit(None).cast(T.StringType()))
                .withColumn(COMMIT_VERSION, F.lit(None).cast(T.LongType()))
                .withColumn(COMMIT_TIMESTAMP, F.lit(None).cast(T.TimestampType()))
            )
        # Read once: the transform and the rows-read count both use it.
        return read_changes(self._spark, self._upstream, self.range).persist(
            StorageLevel.MEMORY_AND_DISK
        )

    def release(self) -> None:
        """Drop the cached change rows (called when the pipeline's batch is done)."""
        if "changes" in self.__dict__:
            self.__dict__.pop("changes").unpersist()

    def net_changes(self, keys: Sequence[str]) -> DataFrame:
        """The latest change per key in the range: ``insert``, ``update_postimage`` or
        ``delete`` rows, one per key, pre-images dropped."""
        latest_first = Window.partitionBy(*[F.col(k) for k in keys]).orderBy(
            F.col(COMMIT_VERSION).desc()
        )
        return (
            self.changes.where(F.col(CHANGE_TYPE) != PREIMAGE)
            .withColumn("_wm_rank", F.row_number().over(latest_first))
            .where(F.col("_wm_rank") == 1)
            .drop("_wm_rank")
        )

    def changed_keys(self, columns: Sequence[str]) -> DataFrame:
        """Distinct values of ``columns`` over every change row (pre-images included), e.g.
        the customer ids whose rows moved, before and after the change."""
        present = F.lit(True)
        for c in columns:
            present = present & F.col(c).isNotNull()
        return self.changes.select(*[F.col(c) for c in columns]).where(present).distinct()
