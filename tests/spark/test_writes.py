"""Writing targets: same-commit ties, no empty commits, metrics of this write only, and a
merge whose cost follows the change. Real Spark, Delta and Dagster throughout."""

import datetime
import decimal
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from delta.tables import DeltaTable
from deltalake import DeltaTable as RsDeltaTable
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.support.lakes import before_images_first
from tests.support.spark_lake import Lake, batch_metadata, open_lake, source_rows, write_ids
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.errors import TerminalError
from watermark_dagster.frames.delta import session_setting
from watermark_dagster.read.inputs import UpstreamInput
from watermark_dagster.write.layout import REWRITE_BELOW_CONF
from watermark_dagster.write.targets import write_target

pytestmark = pytest.mark.spark

# Spark's bound on rows per written file, which first loads also size their files by.
ROWS_PER_FILE_CONF = "spark.sql.files.maxRecordsPerFile"


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


# ------------------------------------------------------------------ same-commit ties


def _restore(lake: Lake, src: str) -> None:
    DeltaTable.forPath(lake.spark, src).restoreToVersion(0)


def _delta_rs_overwrite(lake: Lake, src: str) -> None:
    # No change-data files: Spark derives a delete of every old row and an insert of every
    # new one, all at the same commit version.
    ids = list(range(0, 10))
    write_deltalake(
        src,
        pa.table({"id": pa.array(ids, pa.int64()), "value": pa.array([i * 10 for i in ids])}),
        mode="overwrite",
    )


def _delta_rs_replace_where(lake: Lake, src: str) -> None:
    # delta-rs writes one change-data file holding the inserts, then the deletes.
    ids = [2, 3, 4]
    write_deltalake(
        src,
        pa.table({"id": pa.array(ids, pa.int64()), "value": pa.array([i * 10 for i in ids])}),
        mode="overwrite",
        predicate="id >= 2 AND id <= 4",
    )


def _sync_merge(lake: Lake, src: str) -> None:
    # The "make the table equal this snapshot" MERGE: rows whose value changed do not
    # match, so each is deleted (not matched by source) and re-inserted in one commit.
    wanted = lake.spark.createDataFrame(
        [(i, i * 10 if i % 2 else i) for i in range(0, 9)], "id long, value long"
    )
    (
        DeltaTable.forPath(lake.spark, src)
        .alias("t")
        .merge(wanted.alias("s"), "t.id = s.id AND t.value = s.value")
        .whenNotMatchedInsertAll()
        .whenNotMatchedBySourceDelete()
        .execute()
    )


REWRITES: dict[str, Callable[[Lake, str], None]] = {
    "restore": _restore,
    "delta_rs_overwrite": _delta_rs_overwrite,
    "delta_rs_replace_where": _delta_rs_replace_where,
    "sync_merge": _sync_merge,
}


def _ties(lake: Lake, src: str, start: int, end: int) -> list[Any]:
    """Keys with a delete and an insert at the same commit version in the change feed."""
    feed = (
        lake.spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .option("endingVersion", end)
        .load(src)
    )
    types = F.collect_set("_change_type")
    grouped = feed.groupBy("id", "_commit_version").agg(types.alias("types"))
    both = F.array_contains("types", "delete") & F.array_contains("types", "insert")
    return [r["id"] for r in grouped.where(both).collect()]


@pytest.mark.parametrize("rewrite", sorted(REWRITES))
def test_a_key_removed_and_re_added_in_one_commit_resolves_to_the_state_after_it(
    lake: Lake, rewrite: str
) -> None:
    spark, src = lake.spark, lake.path("src")
    write_ids(spark, src, range(0, 10), cdf=True)  # v0
    # recompute() reads the pinned snapshot, so ties cannot touch it; one case shows it.
    names = ("copy", "raw", "recomputed") if rewrite == "restore" else ("copy", "raw")
    pipes = [
        {"name": name, "upstreams": ["src"], "target": lake.path(name), "transform": name}
        for name in names
    ]
    spec = lake.spec([{"name": "src", "path": src}], pipes)
    assert len(lake.run(spec).completed) == 1  # the first load

    DeltaTable.forPath(spark, src).update("id = 3", {"value": "300"})  # v1
    REWRITES[rewrite](lake, src)  # v2
    tied = _ties(lake, src, 1, 2)
    assert 3 in tied, f"{rewrite}: expected id 3 deleted and re-added at one version: {tied}"

    [batch_id] = lake.run(spec).completed
    planned = lake.store.get_batch(batch_id).inputs["src"]
    assert (planned.mode, planned.range) == (ReadMode.CDF, VersionRange(1, 2))
    expected = source_rows(lake, "src")
    for name in names:
        assert lake.rows(name) == expected, f"{rewrite}: target {name} differs"

    # net_changes itself, with the rows served in the order that trips a tie-break on
    # Spark's row order (every delete ahead of the insert of its commit).
    pinned = UpstreamInput.pinned(
        spark,
        DeltaUpstream(name="src", path=src),
        PlannedInput("src", ReadMode.CDF, VersionRange(1, 2), 2),
    )
    pinned._changes = before_images_first(pinned.changes)  # served in adversarial order
    net = {r["id"]: (r["_change_type"], r["value"]) for r in pinned.net_changes(["id"]).collect()}
    assert 3 in net
    for key, (change, value) in net.items():
        assert (change == "delete") == (key not in expected), (rewrite, key, change)
        assert change == "delete" or value == expected[key], (rewrite, key, value)


