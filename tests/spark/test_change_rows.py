"""The change rows a batch reports from the log equal the rows Spark's change data feed
reads, for every kind of commit the log's metrics are trusted for; the others are unknown
(and counted instead), never a wrong number."""

from pathlib import Path

import pyarrow as pa
import pytest
from delta.tables import DeltaTable
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from watermark_dagster.observe.change_rows import commit_change_rows, range_change_rows
from watermark_dagster.observe.log import DeltaLog

pytestmark = pytest.mark.spark


def _feed_rows(spark: SparkSession, path: str, start: int, end: int) -> int:
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .option("endingVersion", end)
        .load(path)
        .count()
    )


def _ids(spark: SparkSession, ids: range, shift: int = 0) -> DataFrame:
    return spark.range(ids.start, ids.stop).select(
        F.col("id"), (F.col("id") * 10 + shift).alias("value")
    )


def _commits(spark: SparkSession, path: str, *, deletion_vectors: bool) -> dict[int, str]:
    """Commit every kind of change to a new table at ``path``; version -> what it did."""
    kinds: dict[int, str] = {}
    (
        _ids(spark, range(0, 40))
        .repartition(4)
        .write.format("delta")
        .option("delta.enableChangeDataFeed", "true")
        .option("delta.enableDeletionVectors", str(deletion_vectors).lower())
        .save(path)
    )
    kinds[0] = "create"
    table = DeltaTable.forPath(spark, path)

    def committed(kind: str) -> None:
        version = table.history(1).collect()[0]["version"]
        if version > max(kinds):  # an OPTIMIZE with nothing to compact commits nothing
            kinds[version] = kind

    _ids(spark, range(40, 50)).write.format("delta").mode("append").save(path)
    committed("append")
    table.update("id < 5", {"value": F.lit(-1)})
    committed("update")
    table.delete("id >= 45")
    committed("delete rows")
    source = _ids(spark, range(30, 60), shift=1).withColumn(
        "drop", F.col("id") % 7 == 0
    )  # 30..44 match (some deleted), 45..59 are new
    (
        table.alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete("s.drop")
        .whenMatchedUpdate(set={"value": "s.value"})
        .whenNotMatchedInsert(values={"id": "s.id", "value": "s.value"})
        .execute()
    )
    committed("merge")
    table.optimize().executeCompaction()  # the merge's small files
    committed("optimize")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('watermark.test' = 'yes')")
    committed("properties")
    write_deltalake(
        path,
        pa.table({"id": pa.array([100, 101], pa.int64()), "value": pa.array([1, 2], pa.int64())}),
        mode="append",
    )
    committed("delta-rs append")
    table.delete()  # every row: whole files removed
    committed("delete all")
    _ids(spark, range(0, 10)).write.format("delta").mode("overwrite").save(path)
    committed("overwrite")
    return kinds


# The commits whose change rows the log must give (the rest may be unknown, never wrong).
KNOWN = {"create", "append", "update", "delete rows", "merge", "optimize", "properties"}


@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["files", "deletion-vectors"])
def test_the_logs_count_of_each_commits_change_rows_is_the_change_feeds(
    spark: SparkSession, tmp_path: Path, deletion_vectors: bool
) -> None:
    path = str(tmp_path / "up")
    kinds = _commits(spark, path, deletion_vectors=deletion_vectors)
    log = DeltaLog(path)
    known = {}
    for version, kind in sorted(kinds.items()):
        rows = commit_change_rows(log.actions(version) or [])
        if kind in KNOWN:
            assert rows is not None, (kind, log.actions(version))
        if rows is not None:
            assert rows == _feed_rows(spark, path, version, version), kind
            known[version] = rows
    assert kinds[max(kinds)] == "overwrite"
    assert commit_change_rows(log.actions(max(kinds)) or []) is None  # deletes not counted
    # A range is known only when each of its commits is, and is then their sum.
    merge = next(v for v, k in kinds.items() if k == "merge")
    assert range_change_rows(log.actions(v) for v in range(1, merge + 1)) == _feed_rows(
        spark, path, 1, merge
    )
    assert range_change_rows(log.actions(v) for v in range(1, max(kinds) + 1)) is None
    assert range_change_rows([log.actions(999)]) is None  # a commit not in the log
