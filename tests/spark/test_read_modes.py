"""Every kind of upstream and target, with real Spark, Delta and Dagster.

Each location is driven by the real coordinator and finalizer sensors (HeadlessRunner);
targets are compared with what the upstreams hold.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dagster import AssetCheckKey, AssetKey
from dagster._core.loader import LoadingContextForTest
from delta.tables import DeltaTable
from deltalake import DeltaTable as RsDeltaTable
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.conftest import REPO
from tests.support.lakes import defs_from, registry_from, write_spec
from tests.support.spark_lake import (
    Lake,
    batch_metadata,
    id_frame,
    open_lake,
    source_rows,
    write_ids,
)
from watermark_dagster.config.batch_context import BatchContext
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream
from watermark_dagster.core.planning import PlannedInput, cursor_has_new_data, cursor_state
from watermark_dagster.core.ranges import CursorWindow, ReadMode, VersionRange
from watermark_dagster.core.records import BatchStatus, CheckpointStatus
from watermark_dagster.dagster_defs.headless import HeadlessRunner
from watermark_dagster.dagster_defs.health_stuck import STUCK_CHECK
from watermark_dagster.dagster_defs.replay_backfill import REPLAY_TAG
from watermark_dagster.errors import ReplayRefusedError, UpstreamUnreadableError
from watermark_dagster.observe.log import latest_local_version
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import finalize_batch, look_before_planning, plan_next
from watermark_dagster.operations.recompute import recompute_pipeline
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.read.inputs import UpstreamInput

pytestmark = pytest.mark.spark


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


# ------------------------------------------------------------------ APPEND_ONLY


def test_append_only_reads_only_added_files_and_fails_on_updates(lake: Lake) -> None:
    spark, src = lake.spark, lake.path("events")
    write_ids(spark, src, range(0, 50), cdf=False)
    pipes = [
        {
            "name": "events_copy",
            "upstreams": ["events"],
            "target": lake.path("copy"),
            "transform": "copy",
        }
    ]
    spec = lake.spec([{"name": "events", "path": src}], pipes)
    first = lake.run(spec)
    assert len(first.completed) == 1, first
    assert not first.failed_runs, first
    assert lake.store.get_batch(first.completed[0]).full_load == ("events_copy",)

    write_ids(spark, src, range(50, 55), cdf=False)  # v1
    write_ids(spark, src, range(55, 60), cdf=False)  # v2
    DeltaTable.forPath(spark, src).optimize().executeCompaction()  # v3: no data change
    write_ids(spark, src, range(60, 65), cdf=False)  # v4
    second = lake.run(spec)
    assert len(second.completed) == 1, second
    assert not second.failed_runs, second
    batch = lake.store.get_batch(second.completed[0])
    assert batch.inputs["events"].mode is ReadMode.APPEND_ONLY
    assert batch.inputs["events"].range == VersionRange(1, 4)
    meta = batch_metadata(lake, "events_copy", batch.batch_id)
    # Three appended files, 15 rows: not the 65-row table, not the compacted file again.
    assert (meta["events/files_read"], meta["events/rows_read"]) == (3, 15)
    assert lake.rows("copy") == source_rows(lake, "events")

    # An UPDATE inside the range: the batch fails loudly, nothing is written or advanced.
    # The error is terminal: `watermark run` attempts it once (although 3 attempts are
    # allowed), exits 1 and prints one message carrying the error's own fix.
    DeltaTable.forPath(spark, src).update("id = 3", {"value": "333"})  # v5
    target_version = latest_local_version(lake.path("copy"))
    spec["max_attempts"] = 3
    failed = lake.cli(spec, "run", "--json")
    assert failed.returncode == 1, failed.stderr
    outcome = json.loads(failed.stdout)
    assert len(outcome["runs"]) == 1, outcome["runs"]
    assert not outcome["runs"][0]["success"], outcome["runs"]
    assert "UpstreamDataChangedError" in outcome["runs"][0]["error"]
    stuck = outcome["stuck"]
    assert "UpstreamDataChangedError" in stuck
    assert "not retried" in stuck
    assert "on_data_change='snapshot'" in stuck
    assert "watermark run --retry" in stuck
    assert "re-execute the batch partition from the UI." not in stuck.split("Fix:")[0]
    assert failed.stderr.count("on_data_change='snapshot'") == 1, failed.stderr
    assert latest_local_version(lake.path("copy")) == target_version
    assert lake.store.committed_versions()["events"] == 4
    open_batch = lake.store.open_batch()
    assert open_batch is not None
    [checkpoint] = lake.store.checkpoints(batch_id=open_batch.batch_id)
    assert checkpoint.status is CheckpointStatus.FAILED
    [stuck_row] = [
        r for r in lake.store.history(batch_id=open_batch.batch_id) if r["event"] == "BATCH_STUCK"
    ]
    assert json.loads(stuck_row["detail"])["terminal"] is True
    # The sensors do not resubmit it on later ticks either.
    again = lake.run(spec)
    assert not again.runs
    assert again.stuck
    assert "UpstreamDataChangedError" in again.stuck

    # The documented fix: read such ranges as a snapshot, then resume the same open batch.
    spec["upstreams"][0]["on_data_change"] = "snapshot"
    resumed = HeadlessRunner(defs_from(spec), lake.instance).run_until_idle(retry=True)
    assert len(resumed.completed) == 1, resumed
    assert not resumed.failed_runs, resumed
    meta = batch_metadata(lake, "events_copy", resumed.completed[0])
    assert meta["events/read_mode"] == "SNAPSHOT"
    assert meta["full_load"] is True
    assert lake.rows("copy") == source_rows(lake, "events")
    assert lake.rows("copy")[3] == 333
    assert lake.store.committed_versions()["events"] == 5


# ------------------------------------------------------------------ first loads


def test_a_new_pipeline_bootstraps_from_a_snapshot_then_follows(lake: Lake) -> None:
    spark, src = lake.spark, lake.path("orders")
    write_ids(spark, src, range(0, 20), cdf=True)
    first_pipe = {
        "name": "orders_copy",
        "upstreams": ["orders"],
        "target": lake.path("copy"),
        "transform": "copy",
    }
    spec = lake.spec([{"name": "orders", "path": src}], [first_pipe])
    lake.run(spec)
    table = DeltaTable.forPath(spark, src)
    table.update("id < 5", {"value": "value + 100"})
    table.delete("id = 7")
    write_ids(spark, src, range(20, 25), cdf=True)
    assert len(lake.run(spec).completed) == 1

    # A second pipeline joins a location that has been running for a while.
    table.update("id = 10", {"value": "-1"})
    late_pipe = {
        "name": "orders_doubled",
        "upstreams": ["orders"],
        "target": lake.path("doubled"),
        "transform": "doubled",
        "cluster_by": ["id"],
    }
    full_pipe = {
        "name": "orders_full",
        "upstreams": ["orders"],
        "target": lake.path("full"),
        "transform": "copy",
        "write": "overwrite",
    }
    spec = lake.spec(spec["upstreams"], [first_pipe, late_pipe, full_pipe])
    joined = lake.run(spec)
    [batch_id] = joined.completed
    batch = lake.store.get_batch(batch_id)
    assert batch.full_load == ("orders_doubled", "orders_full")
    detail = DeltaTable.forPath(spark, lake.path("doubled")).detail().first()
    assert detail is not None
    assert list(detail["clusteringColumns"]) == ["id"]
    assert batch.inputs["orders"].mode is ReadMode.CDF
    assert batch_metadata(lake, "orders_copy", batch_id)["orders/read_mode"] == "CDF"
    assert batch_metadata(lake, "orders_doubled", batch_id)["orders/read_mode"] == "SNAPSHOT"

    # Then it follows incrementally.
    table.delete("id = 11")
    write_ids(spark, src, range(25, 27), cdf=True)
    [next_id] = lake.run(spec).completed
    assert lake.store.get_batch(next_id).full_load == ("orders_full",)  # overwrites each time
    assert batch_metadata(lake, "orders_doubled", next_id)["orders/read_mode"] == "CDF"

    expected = recompute_pipeline(
        spark, registry_from(spec), "orders_doubled", lake.store.committed_versions()
    )
    assert lake.rows("doubled") == {r["id"]: r["value"] for r in expected.collect()}
    assert lake.rows("copy") == source_rows(lake, "orders")
    assert lake.rows("full") == source_rows(lake, "orders")


# ------------------------------------------------------------------ TIMESTAMP windows


def _clicks(folder: Path, name: str, rows: list[tuple[int, datetime | None, datetime]]) -> None:
    folder.mkdir(exist_ok=True)
    table = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "value": pa.array([r[0] * 10 for r in rows], pa.int64()),
            "ts": pa.array([r[1] for r in rows], pa.timestamp("us", tz="UTC")),
            "created": pa.array([r[2] for r in rows], pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(table, folder / name)


def test_timestamp_windows_read_tied_rows_exactly_once(lake: Lake) -> None:
    folder = lake.root / "clicks"
    tie = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    # ids 1 and 2 share the cursor value the first window ends at.
    _clicks(folder, "part-1.parquet", [(1, tie, tie), (2, tie, tie)])
    upstream = {
        "name": "clicks",
        "path": str(folder),
        "mode": "timestamp",
        "format": "parquet",
        "cursor": "ts",
        "cursor_fallback": "created",
        "tie_break": ["id"],
    }
    pipes = [
        {
            "name": "clicks_copy",
            "upstreams": ["clicks"],
            "target": lake.path("copy"),
            "transform": "copy",
        }
    ]
    spec = lake.spec([upstream], pipes)
    [b1] = lake.run(spec).completed
    assert batch_metadata(lake, "clicks_copy", b1)["clicks/rows_read"] == 2
    tie_micros = int(tie.timestamp() * 1_000_000)
    assert lake.store.committed()["clicks"].committed_cursor == (tie_micros, 2)

    # Committed later: a row tied with the boundary (same ts, greater key), a newer row,
    # and a row with no ts, read through its fallback column.
    later = tie + timedelta(minutes=1)
    _clicks(folder, "part-2.parquet", [(3, tie, tie), (4, later, later), (5, None, later)])
    [b2] = lake.run(spec).completed
    assert batch_metadata(lake, "clicks_copy", b2)["clicks/rows_read"] == 3
    copy = lake.table("copy").select("id", "_wm_batch_id").collect()
    assert sorted((r["id"], r["_wm_batch_id"]) for r in copy) == [
        (1, b1),
        (2, b1),
        (3, b2),
        (4, b2),
        (5, b2),
    ]
    window = lake.store.get_batch(b2).inputs["clicks"].window
    assert window is not None
    assert window.start == (tie_micros, 2)
    # Nothing new: no further batch.
    assert lake.run(spec).completed == []


def _delta_clicks(lake: Lake, rows: list[tuple[int, datetime]], mode: str = "append") -> None:
    frame = lake.spark.createDataFrame(
        [(i, i * 10, ts) for i, ts in rows], "id long, value long, ts timestamp"
    )
    frame.coalesce(1).write.format("delta").mode(mode).save(lake.path("clicks"))


def test_delta_cursor_upstream_goes_idle_after_commits_that_add_nothing_past_it(
    lake: Lake,
) -> None:
    """A cursor upstream stored as a Delta table: a late row below the committed position,
    a delete and an OPTIMIZE change the table but add nothing to read. Each plans at most
    one batch, which reads nothing, writes nothing and records the source state, and then
    the location goes idle (it used to plan an empty batch on every tick, forever)."""
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    _delta_clicks(lake, [(i, t0 + timedelta(minutes=i)) for i in range(1, 6)])
    upstream = {
        "name": "clicks",
        "path": lake.path("clicks"),
        "mode": "timestamp",
        "format": "delta",
        "cursor": "ts",
        "tie_break": ["id"],
    }
    pipes = [
        {
            "name": "clicks_copy",
            "upstreams": ["clicks"],
            "target": lake.path("copy"),
            "transform": "copy",
        },
        {
            "name": "clicks_log",
            "upstreams": ["clicks"],
            "target": lake.path("log"),
            "transform": "appended",
            "write": "append",
        },
    ]
    spec = lake.spec([upstream], pipes)
    assert len(lake.run(spec).completed) == 1
    _delta_clicks(lake, [(i, t0 + timedelta(minutes=i)) for i in range(6, 9)])
    assert len(lake.run(spec).completed) == 1
    position = lake.store.committed()["clicks"].committed_cursor
    assert position == (int((t0 + timedelta(minutes=8)).timestamp() * 1_000_000), 8)

    def versions() -> tuple[int | None, int | None]:
        return latest_local_version(lake.path("copy")), latest_local_version(lake.path("log"))

    def commit_that_adds_nothing(what: str) -> None:
        if what == "late row":
            _delta_clicks(lake, [(-1, t0)])  # below the committed position: never read
        elif what == "delete":
            DeltaTable.forPath(lake.spark, lake.path("clicks")).delete(F.col("id") == 3)
        else:
            DeltaTable.forPath(lake.spark, lake.path("clicks")).optimize().executeCompaction()

    for what in ("late row", "delete", "optimize"):
        before = versions()
        report = lake.run(spec)
        assert report.completed == [], f"nothing changed yet, but {report.completed} ran"
        commit_that_adds_nothing(what)
        report = lake.run(spec)
        assert report.ticks < 10, (what, report)
        assert not report.failed_runs, (what, report)
        assert len(report.completed) <= 1, f"{what}: batches {report.completed}"
        for batch_id in report.completed:
            for pipeline in ("clicks_copy", "clicks_log"):
                meta = batch_metadata(lake, pipeline, batch_id)
                assert meta["rows_read"] == 0, (what, meta)
                assert meta["rows_written"] == 0, (what, meta)
        assert lake.run(spec).completed == [], f"{what}: not idle"
        assert versions() == before, f"{what}: a target got an empty commit"
        assert lake.store.committed()["clicks"].committed_cursor == position

    # Rows past the position are still read, once.
    _delta_clicks(lake, [(9, t0 + timedelta(minutes=9))])
    [last] = lake.run(spec).completed
    assert batch_metadata(lake, "clicks_copy", last)["rows_read"] == 1
    log_ids = [r["id"] for r in lake.table("log").select("id").collect()]
    assert sorted(log_ids) == list(range(1, 10))
    assert sorted(lake.rows("copy")) == list(range(1, 10))


def test_timestamp_lag_holds_back_recent_rows_until_they_pass_it(lake: Lake) -> None:
    folder = lake.root / "clicks"
    now = datetime.now(UTC).replace(microsecond=0)
    old, recent = now - timedelta(hours=2), now - timedelta(minutes=30)
    _clicks(folder, "part-1.parquet", [(1, old, old), (2, recent, recent)])
    upstream = CursorUpstream(
        name="clicks",
        path=str(folder),
        format="parquet",
        cursor="ts",
        tie_break=("id",),
        lag_seconds=3600,
    )
    pins: list[tuple] = []

    def read(window: CursorWindow, at: datetime) -> list[int]:
        def pin(end, recheck_at):
            pins.append((end, recheck_at))
            return CursorWindow(window.start, end if end is not None else window.start)

        planned = PlannedInput("clicks", ReadMode.TIMESTAMP, None, None, window)
        given = UpstreamInput.pinned(lake.spark, upstream, planned, pin=pin, now=at)
        assert given.window is not None
        window_read.append(given.window)
        return sorted(r["id"] for r in given.changes.collect())

    window_read: list[CursorWindow] = []
    assert read(CursorWindow(None), now) == [1]  # id 2 is inside the lag
    end, recheck_at = pins[-1]
    assert recheck_at == int((recent + timedelta(hours=1)).timestamp() * 1_000_000)
    state = cursor_state("files-v1", recheck_at)
    assert not cursor_has_new_data(state, "files-v1", now + timedelta(minutes=10))
    assert cursor_has_new_data(state, "files-v1", now + timedelta(minutes=31))

    # A slow writer commits a row older than id 2, still inside the lag.
    _clicks(folder, "part-2.parquet", [(3, now - timedelta(minutes=40), now)])
    assert read(CursorWindow(end), now + timedelta(minutes=31)) == [2, 3]
    assert read(CursorWindow(window_read[-1].end), now + timedelta(minutes=31)) == []


# ------------------------------------------------------------------ targets


def test_an_append_target_retried_after_a_crash_holds_each_row_once(lake: Lake) -> None:
    spark, src = lake.spark, lake.path("log")
    write_ids(spark, src, range(0, 10), cdf=False)
    pipes = [
        {
            "name": "log_copy",
            "upstreams": ["log"],
            "target": lake.path("copy"),
            "transform": "appended",
            "write": "append",
            "keys": [],
            "partition_by": ["bucket"],
        }
    ]
    spec = lake.spec([{"name": "log", "path": src}], pipes)
    lake.run(spec)
    write_ids(spark, src, range(10, 15), cdf=False)
    runner = HeadlessRunner(defs_from(spec), lake.instance)
    runner.tick("watermark_coordinator")  # plans batch 2 (its run is not executed here)
    batch = lake.store.open_batch()
    assert batch is not None

    # A worker appends batch 2 and is killed before it records its checkpoint.
    spec_file = write_spec(lake.root / "spec.json", spec)
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.run_pipeline",
            str(spec_file),
            "log_copy",
            batch.batch_id,
        ],
        env={**os.environ, "WATERMARK_FAULTS": "after_target_commit", "PYTHONPATH": str(REPO)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    assert lake.table("copy").count() == 15  # the append landed

    report = runner.run_until_idle()
    assert report.completed == [batch.batch_id]
    assert not report.failed_runs
    assert batch_metadata(lake, "log_copy", batch.batch_id)["already_applied"] is True
    ids = [r["id"] for r in lake.table("copy").collect()]
    assert sorted(ids) == list(range(15))
    detail = DeltaTable.forPath(lake.spark, lake.path("copy")).detail().first()
    assert detail is not None
    assert list(detail["partitionColumns"]) == ["bucket"]


def test_a_replay_that_could_only_reload_is_refused_and_writes_nothing(lake: Lake) -> None:
    """Issue 41, sequence 1: a merge pipeline reads an append-only upstream with
    on_data_change='snapshot'; an UPDATE at v2 was applied by reloading the target. A replay
    of [1, 3] would read that range as a snapshot, and the reload at the replay's old
    position overwrote the rows of the batches after it (v4) with `watermark replay` exiting
    0. Now it is refused before anything is recorded, by the command line and, for a replay
    batch that reaches a run anyway, by the run; a replay into a missing target too."""
    spark, src = lake.spark, lake.path("events")
    write_ids(spark, src, range(0, 5), cdf=False)  # v0: batch 1 loads it
    pipes = [
        {"name": "events_copy", "upstreams": ["events"], "target": lake.path("copy")}
        | {"transform": "copy"}
    ]
    spec = lake.spec([{"name": "events", "path": src, "on_data_change": "snapshot"}], pipes)
    lake.run(spec)
    write_ids(spark, src, range(5, 8), cdf=False)  # v1
    lake.run(spec)
    DeltaTable.forPath(spark, src).update("id = 3", {"value": "333"})  # v2: a reload
    lake.run(spec)
    write_ids(spark, src, range(8, 10), cdf=False)  # v3
    lake.run(spec)
    write_ids(spark, src, range(10, 12), cdf=False)  # v4
    lake.run(spec)
    assert lake.store.committed_versions()["events"] == 4
    before = lake.rows("copy")
    assert before == source_rows(lake, "events")
    target_version = latest_local_version(lake.path("copy"))
    tables = ("batches", "committed_watermarks", "pipeline_checkpoints", "history")
    versions = {t: lake.store.table_version(t) for t in tables}

    args = ("replay", "-t", "events", "--from-version", "1", "--to-version", "3", "--yes")
    out = lake.cli(spec, *args, "--reason", "late fix")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "commit(s) v2 UPDATE in the range [1, 3] update or delete rows" in out.stderr
    assert "never reloads or creates one" in out.stderr
    assert "Nothing was written" in out.stderr
    assert {t: lake.store.table_version(t) for t in tables} == versions
    assert latest_local_version(lake.path("copy")) == target_version

    # A replay batch that reaches a run all the same (recorded by hand, as a backfill of
    # an older version would) fails there, before the write.
    replay = lake.store.create_range_replay(
        "events",
        VersionRange(1, 3),
        mode=ReadMode.APPEND_ONLY,
        pipelines=["events_copy"],
        all_upstreams=["events"],
        actor="test",
        reason="late fix",
    )
    with pytest.raises(ReplayRefusedError, match=r"upstream\(s\) \['events'\] would be read as a"):
        execute_pipeline(
            spark=spark,
            store=lake.store,
            registry=registry_from(spec),
            pipeline_name="events_copy",
            batch_id=replay.batch_id,
        )
    assert lake.rows("copy") == before
    assert latest_local_version(lake.path("copy")) == target_version
    lake.store.set_batch_status(replay.batch_id, BatchStatus.FAILED, actor="test")

    # No replay creates a target.
    shutil.rmtree(lake.path("copy"))
    args = ("replay", "-t", "events", "--from-version", "3", "--to-version", "4", "--yes")
    out = lake.cli(spec, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"its target {lake.path('copy')} does not exist" in out.stderr
    assert not os.path.exists(lake.path("copy"))


def test_replaying_an_older_batch_into_a_merge_target_leaves_newer_rows(lake: Lake) -> None:
    spark, src = lake.spark, lake.path("prices")
    write_ids(spark, src, range(0, 6), cdf=True)
    pipes = [
        {
            "name": "prices_copy",
            "upstreams": ["prices"],
            "target": lake.path("copy"),
            "transform": "copy",
        }
    ]
    spec = lake.spec([{"name": "prices", "path": src}], pipes)
    lake.run(spec)
    table = DeltaTable.forPath(spark, src)
    table.update("id IN (1, 2)", {"value": "100"})  # v1: batch 2
    [b2] = lake.run(spec).completed
    table.update("id = 1", {"value": "200"})  # v2: batch 3
    lake.run(spec)
    before = lake.rows("copy")
    assert (before[1], before[2]) == (200, 100)

    registry = registry_from(spec)
    replay = lake.store.create_range_replay(
        "prices",
        VersionRange(1, 1),
        mode=ReadMode.CDF,
        pipelines=["prices_copy"],
        all_upstreams=["prices"],
        actor="test",
        reason="late correction",
    )
    assert replay.order_seq == lake.store.get_batch(b2).seq
    outcome = execute_pipeline(
        spark=spark,
        store=lake.store,
        registry=registry,
        pipeline_name="prices_copy",
        batch_id=replay.batch_id,
    )
    assert outcome.rows_read > 0
    # id 1 was rewritten by batch 3: the replay of batch 2's range must not take it back.
    assert lake.rows("copy") == before
    assert lake.store.committed_versions()["prices"] == 2
    lake.store.set_batch_status(replay.batch_id, BatchStatus.COMPLETED, actor="test")

    # The same through the command line. Bad requests are refused and write nothing.
    tables = ("batches", "committed_watermarks", "pipeline_checkpoints", "history")
    versions = {t: lake.store.table_version(t) for t in tables}
    for args, message in (
        (("--from-version", "1", "--to-version", "5"), "beyond the committed watermark"),
        (("--from-version", "2", "--to-version", "1"), "is before --from-version"),
        (("--from-version", "-1", "--to-version", "1"), "is negative"),
        (("--from-version", "x", "--to-version", "1"), "is not a version"),
        (("--from-version", "1", "--to-version", "1", "-p", "nope"), "do not read"),
        (("--from-version", "1", "--to-version", "1"), "stdin is not a terminal"),
    ):
        out = lake.cli(spec, "replay", "-t", "prices", *args)
        assert out.returncode == 2, (args, out.stderr)
        assert message in out.stderr, (args, out.stderr)
    assert {t: lake.store.table_version(t) for t in tables} == versions

    out = lake.cli(
        spec,
        "replay",
        "-t",
        "prices",
        "--from-version",
        "1",
        "--to-version",
        "1",
        "--yes",
        "--reason",
        "late correction",
        "--json",
        process=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == "COMPLETED"
    assert result["written_at_position_of"] == replay.order_seq
    assert lake.rows("copy") == before
    assert lake.store.committed_versions()["prices"] == 2
    assert lake.store.get_batch(result["batch_id"]).kind.value == "REPLAY"
    # The pipeline's check is evaluated after the replay (the batch job runs none), in a run
    # of its own tagged with the replay batch, for the replay's materialization: the UI
    # shows it evaluated, not "Not evaluated".
    [newest] = lake.instance.fetch_materializations(AssetKey("prices_copy"), limit=1).records
    assert newest.partition_key == result["batch_id"]
    key = AssetCheckKey(AssetKey("prices_copy"), STUCK_CHECK)
    record = lake.instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    run = lake.instance.get_run_by_id(record.run_id)
    assert run is not None
    assert run.tags[REPLAY_TAG] == result["batch_id"]
    assert record.evaluation is not None
    assert record.evaluation.passed, record.evaluation
    assert asyncio.run(record.targets_latest_materialization(LoadingContextForTest(lake.instance)))


# ------------------------------------------------------------------ loud failures (I6)


def _vacuum_change_files(lake: Lake, src: str) -> None:
    vacuuming = lake.spark.newSession()  # the settings below for this VACUUM alone
    vacuuming.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    # VACUUM lists the table in as many tasks as this says (10,000 by default: 100 s of
    # this test's 110 under -n 2, against under a second with 2).
    vacuuming.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "2")
    DeltaTable.forPath(vacuuming, src).vacuum(0)


def _clean_log(lake: Lake, src: str) -> None:
    """What log cleanup does: a checkpoint, then the older commit files are removed."""
    write_ids(lake.spark, src, range(100, 101), cdf=True)
    RsDeltaTable(src).create_checkpoint()
    for version in (0, 1):
        Path(src, "_delta_log", f"{version:020d}.json").unlink()


def _cdf_off_then_on(lake: Lake, src: str) -> None:
    table = DeltaTable.forPath(lake.spark, src)
    lake.spark.sql(
        f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)"
    )
    table.update("id = 2", {"value": "-2"})
    lake.spark.sql(
        f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    table.update("id = 3", {"value": "-3"})


def _retype_column(lake: Lake, src: str) -> None:
    (
        lake.table("up")
        .withColumn("value", F.col("value").cast("string"))
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .save(src)
    )


def _recreate(lake: Lake, src: str) -> None:
    shutil.rmtree(src)
    for chunk in (range(0, 4), range(4, 8), range(8, 12), range(12, 16)):
        write_ids(lake.spark, src, chunk, cdf=True)


# case -> (how to break the range, the error, a phrase of its message, break after planning)
BREAKS = {
    # Gone before planning is refused at planning (see test_blocked_upstreams and
    # test_blocked_by_spark); here they went while the batch was open.
    "vacuumed_change_files": (_vacuum_change_files, "UpstreamUnreadableError", "VACUUM", True),
    "log_cleaned_up": (_clean_log, "UpstreamUnreadableError", "no longer in the Delta log", True),
    "cdf_off_inside_range": (
        _cdf_off_then_on,
        "UpstreamUnreadableError",
        "change data feed was off",
        False,
    ),
    "incompatible_schema": (_retype_column, "UpstreamSchemaChangedError", "changed type", False),
    # Recreated before planning is refused at planning (see test_sensors); here the batch
    # was planned on the old table.
    "dropped_and_recreated": (_recreate, "UpstreamRecreatedError", "recreated", True),
}


# The cases whose recovery is told end to end: each reloads from a snapshot another kind of
# table gives (a cleaned-up log read from its checkpoint, a column of a new type, a new
# table). The other two break only change files, and their tables' snapshots read as any.
RECOVERED = {"log_cleaned_up", "incompatible_schema", "dropped_and_recreated"}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_an_unreadable_range_fails_loudly_and_reset_recovers(lake: Lake, case: str) -> None:
    spark, src = lake.spark, lake.path("up")
    breaker, error_name, phrase, after_planning = BREAKS[case]
    write_ids(spark, src, range(0, 8), cdf=True)
    pipes = [
        {"name": "up_copy", "upstreams": ["up"], "target": lake.path("copy"), "transform": "copy"}
    ]
    spec = lake.spec([{"name": "up", "path": src}], pipes)
    lake.run(spec)
    DeltaTable.forPath(spark, src).update("id = 1", {"value": "-1"})  # v1: change files
    runner = HeadlessRunner(defs_from(spec), lake.instance)
    if not after_planning:
        breaker(lake, src)
    runner.tick("watermark_coordinator")  # plans the batch over the changes
    if after_planning:
        breaker(lake, src)
    target_version = latest_local_version(lake.path("copy"))
    committed = lake.store.committed_versions()

    report = runner.run_until_idle()
    assert not report.completed
    assert report.failed_runs, report
    error = report.failed_runs[0].error or ""
    assert error_name in error, error
    assert phrase in error, error
    assert "watermark reset -t up" in error, error
    assert "An error occurred while calling" not in error, error  # no py4j noise
    if case == "vacuumed_change_files":
        assert "missing file: file:" in error, error
        assert "_change_data/cdc-" in error, error
    assert latest_local_version(lake.path("copy")) == target_version
    assert lake.store.committed_versions() == committed
    if case not in RECOVERED:
        return

    # The documented recovery: reset the upstream, which abandons the open batch; the
    # pipeline reloads from a snapshot and its target is right again.
    done = lake.cli(spec, "reset", "-t", "up", "--force", "--yes", "--reason", "range lost")
    assert done.returncode == 0, done.stdout + done.stderr
    recovered = lake.run(spec)
    assert len(recovered.completed) == 1, recovered
    assert not recovered.failed_runs, recovered
    assert lake.store.get_batch(recovered.completed[0]).full_load == ("up_copy",)
    expected = {r["id"]: r["value"] for r in lake.table("up").select("id", "value").collect()}
    assert {k: str(v) for k, v in lake.rows("copy").items()} == {
        k: str(v) for k, v in expected.items()
    }
    history = [h["event"] for h in lake.store.history(upstream="up")]
    assert "WATERMARK_RESET" in history


def test_additive_nullable_columns_pass_through(lake: Lake) -> None:
    spark, src = lake.spark, lake.path("up")
    write_ids(spark, src, range(0, 4), cdf=True)
    pipes = [
        {"name": "up_copy", "upstreams": ["up"], "target": lake.path("copy"), "transform": "copy"}
    ]
    spec = lake.spec([{"name": "up", "path": src}], pipes)
    lake.run(spec)
    (
        id_frame(spark, range(4, 6))
        .withColumn("note", F.lit("new"))
        .write.format("delta")
        .mode("append")
        .option("mergeSchema", "true")
        .save(src)
    )
    report = lake.run(spec)
    assert len(report.completed) == 1, report
    assert not report.failed_runs, report
    assert set(lake.rows("copy")) == set(range(6))


def test_a_missing_upstream_is_reported_at_observation_and_nothing_is_planned(lake: Lake) -> None:
    pipes = [
        {
            "name": "ghost_copy",
            "upstreams": ["ghost"],
            "target": lake.path("copy"),
            "transform": "copy",
        }
    ]
    spec = lake.spec([{"name": "ghost", "path": lake.path("nowhere")}], pipes)
    report = lake.run(spec)
    assert report.completed == []
    assert report.runs == []
    assert lake.store.batches() == []
    out = lake.cli(spec, "plan", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    assert "not a readable Delta table" in json.dumps(json.loads(out.stdout))


def test_a_reload_that_changes_the_schema_keeps_the_clustering(lake: Lake) -> None:
    from watermark_dagster.config.pipeline import Pipeline
    from watermark_dagster.write.targets import write_target

    target = lake.path("clustered")
    pipe = Pipeline(
        name="p",
        upstreams=("u",),
        target=target,
        keys=("id",),
        transform=lambda b: b,
        cluster_by=("id",),
    )  # type: ignore[arg-type]
    first = lake.spark.createDataFrame([(1, 10)], "id long, value long")
    write_target(lake.spark, first, pipe, batch_id="b000001", write_seq=1, full_load=True)
    retyped = lake.spark.createDataFrame([(2, "twenty")], "id long, value string")
    write_target(lake.spark, retyped, pipe, batch_id="b000002", write_seq=2, full_load=True)
    detail = DeltaTable.forPath(lake.spark, target).detail().first()
    assert detail is not None
    assert list(detail["clusteringColumns"]) == ["id"]
    assert [(r["id"], r["value"]) for r in lake.table("clustered").collect()] == [(2, "twenty")]


def _latest_clicks(batch: BatchContext) -> DataFrame:
    return batch["clicks"].net_changes(["id"]).select("id", "value")


def _all_clicks(batch: BatchContext) -> DataFrame:
    return batch["clicks"].changes.select("id", "value")


def test_every_reader_of_a_batch_sees_a_delta_cursor_source_as_the_batch_planned_it(
    lake: Lake,
) -> None:
    """Two pipelines read one batch of a Delta cursor upstream; between their reads (a
    crash and a retry, or just the next run) a late row lands inside the window the first
    reader pinned. Both must read the same rows (I3), so neither takes the late row: the
    first load (a snapshot up to the window's end) and a later window (start, end] alike.
    Model seed 702: the append target kept a late row its merge sibling never saw."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    path = lake.path("clicks")

    def add(rows: list[tuple[int, datetime]]) -> None:
        write_deltalake(
            path,
            pa.table(
                {
                    "id": pa.array([i for i, _ in rows], pa.int64()),
                    "value": pa.array([i * 10 for i, _ in rows], pa.int64()),
                    "ts": pa.array([ts for _, ts in rows], pa.timestamp("us", tz="UTC")),
                }
            ),
            mode="append",
        )

    add([(i, t0 + timedelta(minutes=i)) for i in (1, 2, 3)])
    registry = Registry(
        upstreams=[CursorUpstream(name="clicks", path=path, cursor="ts", tie_break=("id",))],
        pipelines=[
            Pipeline(
                name="clicks_copy",
                upstreams=("clicks",),
                target=lake.path("copy"),
                keys=("id",),
                transform=_latest_clicks,
            ),
            Pipeline(
                name="clicks_log",
                upstreams=("clicks",),
                target=lake.path("log"),
                keys=(),
                transform=_all_clicks,
                write="append",
            ),
        ],
    )
    store, observer = lake.store, Observer()

    def batch_with_late_row(late: tuple[int, datetime]) -> str:
        look = look_before_planning(registry, observer, store, actor="test")
        batch, _ = plan_next(store, look, actor="test")
        assert batch is not None
        run = {"spark": lake.spark, "store": store, "registry": registry}
        execute_pipeline(**run, pipeline_name="clicks_copy", batch_id=batch.batch_id)
        add([late])  # committed after the window was pinned, inside it
        execute_pipeline(**run, pipeline_name="clicks_log", batch_id=batch.batch_id)
        finalize_batch(store, store.get_batch(batch.batch_id), registry=registry, actor="test")
        return batch.batch_id

    # The first load reads everything up to the pinned end: a row far below it is late.
    first = batch_with_late_row((0, t0 - timedelta(days=1)))
    assert store.get_batch(first).full_load == ("clicks_copy", "clicks_log")
    assert sorted(lake.rows("log")) == sorted(lake.rows("copy")) == [1, 2, 3]

    # A later window (t3, t5]: a row at t4 + 30 s lands inside it after the pin.
    add([(i, t0 + timedelta(minutes=i)) for i in (4, 5)])
    batch_with_late_row((6, t0 + timedelta(minutes=4, seconds=30)))
    assert sorted(lake.rows("log")) == sorted(lake.rows("copy")) == [1, 2, 3, 4, 5]


def test_a_replay_reads_a_delta_cursor_source_as_its_origin_batch_did(lake: Lake) -> None:
    """Issue 41 (I3): a replay of ``orders``' range holds the Delta cursor upstream
    ``clicks`` where the replayed batch pinned it. It read the cursor source at its latest
    version, so a late click committed after that batch, inside its window, changed what
    the replay computed and it rewrote the order's row. It reads the source at the version
    the batch planned it at now: the replay changes nothing."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    clicks, orders = lake.path("clicks"), lake.path("orders")

    def click(order_id: int, at: datetime) -> None:
        rows = {"id": [order_id], "ts": [at]}
        types = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
        write_deltalake(clicks, pa.table(rows, schema=types), mode="append")

    def with_clicks(batch: BatchContext) -> DataFrame:
        counted = batch["clicks"].snapshot.groupBy("id").agg(F.count("*").alias("clicks"))
        changed = batch["orders"].net_changes(["id"]).select("id", "value")
        return changed.join(counted, "id", "left").select(
            "id", (F.col("value") + 1000 * F.coalesce(F.col("clicks"), F.lit(0))).alias("value")
        )

    for i in (1, 2, 3):
        click(i, t0 + timedelta(minutes=i))
    write_ids(lake.spark, orders, range(1, 4), cdf=True)
    registry = Registry(
        upstreams=[
            DeltaUpstream(name="orders", path=orders),
            CursorUpstream(name="clicks", path=clicks, cursor="ts", tie_break=("id",)),
        ],
        pipelines=[
            Pipeline(
                name="orders_clicks",
                upstreams=("orders", "clicks"),
                target=lake.path("target"),
                keys=("id",),
                transform=with_clicks,
            )
        ],
    )
    store, observer = lake.store, Observer()
    run = {"spark": lake.spark, "store": store, "registry": registry}

    def batch() -> str:
        look = look_before_planning(registry, observer, store, actor="test")
        planned, _ = plan_next(store, look, actor="test")
        assert planned is not None
        execute_pipeline(**run, pipeline_name="orders_clicks", batch_id=planned.batch_id)
        finalize_batch(store, store.get_batch(planned.batch_id), registry=registry, actor="test")
        return planned.batch_id

    batch()  # first load
    DeltaTable.forPath(lake.spark, orders).update("id = 1", {"value": "10"})
    click(1, t0 + timedelta(minutes=4))
    second = store.get_batch(batch())
    before = lake.rows("target")
    assert before[1] == 10 + 2000  # two clicks on order 1 up to the window's end
    click(1, t0 + timedelta(minutes=3, seconds=30))  # late: inside the pinned window

    orders_range = second.inputs["orders"].range
    assert orders_range is not None
    replay = store.create_range_replay(
        "orders",
        orders_range,
        mode=ReadMode.CDF,
        pipelines=["orders_clicks"],
        all_upstreams=["orders", "clicks"],
        actor="test",
        reason="late fix",
    )
    assert replay.source_states["clicks"] == second.source_states["clicks"]
    execute_pipeline(**run, pipeline_name="orders_clicks", batch_id=replay.batch_id)
    assert lake.rows("target") == before


def test_a_vacuumed_delta_cursor_source_fails_naming_the_upstream_version_and_fix(
    lake: Lake,
) -> None:
    """A batch pins a Delta cursor source at the version it was planned at (I3). When the
    source is rewritten and vacuumed before the batch runs, that version's files are gone:
    the run fails with the I6 error naming the upstream, the version and the fix, not
    Spark's raw file error, and nothing is written."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    path = lake.path("clicks")

    def rows(ids: list[int]) -> pa.Table:
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "value": pa.array([i * 10 for i in ids], pa.int64()),
                "ts": pa.array(
                    [t0 + timedelta(minutes=i) for i in ids], pa.timestamp("us", tz="UTC")
                ),
            }
        )

    write_deltalake(path, rows([1, 2, 3]))
    registry = Registry(
        upstreams=[CursorUpstream(name="clicks", path=path, cursor="ts", tie_break=("id",))],
        pipelines=[
            Pipeline(
                name="clicks_copy",
                upstreams=("clicks",),
                target=lake.path("copy"),
                keys=("id",),
                transform=_latest_clicks,
            )
        ],
    )
    store = lake.store
    look = look_before_planning(registry, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None
    pinned_at = RsDeltaTable(path).version()
    write_deltalake(path, rows([4, 5]), mode="overwrite")  # the pinned files are removed...
    RsDeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(UpstreamUnreadableError) as caught:  # ...and vacuumed
        execute_pipeline(
            spark=lake.spark,
            store=store,
            registry=registry,
            pipeline_name="clicks_copy",
            batch_id=batch.batch_id,
        )
    message = str(caught.value)
    assert message.startswith("Upstream 'clicks'"), message
    assert f"version {pinned_at}" in message, message
    assert "files the range needs were removed (VACUUM)" in message, message
    assert "Fix: run `watermark reset -t clicks --force`" in message, message
    assert not Path(lake.path("copy")).exists()  # nothing written