# ------------------------------------------------------------------ nothing to write


def _version(path: str) -> int:
    return RsDeltaTable(path).version()


def _last_operation(path: str) -> dict[str, Any]:
    return RsDeltaTable(path).history(1)[0]


def test_a_batch_with_nothing_to_write_commits_nothing_and_reports_zeros(lake: Lake) -> None:
    spark = lake.spark
    orders, log_path = lake.path("orders"), lake.path("log")
    write_ids(spark, orders, range(0, 30), cdf=True)
    write_ids(spark, log_path, range(0, 30), cdf=False)
    pipes = [
        {
            "name": "orders_copy",
            "upstreams": ["orders"],
            "target": lake.path("copy"),
            "transform": "copy",
        },
        {
            "name": "log_copy",
            "upstreams": ["log"],
            "target": lake.path("events"),
            "transform": "appended",
            "write": "append",
            "keys": [],
        },
    ]
    spec = lake.spec([{"name": "orders", "path": orders}, {"name": "log", "path": log_path}], pipes)
    lake.run(spec)  # first loads
    DeltaTable.forPath(spark, orders).update("id < 12", {"value": "value + 1"})
    write_ids(spark, log_path, range(30, 35), cdf=False)
    [merged] = lake.run(spec).completed
    assert batch_metadata(lake, "orders_copy", merged)["rows_updated"] == 12
    copy_version, events_version = _version(lake.path("copy")), _version(lake.path("events"))

    # Commits that change no row (a table property, a compaction): the batch reads
    # nothing and writes nothing.
    RsDeltaTable(orders).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 60 days"}
    )
    DeltaTable.forPath(spark, log_path).optimize().executeCompaction()
    assert _last_operation(log_path)["operation"] == "OPTIMIZE"
    [empty] = lake.run(spec).completed
    for asset, target, version in (
        ("orders_copy", "copy", copy_version),
        ("log_copy", "events", events_version),
    ):
        meta = batch_metadata(lake, asset, empty)
        assert meta["rows_read"] == 0, (asset, meta)
        # Not the 12 rows the MERGE of the previous batch updated: nothing was committed.
        assert (meta["rows_written"], meta["rows_updated"]) == (0, 0), (asset, meta)
        assert _version(lake.path(target)) == version, f"{asset} made an empty commit"
        assert (meta["committed"], meta["target_version"]) == (False, version)
    checkpoints = lake.store.checkpoints(batch_id=empty)
    assert checkpoints
    assert all(c.rows_written == 0 for c in checkpoints)


def _pipeline(lake: Lake, name: str, write: str, keys: tuple[str, ...] = ()) -> Pipeline:
    return Pipeline(
        name=name,
        upstreams=("src",),
        target=lake.path(name),
        keys=keys,
        transform=lambda batch: batch,
        write=write,
    )


def _rows(spark: SparkSession, ids: range | list[int]) -> DataFrame:
    return spark.createDataFrame([(i, i * 10) for i in ids], "id long, value long")


def test_empty_outputs_on_every_write_path(lake: Lake) -> None:
    spark = lake.spark
    empty = _rows(spark, range(0))

    # Append: an empty output commits nothing, again on retry, and the next batch's
    # transaction still lands once.
    append = _pipeline(lake, "appended", "append")
    first = write_target(
        spark, _rows(spark, range(3)), append, batch_id="b1", write_seq=1, full_load=True
    )
    assert (first.created, first.rows_inserted) == (True, 3)
    assert first.committed
    for _ in range(2):
        nothing = write_target(spark, empty, append, batch_id="b2", write_seq=2, full_load=False)
        assert nothing.target_version == first.target_version == _version(append.target)
        assert (nothing.committed, nothing.already_applied, nothing.rows_written) == (
            False,
            False,
            0,
        )
    third = write_target(
        spark, _rows(spark, range(3, 5)), append, batch_id="b3", write_seq=3, full_load=False
    )
    assert (third.committed, third.rows_inserted, third.target_version) == (
        True,
        2,
        first.target_version + 1,
    )
    again = write_target(
        spark, _rows(spark, range(3, 5)), append, batch_id="b3", write_seq=3, full_load=False
    )
    assert (again.committed, again.already_applied, again.rows_written) == (False, True, 0)
    assert lake.table("appended").count() == 5

    # Overwrite: an empty snapshot creates an empty target with the output's schema; an
    # empty reload of an empty target commits nothing; an empty reload of a filled one
    # empties it.
    overwrite = _pipeline(lake, "overwritten", "overwrite")
    created = write_target(spark, empty, overwrite, batch_id="b1", write_seq=1, full_load=True)
    assert (created.created, created.committed, created.rows_written) == (True, True, 0)
    assert lake.table("overwritten").count() == 0
    assert {"id", "value", "_wm_seq", "_wm_batch_id"} <= set(lake.table("overwritten").columns)
    nothing = write_target(spark, empty, overwrite, batch_id="b2", write_seq=2, full_load=True)
    assert (nothing.committed, nothing.target_version) == (False, created.target_version)
    filled = write_target(
        spark, _rows(spark, range(4)), overwrite, batch_id="b3", write_seq=3, full_load=True
    )
    assert (filled.committed, filled.rows_inserted) == (True, 4)
    emptied = write_target(spark, empty, overwrite, batch_id="b4", write_seq=4, full_load=True)
    assert (emptied.committed, emptied.files_removed > 0) == (True, True)
    assert lake.table("overwritten").count() == 0

    # Merge: an empty first output still creates the target; an empty batch commits
    # nothing; a batch whose changes are all older than the target's rows commits nothing
    # (Delta makes no commit) and reports zeros, not the previous MERGE's figures.
    merge = _pipeline(lake, "merged", "merge", ("id",))
    created = write_target(spark, empty, merge, batch_id="b1", write_seq=1, full_load=False)
    assert (created.created, created.committed, created.rows_written) == (True, True, 0)
    upserted = write_target(
        spark, _rows(spark, range(5)), merge, batch_id="b2", write_seq=2, full_load=False
    )
    assert (upserted.committed, upserted.rows_inserted) == (True, 5)
    nothing = write_target(spark, empty, merge, batch_id="b3", write_seq=3, full_load=False)
    assert (nothing.committed, nothing.rows_written, nothing.target_version) == (
        False,
        0,
        upserted.target_version,
    )
    older = _rows(spark, range(5)).withColumn("value", F.lit(-1))
    stale = write_target(spark, older, merge, batch_id="b1", write_seq=1, full_load=False)
    assert (stale.committed, stale.rows_written) == (False, 0)
    assert stale.target_version == upserted.target_version == _version(merge.target)
    assert sorted(r["value"] for r in lake.table("merged").collect()) == [0, 10, 20, 30, 40]


# ------------------------------------------------------------------ cost


@pytest.fixture
def small_files(spark: SparkSession) -> Iterator[None]:
    """First loads write files of at most 5,000 rows (the session setting is restored)."""
    previous = spark.conf.get(ROWS_PER_FILE_CONF, None)
    spark.conf.set(ROWS_PER_FILE_CONF, "5000")
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(ROWS_PER_FILE_CONF)
        else:
            spark.conf.set(ROWS_PER_FILE_CONF, previous)


def _file_ranges(path: str) -> list[tuple[int, int]]:
    """(min id, max id) of each data file, from the statistics in the Delta log."""
    actions = pa.table(RsDeltaTable(path).get_add_actions(flatten=True)).to_pydict()
    return sorted(zip(actions["min.id"], actions["max.id"], strict=True))


@pytest.fixture
def deletion_vectors_always(spark: SparkSession) -> Iterator[None]:
    """Every MERGE writes deletion vectors, however small its target (restored after)."""
    with session_setting(spark, REWRITE_BELOW_CONF, "0"):
        yield


def test_a_merge_batch_copies_about_the_rows_it_changes(
    lake: Lake, small_files: None, deletion_vectors_always: None
) -> None:
    spark, src, n = lake.spark, lake.path("orders"), 20_000
    rows = spark.range(n).select("id", (F.col("id") * 2).alias("value"))
    rows.coalesce(1).write.format("delta").option("delta.enableChangeDataFeed", "true").save(src)
    pipes = [
        {
            "name": "orders_copy",
            "upstreams": ["orders"],
            "target": lake.path("copy"),
            "transform": "copy",
        }
    ]
    spec = lake.spec([{"name": "orders", "path": src}], pipes)
    lake.run(spec)  # the first load
    ranges = _file_ranges(lake.path("copy"))

    # 20 keys spread over every file: 12 updated, 8 deleted, and 5 new keys.
    changed = sorted({(i * 997) % n for i in range(20)})
    table = DeltaTable.forPath(spark, src)
    table.update(F.col("id").isin(changed[:12]), {"value": F.lit(-1)})
    table.delete(F.col("id").isin(changed[12:]))
    spark.range(n, n + 5).select("id", F.lit(7).cast("long").alias("value")).write.format(
        "delta"
    ).mode("append").save(src)
    [batch_id] = lake.run(spec).completed

    # Delta's own figures for the MERGE: unchanged rows rewritten around the changed ones.
    last = _last_operation(lake.path("copy"))
    assert last["operation"] == "MERGE"
    assert int(last["operationMetrics"]["numTargetRowsCopied"]) <= 2 * 25, last
    meta = batch_metadata(lake, "orders_copy", batch_id)
    assert (meta["rows_updated"], meta["rows_deleted"], meta["rows_inserted"]) == (12, 8, 5)
    assert meta["rows_copied"] <= 2 * 25, meta
    assert meta["files_touched"] <= len(ranges)
    assert lake.rows("copy") == source_rows(lake, "orders")

    # How: the first load wrote a few files of disjoint key ranges, with deletion vectors.
    assert 4 <= len(ranges) <= 6, ranges
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges
    config = RsDeltaTable(lake.path("copy")).metadata().configuration
    assert config.get("delta.enableDeletionVectors") == "true"


def test_a_small_target_is_rewritten_and_its_change_feed_holds_only_the_changes(
    lake: Lake, small_files: None, caplog: pytest.LogCaptureFixture
) -> None:
    spark = lake.spark
    merge = _pipeline(lake, "merged", "merge", ("id",))
    # The target has a change data feed, as one another pipeline reads would.
    with session_setting(
        spark, "spark.databricks.delta.properties.defaults.enableChangeDataFeed", "true"
    ):
        write_target(
            spark, _rows(spark, range(20_000)), merge, batch_id="b1", write_seq=1, full_load=True
        )
    assert RsDeltaTable(merge.target).metadata().configuration["delta.enableDeletionVectors"]
    first = RsDeltaTable(merge.target).version()

    # A bad setting is refused before anything is written.
    refused = pytest.raises(TerminalError, match=r"rewriteBelowBytes='16MB'.*whole number")
    with session_setting(spark, REWRITE_BELOW_CONF, "16MB"), refused:
        write_target(
            spark, _rows(spark, range(5)), merge, batch_id="b2", write_seq=2, full_load=False
        )
    assert RsDeltaTable(merge.target).version() == first

    # 10 updated keys spread over every file, 5 deleted, 5 new: the target is far under
    # 16 MB, so the MERGE rewrites the files it touches instead of writing deletion vectors.
    updated, deleted = list(range(7, 20_000, 2_000)), [3, 4_003, 8_003, 12_003, 16_003]
    changes = (
        _rows(spark, updated)
        .withColumn("value", F.lit(-1).cast("long"))
        .unionByName(
            _rows(spark, deleted).withColumn("_change_type", F.lit("delete")),
            allowMissingColumns=True,
        )
        .unionByName(_rows(spark, range(20_000, 20_005)), allowMissingColumns=True)
    )
    with caplog.at_level("INFO", logger="watermark_dagster"):
        result = write_target(spark, changes, merge, batch_id="b3", write_seq=3, full_load=False)
    assert (result.rows_updated, result.rows_deleted, result.rows_inserted) == (10, 5, 5)
    metrics = _last_operation(merge.target)["operationMetrics"]
    assert int(metrics["numTargetDeletionVectorsAdded"]) == 0, metrics
    assert result.rows_copied > 0, result
    assert result.files_removed > 0, result
    assert "instead of writing deletion vectors" in caplog.text
    # The change feed, which pipelines reading this target consume, carries the changed
    # keys only: the rewritten files' unchanged rows are not in it.
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", result.target_version)
        .load(merge.target)
        .select("id", "_change_type")
        .collect()
    )
    assert sorted((r["id"], r["_change_type"]) for r in feed) == sorted(
        [(i, "update_preimage") for i in updated]
        + [(i, "update_postimage") for i in updated]
        + [(i, "delete") for i in deleted]
        + [(i, "insert") for i in range(20_000, 20_005)]
    )
    values = dict(lake.table("merged").select("id", "value").collect())
    assert len(values) == 20_000 - 5 + 5
    assert all(values[i] == -1 for i in updated)
    assert not any(i in values for i in deleted)

    # With the setting at 0 the same target's next MERGE writes deletion vectors.
    with session_setting(spark, REWRITE_BELOW_CONF, "0"):
        again = write_target(
            spark,
            _rows(spark, [11, 5_011]).withColumn("value", F.lit(-2).cast("long")),
            merge,
            batch_id="b4",
            write_seq=4,
            full_load=False,
        )
    assert (again.rows_updated, again.rows_copied) == (2, 0), again
    assert (
        int(_last_operation(merge.target)["operationMetrics"]["numTargetDeletionVectorsAdded"]) == 2
    )


def test_the_merge_condition_lets_delta_skip_files(lake: Lake, small_files: None) -> None:
    from watermark_dagster.write.merge import prepare_changes
    from watermark_dagster.write.skipping import MAX_INTERVALS, skipping_condition
    from watermark_dagster.write.summary import intervals, summarize

    spark = lake.spark
    merge = _pipeline(lake, "merged", "merge", ("id",))
    write_target(
        spark, _rows(spark, range(20_000)), merge, batch_id="b1", write_seq=1, full_load=True
    )
    ranges = _file_ranges(merge.target)
    assert 4 <= len(ranges) <= 6, ranges
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges
    target = lake.table("merged").alias("t")

    def files_read(changed: list[int]) -> int:
        prepared = prepare_changes(
            _rows(spark, changed), keys=["id"], batch_seq=2, batch_id="b2", pipeline="merged"
        )
        summary = summarize(prepared, ranges=["id"])
        spans = intervals(changed, MAX_INTERVALS)
        condition = skipping_condition(prepared, summary, ["id"], spans)
        assert condition is not None
        return len(target.where(condition).inputFiles())

    assert files_read([100, 101, 102]) == 1  # within the first file's range
    # Keys at both ends: one min..max range would read every file; the intervals read two.
    assert files_read([5, 6, 19_990]) == 2
    assert files_read(list(range(0, 20_000, 1_000))) == len(ranges)

    # A write puts the intervals in its MERGE condition only when, by the files' statistics
    # in the log, they skip files the one range does not (Delta records the condition).
    def merged_with(changed: list[int], seq: int) -> str:
        write_target(
            spark, _rows(spark, changed), merge, batch_id=f"b{seq}", write_seq=seq, full_load=False
        )
        return str(_last_operation(merge.target)["operationParameters"]["predicate"])

    ends = merged_with([5, 6, 19_990], 2)
    assert ends.count(" OR ") == 2, ends  # three intervals: two files read instead of all
    spread = merged_with(list(range(0, 20_000, 1_000)), 3)
    assert " OR " not in spread, spread  # every file holds a changed key: one range


def test_an_old_target_without_deletion_vectors_keeps_working(lake: Lake) -> None:
    spark = lake.spark
    merge = _pipeline(lake, "merged", "merge", ("id",))
    # A target as earlier versions created it: no deletion vectors, no clustering.
    old = _rows(spark, range(100)).withColumn("_wm_seq", F.lit(1).cast("long"))
    old.withColumn("_wm_batch_id", F.lit("b1")).coalesce(1).write.format("delta").save(merge.target)
    changes = _rows(spark, range(95, 105)).withColumn("value", F.lit(-1).cast("long"))
    result = write_target(spark, changes, merge, batch_id="b2", write_seq=2, full_load=False)
    assert (result.rows_updated, result.rows_inserted) == (5, 5)
    assert result.rows_copied == 95  # the one file rewritten around the 5 updated rows
    assert "delta.enableDeletionVectors" not in RsDeltaTable(merge.target).metadata().configuration
    assert lake.table("merged").where("value = -1").count() == 10


def _counted(spark: SparkSession, frame: DataFrame) -> tuple[DataFrame, Any]:
    """``frame`` behind a filter that counts, in an accumulator, the rows it evaluates."""
    counter = spark.sparkContext.accumulator(0)
    seen = F.udf(lambda _: counter.add(1) or True, "boolean", useArrow=False)
    return frame.where(seen(F.col("id"))), counter


def test_the_transform_is_evaluated_once_per_write(lake: Lake) -> None:
    spark = lake.spark
    merge = _pipeline(lake, "merged", "merge", ("id",))
    append = _pipeline(lake, "appended", "append")

    # A first load, then an incremental merge, of an output without _commit_version (as
    # recompute() returns): the duplicate-key check comes from the same single pass.
    output, counter = _counted(spark, _rows(spark, range(40)))
    write_target(spark, output, merge, batch_id="b1", write_seq=1, full_load=True)
    assert counter.value == 40
    changes = _rows(spark, range(30, 50)).withColumn(
        "_change_type", F.when(F.col("id") % 2 == 0, "delete").otherwise("upsert")
    )
    output, counter = _counted(spark, changes)
    result = write_target(spark, output, merge, batch_id="b2", write_seq=2, full_load=False)
    assert counter.value == 20
    assert (result.rows_deleted, result.rows_updated, result.rows_inserted) == (5, 5, 5)

    # The same with _commit_version: several changes of a key, the latest wins.
    versioned = _rows(spark, range(0, 10)).withColumn("_commit_version", F.col("id") % 2)
    versioned = versioned.withColumn("id", F.col("id") % 5)
    output, counter = _counted(spark, versioned)
    write_target(spark, output, merge, batch_id="b3", write_seq=3, full_load=False)
    assert counter.value == 10
    assert {r["id"]: r["value"] for r in lake.table("merged").where("id < 5").collect()} == {
        0: 50,
        1: 10,
        2: 70,
        3: 30,
        4: 90,
    }

    # Append: the delete check comes from the same pass; a retried batch whose
    # transaction the target holds is not computed at all.
    output, counter = _counted(spark, _rows(spark, range(25)))
    write_target(spark, output, append, batch_id="b1", write_seq=1, full_load=False)
    assert counter.value == 25
    output, counter = _counted(spark, _rows(spark, range(25)))
    again = write_target(spark, output, append, batch_id="b1", write_seq=1, full_load=False)
    assert again.already_applied
    assert counter.value == 0


def test_a_merge_adds_a_new_output_column_and_keeps_the_rows_it_did_not_touch(lake: Lake) -> None:
    spark = lake.spark
    merge = _pipeline(lake, "merged", "merge", ("id",))
    write_target(spark, _rows(spark, range(4)), merge, batch_id="b1", write_seq=1, full_load=True)
    # The upstream gained a column: the next batch's output carries it for two keys.
    changes = _rows(spark, range(2, 6)).withColumn("note", F.concat(F.lit("n"), F.col("id")))
    result = write_target(spark, changes, merge, batch_id="b2", write_seq=2, full_load=False)
    assert (result.rows_updated, result.rows_inserted) == (2, 2)
    rows = {r["id"]: r["note"] for r in spark.read.format("delta").load(merge.target).collect()}
    assert rows == {0: None, 1: None, 2: "n2", 3: "n3", 4: "n4", 5: "n5"}
    # The same batch again (a retry) leaves the same rows.
    write_target(spark, changes, merge, batch_id="b2", write_seq=2, full_load=False)
    again = {r["id"]: r["note"] for r in spark.read.format("delta").load(merge.target).collect()}
    assert again == rows


def test_a_target_column_named_like_the_merge_source_is_refused(lake: Lake) -> None:
    from watermark_dagster.errors import TerminalError
    from watermark_dagster.write.merge import SOURCE_PREFIX

    spark = lake.spark
    merge = _pipeline(lake, "merged", "merge", ("id",))
    clash = _rows(spark, range(3)).withColumn(SOURCE_PREFIX + "x", F.lit(1))
    write_target(spark, clash, merge, batch_id="b1", write_seq=1, full_load=True)
    before = RsDeltaTable(merge.target).version()
    with pytest.raises(TerminalError, match=SOURCE_PREFIX) as raised:
        write_target(spark, clash, merge, batch_id="b2", write_seq=2, full_load=False)
    assert merge.target in str(raised.value)
    assert RsDeltaTable(merge.target).version() == before


def test_a_reload_killed_before_it_clustered_the_target_again_finishes_on_retry(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41, sequence 5: a write made of several commits. A reload whose output
    changed a column's type replaces the target's schema (which clears its clustering),
    then sets the clustering again. Killed between the two, the retry finds the batch's
    transaction committed and skips the write: before, the target stayed unclustered for
    good; now the retry finishes the layout, and makes no second data commit."""
    from watermark_dagster.core.faults import SimulatedCrash
    from watermark_dagster.write import append_overwrite, clustering

    spark = lake.spark
    pipeline = _pipeline(lake, "reloaded", "merge", keys=("id",))
    first = _rows(spark, range(5))
    write_target(spark, first, pipeline, batch_id="b1", write_seq=1, full_load=True)
    assert clustering.clustering_columns(spark, pipeline.target) == ("id",)

    retyped = spark.createDataFrame([(i, str(i)) for i in range(5)], "id long, value string")

    def killed(*_args: Any, **_kwargs: Any) -> None:
        raise SimulatedCrash("killed before the recluster")

    monkeypatch.setattr(append_overwrite, "recluster", killed)
    with pytest.raises(SimulatedCrash):
        write_target(spark, retyped, pipeline, batch_id="b2", write_seq=2, full_load=True)
    monkeypatch.undo()
    assert clustering.clustering_columns(spark, pipeline.target) == ()
    data_commit = _version(pipeline.target)

    again = write_target(
        spark, retyped, pipeline, batch_id="b2", write_seq=2, full_load=True, retried=True
    )
    assert again.already_applied
    assert clustering.clustering_columns(spark, pipeline.target) == ("id",)
    assert _last_operation(pipeline.target)["operation"] == "CLUSTER BY"
    assert _version(pipeline.target) == data_commit + 1  # the recluster, no second write


def test_a_write_that_loses_its_commit_to_a_concurrent_writer_is_decided_again(
    lake: Lake,
) -> None:
    """Two runs replaying into one target (a backfill of two partitions) race their
    commits: Delta fails the loser with a concurrent-modification conflict. The write is
    decided again on the target's new version, with a pause, until it lands; nothing is
    applied twice and the conflict is counted in its result. Here a writer appends rows
    of other keys to the target, one commit after another, while the MERGE runs, until
    the MERGE has lost once. Before, the run failed with Delta's raw
    ``DELTA_CONCURRENT_APPEND``."""
    import logging
    import threading

    spark = lake.spark
    merge = _pipeline(lake, "merged", "merge", ("id",))
    first = _rows(spark, range(3000))
    write_target(spark, first, merge, batch_id="b1", write_seq=1, full_load=True)
    # Another writer: its own session (the MERGE's transaction settings are per session).
    other_writer = spark.newSession()
    row = other_writer.read.format("delta").load(merge.target).limit(1).localCheckpoint()
    lost = threading.Event()

    class Conflicts(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "a concurrent writer committed" in record.getMessage():
                lost.set()

    handler = Conflicts()
    logging.getLogger("watermark_dagster").addHandler(handler)
    appended: list[int] = []

    def append_until_lost(stop: threading.Event) -> None:
        key = 100_000
        while not lost.is_set() and not stop.is_set():
            other = row.withColumn("id", F.lit(key).cast("long"))
            other.write.format("delta").mode("append").save(merge.target)
            appended.append(key)
            key += 1

    try:
        results = []
        for seq in range(2, 7):  # a few tries: the MERGE must overlap a commit once
            stop = threading.Event()
            writer = threading.Thread(target=append_until_lost, args=(stop,))
            writer.start()
            try:
                changes = _rows(spark, range(0, 3000, 2)).withColumn("value", F.lit(seq))
                results.append(
                    write_target(
                        spark, changes, merge, batch_id=f"b{seq}", write_seq=seq, full_load=False
                    )
                )
            finally:
                stop.set()
                writer.join()
            if lost.is_set():
                break
    finally:
        logging.getLogger("watermark_dagster").removeHandler(handler)
    assert lost.is_set(), "no commit raced the MERGE in 5 tries"
    assert results[-1].conflicts >= 1, results[-1]
    assert results[-1].rows_updated == 1500, results[-1]
    rows = spark.read.format("delta").load(merge.target)
    assert rows.count() == 3000 + len(appended)
    merged = rows.where(F.col("id") < 3000).where("id % 2 = 0").where(f"value = {seq}")
    assert merged.count() == 1500


# ------------------------------------------------------------------ keys the driver holds


def _stage_sites(spark: SparkSession, group: str) -> list[str]:
    """The call sites (PySpark's ``file:line`` of the action) of every stage the jobs of
    ``group`` ran."""
    tracker = spark.sparkContext.statusTracker()
    sites = []
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info is not None else []:
            found = tracker.getStageInfo(stage)
            sites.append(found.name if found is not None else "")
    return sites


def _changes(spark: SparkSession, upserts: list[int], deletes: list[int]) -> DataFrame:
    rows = [(i, i * 100, "upsert") for i in upserts] + [(i, None, "delete") for i in deletes]
    return spark.createDataFrame(rows, "id long, value long, _change_type string")


def test_a_merge_of_known_keys_runs_no_job_before_the_merge_and_matches_one_without(
    lake: Lake,
) -> None:
    spark = lake.spark
    with_keys = _pipeline(lake, "with_keys", "merge", ("id",))
    without = _pipeline(lake, "without", "merge", ("id",))
    for pipeline in (with_keys, without):
        write_target(
            spark, _rows(spark, range(100)), pipeline, batch_id="b1", write_seq=1, full_load=True
        )
    upserts, deletes = [5, 6, 150, 151], [7, 99, 300]  # updates, inserts, deletes, a missing key
    known = [(i,) for i in upserts + deletes]
    spark.sparkContext.setJobGroup("known-keys", "a merge of known keys")
    output, counter = _counted(spark, _changes(spark, upserts, deletes))
    result = write_target(
        spark, output, with_keys, batch_id="b2", write_seq=2, full_load=False, known_keys=known
    )
    spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    # One evaluation of the output, by the MERGE's own source; no job from the summary
    # module or a key fetch: every stage is Delta's.
    assert counter.value == len(known)
    sites = _stage_sites(spark, "known-keys")
    ours = [s for s in sites if "watermark_dagster" in s or "tests/" in s]
    assert ours == [], sites
    plain = write_target(
        spark, _changes(spark, upserts, deletes), without, batch_id="b2", write_seq=2,
        full_load=False,
    )  # fmt: skip
    counts = (result.rows_inserted, result.rows_updated, result.rows_deleted)
    assert counts == (plain.rows_inserted, plain.rows_updated, plain.rows_deleted) == (2, 2, 2)
    # The counts are the commit's own operationMetrics.
    metrics = _last_operation(with_keys.target)["operationMetrics"]
    assert counts == tuple(
        int(metrics[m])
        for m in ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
    )
    columns = ["id", "value", "_wm_seq"]
    assert sorted(lake.table("with_keys").select(columns).collect()) == sorted(
        lake.table("without").select(columns).collect()
    )
    # The keys' range is in the MERGE condition, as the summary's would be (one file: the
    # intervals would skip nothing more).
    predicate = str(_last_operation(with_keys.target)["operationParameters"]["predicate"])
    assert re.search(r">= 5\)", predicate), predicate
    assert re.search(r"<= 300\)", predicate), predicate


def test_a_duplicated_known_key_fails_the_merge_naming_it_with_nothing_written(
    lake: Lake,
) -> None:
    spark = lake.spark
    merge = _pipeline(lake, "merged", "merge", ("id", "part"))
    first = spark.createDataFrame([(1, "a", 1), (2, None, 2)], "id long, part string, value long")
    write_target(spark, first, merge, batch_id="b1", write_seq=1, full_load=True)
    before = RsDeltaTable(merge.target).version()
    # Two rows of the new key (3, NULL), which Delta's MERGE would insert twice: the MERGE's
    # source itself refuses them.
    twice = spark.createDataFrame(
        [(1, "a", 10), (3, None, 30), (3, None, 31)], "id long, part string, value long"
    )
    with pytest.raises(TerminalError) as caught:
        write_target(
            spark, twice, merge, batch_id="b2", write_seq=2, full_load=False,
            known_keys=[(1, "a"), (3, None)],
        )  # fmt: skip
    message = str(caught.value)
    assert "several rows for key" in message, message
    assert "'id': 3" in message, message
    assert "'part': None" in message, message
    assert RsDeltaTable(merge.target).version() == before
    assert sorted(r["value"] for r in lake.table("merged").collect()) == [1, 2]


def test_known_keys_of_several_types_give_the_target_a_merge_without_them_gives(
    lake: Lake,
) -> None:
    """Dates, decimals, strings and NULL keys: ranges taken in Python must hold every key
    Spark would match (a range that excluded one would insert a second row of it)."""
    spark = lake.spark
    schema = "day date, amount decimal(10,2), name string, value long"
    rows = [
        (datetime.date(2026, 1, d), decimal.Decimal(f"{d}.50"), n, d)
        for d, n in [(1, "a"), (2, "B"), (3, "ä"), (4, None), (5, "z")]
    ]
    keys = ("day", "amount", "name")
    pipes = {n: _pipeline(lake, n, "merge", keys) for n in ("with_keys", "without")}
    for pipeline in pipes.values():
        write_target(
            spark, spark.createDataFrame(rows, schema), pipeline, batch_id="b1", write_seq=1,
            full_load=True,
        )  # fmt: skip
    changed = [(d, a, n, v + 100) for d, a, n, v in rows[2:]] + [
        (datetime.date(2026, 2, 1), decimal.Decimal("0.01"), "new", 1)
    ]
    known = [(d, a, n) for d, a, n, _ in changed]
    write_target(
        spark, spark.createDataFrame(changed, schema), pipes["with_keys"], batch_id="b2",
        write_seq=2, full_load=False, known_keys=known,
    )  # fmt: skip
    write_target(
        spark, spark.createDataFrame(changed, schema), pipes["without"], batch_id="b2",
        write_seq=2, full_load=False,
    )  # fmt: skip
    columns = ["day", "amount", "name", "value"]
    got = sorted(lake.table("with_keys").select(columns).collect(), key=str)
    assert got == sorted(lake.table("without").select(columns).collect(), key=str)
    assert len(got) == 6  # the three updated keys were updated, not inserted again
