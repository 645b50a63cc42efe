"""The watermark store on real delta-rs tables: atomic plans, exactly-once advances, races."""

import json
import multiprocessing
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.support.processes import spawn_pool
from tests.support.store_races import advance_at
from watermark_dagster.core.faults import SimulatedCrash, simulate_crash_at
from watermark_dagster.core.finalizing import AdvanceDecision
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.core.ranges import CursorWindow, ReadMode
from watermark_dagster.core.records import BatchStatus, CheckpointStatus, WatermarkHow
from watermark_dagster.errors import BatchStateError, WatermarkGapError, WatermarkRegressionError
from watermark_dagster.store import ReadOnlyWatermarkStore, WatermarkStore, schema

PIPELINES = {"pipeline_a": ["up1", "up2"], "pipeline_b": ["up2", "up3"]}


def _positions(up1: int = 3, up2: int = 4, up3: int = 5) -> list[UpstreamPosition]:
    return [
        UpstreamPosition("up1", up1, None),
        UpstreamPosition("up2", up2, None),
        UpstreamPosition("up3", up3, None),
    ]


def test_tables_are_created_on_first_use_and_readable_as_delta(tmp_path: Path) -> None:
    store = WatermarkStore(tmp_path / "control")
    assert store.committed() == {}
    for name in ("batches", "committed_watermarks", "pipeline_checkpoints", "history"):
        assert DeltaTable(str(tmp_path / "control" / name)).version() == 0


def test_batch_is_one_commit_and_an_open_batch_is_not_replanned(tmp_path: Path) -> None:
    store = WatermarkStore(tmp_path)
    before = store.table_version("batches")
    batch, created = store.create_batch(_positions(), PIPELINES, actor="test")
    assert created
    assert batch is not None
    assert store.table_version("batches") == before + 1  # all upstream rows, one commit
    assert batch.batch_id == "b000001"
    assert {u: str(i.range) for u, i in batch.inputs.items()} == {
        "up1": "[0, 3]",
        "up2": "[0, 4]",
        "up3": "[0, 5]",
    }
    again, created_again = store.create_batch(_positions(9, 9, 9), PIPELINES, actor="test")
    assert not created_again
    assert again == batch  # the open batch, unchanged: ranges are immutable (I3)
    assert store.table_version("batches") == before + 1


def test_advance_is_contiguous_idempotent_and_completes(tmp_path: Path) -> None:
    store = WatermarkStore(tmp_path)
    batch, _ = store.create_batch(_positions(), PIPELINES, actor="test")
    assert batch is not None
    with pytest.raises(BatchStateError, match="not advanced"):
        store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="test")
    for upstream in ("up1", "up2", "up3"):
        assert store.advance(batch, upstream, actor="test") is AdvanceDecision.ADVANCE
    # A finalizer that died after advancing repeats the step: nothing moves twice.
    version = store.table_version("committed_watermarks")
    assert store.advance(batch, "up1", actor="test") is AdvanceDecision.ALREADY_DONE
    assert store.table_version("committed_watermarks") == version
    assert store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="test")
    assert store.open_batch() is None
    assert store.committed_versions() == {"up1": 3, "up2": 4, "up3": 5}

    nxt, created = store.create_batch(_positions(up1=6), PIPELINES, actor="test")
    assert created
    assert nxt is not None
    assert str(nxt.inputs["up1"].range) == "[4, 6]"
    assert nxt.inputs["up2"].range is None
    assert nxt.inputs["up2"].snapshot_version == 4
    assert nxt.pipelines == ("pipeline_a",)
    events = [h["event"] for h in store.history()]
    assert events.count("WATERMARK_ADVANCED") == 3
    assert events.count("BATCH_PLANNED") == 2


def test_replaying_an_old_advance_never_regresses(tmp_path: Path) -> None:
    store = WatermarkStore(tmp_path)
    batch, _ = store.create_batch(_positions(), PIPELINES, actor="test")
    assert batch is not None
    for upstream in ("up1", "up2", "up3"):
        store.advance(batch, upstream, actor="test")
    store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="test")
    nxt, _ = store.create_batch(_positions(up1=9), PIPELINES, actor="test")
    assert nxt is not None
    store.advance(nxt, "up1", actor="test")
    assert store.committed_versions()["up1"] == 9
    versions = store.table_version("committed_watermarks")
    with pytest.raises(WatermarkRegressionError, match="backwards"):
        store.advance(batch, "up1", actor="test")  # batch 1 ended at 3: would move 9 -> 3
    assert store.table_version("committed_watermarks") == versions
    assert store.committed_versions()["up1"] == 9


def test_gap_is_refused(tmp_path: Path) -> None:
    store = WatermarkStore(tmp_path)
    batch, _ = store.create_batch(_positions(), PIPELINES, actor="test")
    assert batch is not None
    # Someone moved up1's watermark back by hand while the batch was open.
    from dataclasses import replace

    from watermark_dagster.core.ranges import VersionRange

    shifted = replace(
        batch,
        inputs={**batch.inputs, "up1": replace(batch.inputs["up1"], range=VersionRange(2, 3))},
    )
    with pytest.raises(WatermarkGapError, match="skip versions 0..1"):
        store.advance(shifted, "up1", actor="test")
    assert store.committed_versions() == {}


def test_checkpoint_attempts(tmp_path: Path) -> None:
    store = WatermarkStore(tmp_path)
    assert store.begin_checkpoint("p", "b000001", run_id="r1") == 1
    store.finish_checkpoint("p", "b000001", 1, CheckpointStatus.FAILED, error="boom")
    assert store.begin_checkpoint("p", "b000001", run_id="r2") == 2
    store.finish_checkpoint(
        "p", "b000001", 2, CheckpointStatus.SUCCESS, rows_read=3, rows_written=2
    )
    got = [(c.attempt, c.status, c.error, c.rows_written) for c in store.checkpoints()]
    assert got == [
        (1, CheckpointStatus.FAILED, "boom", None),
        (2, CheckpointStatus.SUCCESS, None, 2),
    ]


def _history_table_rows(root: Path, event: str) -> list[dict]:
    """The rows of ``event`` the ``history`` Delta table itself holds (not the store's view)."""
    rows = DeltaTable(str(root / "history")).to_pyarrow_table().to_pylist()
    return [r for r in rows if r["event"] == event]


def test_a_run_closes_with_one_commit_that_holds_its_history_row(tmp_path: Path) -> None:
    """An attempt's outcome and its history row are one commit of pipeline_checkpoints:
    history is read with the row from there, and the batch's advance copies it into the
    history table once, however often the advance is repeated."""
    store = WatermarkStore(tmp_path)
    batch, _ = store.create_batch(_positions(), PIPELINES, actor="test")
    assert batch is not None
    bid = batch.batch_id
    assert store.begin_checkpoint("pipeline_a", bid, run_id="r1") == 1
    store.finish_checkpoint(
        "pipeline_a",
        bid,
        1,
        CheckpointStatus.FAILED,
        error="boom",
        actor="r1",
        detail={"attempt": 1, "error": "boom"},
    )
    for pipeline in PIPELINES:
        attempt = store.begin_checkpoint(pipeline, bid, run_id="r2")
        checkpoints, history = (store.table_version(t) for t in ("pipeline_checkpoints", "history"))
        store.finish_checkpoint(
            pipeline,
            bid,
            attempt,
            CheckpointStatus.SUCCESS,
            rows_read=3,
            rows_written=2,
            actor="r2",
            detail={"attempt": attempt, "rows_read": 3, "rows_written": 2},
        )
        assert store.table_version("pipeline_checkpoints") == checkpoints + 1
        assert store.table_version("history") == history  # no commit of its own

    def runs(rows: list[dict]) -> list[tuple]:
        return sorted(
            (r["event"], r["pipeline"], r["actor"], json.loads(r["detail"])["attempt"])
            for r in rows
            if r["event"].startswith("PIPELINE_")
        )

    expected = [
        ("PIPELINE_FAILED", "pipeline_a", "r1", 1),
        ("PIPELINE_SUCCEEDED", "pipeline_a", "r2", 2),
        ("PIPELINE_SUCCEEDED", "pipeline_b", "r2", 1),
    ]
    reader = ReadOnlyWatermarkStore(tmp_path)
    for view in (store, reader):
        assert runs(view.history()) == expected
        assert runs(view.history(batch_id=bid)) == expected
        assert runs(view.history(limit=50)) == expected
        assert runs(view.history(upstream="up1")) == []  # attempts name no upstream
    newest = store.history(limit=2)
    assert [r["event"] for r in newest] == ["PIPELINE_SUCCEEDED", "PIPELINE_SUCCEEDED"]
    assert _history_table_rows(tmp_path, "PIPELINE_SUCCEEDED") == []

    for upstream in ("up1", "up2", "up3"):
        store.advance(batch, upstream, actor="test")
        store.advance(batch, upstream, actor="test")  # a finalizer's repeat copies nothing
    copied = _history_table_rows(tmp_path, "PIPELINE_SUCCEEDED")
    copied += _history_table_rows(tmp_path, "PIPELINE_FAILED")
    assert runs(copied) == expected  # each once
    assert runs(store.history()) == expected  # read once, from history or the checkpoint
    assert runs(store.history(batch_id=bid)) == expected


# ------------------------------------------------------------------ races between processes


def _plan_at(root: str, start_at: float, latest: int) -> tuple[str | None, bool]:
    store = WatermarkStore(root)
    store.ensure_tables()
    time.sleep(max(0.0, start_at - time.time()))
    batch, created = store.create_batch(
        _positions(latest, latest, latest), PIPELINES, actor=f"proc-{latest}"
    )
    return (batch.batch_id if batch else None), created


def _checkpoint_at(root: str, start_at: float, pipeline: str) -> int:
    store = WatermarkStore(root)
    store.ensure_tables()
    time.sleep(max(0.0, start_at - time.time()))
    attempt = store.begin_checkpoint(pipeline, "b000001", run_id=pipeline)
    store.finish_checkpoint(pipeline, "b000001", attempt, CheckpointStatus.SUCCESS, rows_read=1)
    return attempt


def _flush_at(root: str, start_at: float) -> int:
    store = WatermarkStore(root)
    store.ensure_tables()
    time.sleep(max(0.0, start_at - time.time()))
    return store.flush_pending_history()


@pytest.fixture(scope="module")
def pool():
    with spawn_pool(4) as p:
        yield p


def test_concurrent_planners_create_one_batch(tmp_path: Path, pool) -> None:
    root = str(tmp_path)
    WatermarkStore(root).ensure_tables()
    start = time.time() + 1.5
    results = pool.starmap(_plan_at, [(root, start, 10 + i) for i in range(4)])
    assert sum(created for _, created in results) == 1, results
    assert {bid for bid, _ in results} == {"b000001"}
    store = WatermarkStore(root)
    batches = store.batches()
    assert len(batches) == 1
    assert len(batches[0].inputs) == 3


def test_concurrent_finalizers_advance_once(tmp_path: Path, pool) -> None:
    root = str(tmp_path)
    store = WatermarkStore(root)
    store.create_batch(_positions(), PIPELINES, actor="test")
    start = time.time() + 1.5
    results = pool.starmap(advance_at, [(root, start, "up2")] * 4)
    assert sorted(results) == ["ADVANCE", "ALREADY_DONE", "ALREADY_DONE", "ALREADY_DONE"]
    advanced = [h for h in store.history() if h["event"] == "WATERMARK_ADVANCED"]
    assert len(advanced) == 1
    assert store.committed_versions() == {"up2": 4}


def test_parallel_checkpoints_lose_no_row(tmp_path: Path, pool) -> None:
    root = str(tmp_path)
    start = time.time() + 1.5
    pipelines = [f"p{i}" for i in range(6)]
    pool.starmap(_checkpoint_at, [(root, start, p) for p in pipelines])
    rows = WatermarkStore(root).checkpoints(batch_id="b000001")
    assert sorted(c.pipeline for c in rows) == pipelines
    assert all(c.status is CheckpointStatus.SUCCESS for c in rows)


def test_maintenance_compacts_without_changing_anything(tmp_path: Path) -> None:
    store = WatermarkStore(tmp_path)
    for latest in (3, 6, 9):
        batch, _ = store.create_batch(_positions(latest, latest, latest), PIPELINES, actor="t")
        assert batch is not None
        for upstream in batch.ranged_upstreams:
            store.advance(batch, upstream, actor="t")
        store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="t")
    before = (store.batches(), store.committed(), len(store.history()))
    files_before = len(DeltaTable(store.uri("batches")).file_uris())
    removed = store.maintain()
    assert removed["batches"] > 1
    assert len(DeltaTable(store.uri("batches")).file_uris()) < files_before
    assert (store.batches(), store.committed(), len(store.history())) == before
    nxt, created = store.create_batch(_positions(12, 12, 12), PIPELINES, actor="t")
    assert created
    assert nxt is not None
    assert nxt.batch_id == "b000004"


def _pin(root: str, end: int, barrier) -> tuple:
    store = WatermarkStore(root)
    barrier.wait()
    return store.pin_window("b000001", "clicks", (end, end), recheck_at=None).end


def test_a_cursor_window_is_pinned_once_by_the_first_reader(tmp_path: Path) -> None:
    # I3: every read of a batch sees the same window, even when readers race.
    store = WatermarkStore(tmp_path)
    cursor = UpstreamPosition("clicks", -1, None, mode=ReadMode.TIMESTAMP)
    batch, _ = store.create_batch(
        [cursor], {"p": ["clicks"]}, actor="t", source_states={"clicks": "s1"}
    )
    assert batch is not None
    assert batch.inputs["clicks"].window == CursorWindow(None, None)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with spawn_pool(4) as pool:
            ends = pool.starmap(_pin, [(str(tmp_path), e, barrier) for e in (10, 20, 30, 40)])
    assert len(set(ends)) == 1  # all four readers got the one end that was pinned
    assert store.get_batch("b000001").inputs["clicks"].window == CursorWindow(None, ends[0])
    # A retry later gets it too, whatever the data says now.
    assert store.pin_window("b000001", "clicks", (99, 99)).end == ends[0]
    store.advance(store.get_batch("b000001"), "clicks", actor="t")
    assert store.committed()["clicks"].committed_cursor == ends[0]


def _manual_rows(store: WatermarkStore) -> list[tuple[str | None, str | None]]:
    return [
        (h["old_value"], h["new_value"]) for h in store.history() if h["event"] == "WATERMARK_SET"
    ]


def test_a_manual_change_killed_before_its_history_row_gets_it_recorded_once(
    tmp_path: Path, pool
) -> None:
    """The history row of a manual change is committed with the watermark (pending), so a
    process killed between the watermark commit and the history append loses nothing: an
    advance keeps the pending row, and racing flushes record it exactly once."""
    root = str(tmp_path)
    store = WatermarkStore(root)
    store.set_watermark("up1", 3, how=WatermarkHow.MANUAL_SET, actor="op")
    assert _manual_rows(store) == [(None, "3")]
    assert store.committed()["up1"].pending_history is None

    with pytest.raises(SimulatedCrash), simulate_crash_at("after_manual_watermark_commit"):
        store.set_watermark("up1", 5, how=WatermarkHow.MANUAL_SET, actor="op", reason="fix")
    assert store.committed_versions() == {"up1": 5}
    assert _manual_rows(store) == [(None, "3")]  # the kill came before the row
    assert store.committed()["up1"].pending_history is not None

    # The next batch advances up1 before anyone flushes: the pending row survives it.
    batch, _ = store.create_batch([UpstreamPosition("up1", 7, 5)], {"p": ["up1"]}, actor="t")
    assert batch is not None
    assert store.advance(batch, "up1", actor="t") is AdvanceDecision.ADVANCE
    assert store.committed_versions() == {"up1": 7}
    assert store.committed()["up1"].pending_history is not None

    start = time.time() + 1.5
    assert sorted(pool.starmap(_flush_at, [(root, start)] * 4)) == [0, 0, 0, 1]
    assert _manual_rows(store) == [(None, "3"), ("3", "5")]
    [row] = [h for h in store.history() if h["new_value"] == "5"]
    assert row["actor"] == "op"
    assert '"reason": "fix"' in row["detail"]
    assert store.committed()["up1"].pending_history is None
    assert store.flush_pending_history() == 0


def test_control_tables_from_before_a_new_column_are_migrated(tmp_path: Path) -> None:
    """Control tables written by an older release lack the newest columns: the store adds
    them (nullable) on first use and keeps every row."""
    old = schema.COMMITTED_WATERMARKS.remove(
        schema.COMMITTED_WATERMARKS.get_field_index("pending_history")
    )
    row = {
        "upstream": "up1",
        "committed_version": 4,
        "batch_id": None,
        "how": "MANUAL_SET",
        "updated_at": datetime.now(UTC),
        "actor": "old release",
        "committed_cursor": None,
        "table_id": None,
        "source_state": None,
    }
    write_deltalake(str(tmp_path / "committed_watermarks"), pa.Table.from_pylist([row], old))
    store = WatermarkStore(tmp_path)
    assert store.committed_versions() == {"up1": 4}
    assert store.committed()["up1"].pending_history is None
    store.set_watermark("up1", 6, how=WatermarkHow.MANUAL_SET, actor="op")
    assert store.committed_versions() == {"up1": 6}
    assert _manual_rows(store) == [("4", "6")]


FIXTURES = Path(__file__).parent / "fixtures"


def _old_root(tmp_path: Path) -> Path:
    """A control root written by the release before bucket partitioning (f6eca82): three
    completed batches, a manual set, an open batch with one RUNNING checkpoint. Made by
    fixtures/make_control_root_before_buckets.py run with that release's package."""
    with tarfile.open(FIXTURES / "control_root_before_buckets.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    return tmp_path / "control"


def test_a_root_written_before_buckets_is_read_as_it_is_by_a_read_only_store(
    tmp_path: Path,
) -> None:
    root = _old_root(tmp_path)
    versions = {t: DeltaTable(str(root / t)).version() for t in schema.TABLES}
    store = ReadOnlyWatermarkStore(root)
    assert [b.batch_id for b in store.batches()] == ["b000004", "b000003", "b000002", "b000001"]
    assert store.get_batch("b000002").status is BatchStatus.COMPLETED
    assert store.committed_versions() == {"up1": 5, "up2": 4}
    assert {t: DeltaTable(str(root / t)).version() for t in schema.TABLES} == versions


def test_a_root_written_before_buckets_is_upgraded_on_first_use(tmp_path: Path) -> None:
    root = _old_root(tmp_path)
    before = {t: DeltaTable(str(root / t)).to_pyarrow_table().num_rows for t in schema.TABLES}
    store = WatermarkStore(root)
    assert [b.batch_id for b in store.batches()] == ["b000004", "b000003", "b000002", "b000001"]
    for table in schema.BUCKETED:
        dt = DeltaTable(str(root / table))
        assert dt.metadata().partition_columns == ["bucket"], table
        added = 3 if table == "history" else 0  # the upgrade's own audit rows
        assert dt.to_pyarrow_table().num_rows == before[table] + added, table
    upgraded = [r for r in store.history() if r["event"] == "CONTROL_TABLE_UPGRADED"]
    assert sorted(json.loads(r["detail"])["table"] for r in upgraded) == sorted(schema.BUCKETED)
    # Every record reads back as the old release wrote it, and the state goes on.
    assert store.committed_versions() == {"up1": 5, "up2": 4}
    assert [b.status for b in store.batches()] == [BatchStatus.PLANNED] + [
        BatchStatus.COMPLETED
    ] * 3
    assert [c.status for c in store.checkpoints(batch_id="b000004")] == [CheckpointStatus.RUNNING]
    assert store.newest_success("pipe_a") == "b000003"
    assert [r["event"] for r in store.history(upstream="up1") if r["event"] == "WATERMARK_SET"]
    open_batch = store.open_batch()
    assert open_batch is not None
    assert open_batch.batch_id == "b000004"
    store.finish_checkpoint("pipe_a", "b000004", 1, CheckpointStatus.SUCCESS)
    assert store.advance_many(open_batch, ["up1", "up2"], actor="new") == {
        "up1": AdvanceDecision.ADVANCE,
        "up2": AdvanceDecision.ADVANCE,
    }
    assert store.set_batch_status("b000004", BatchStatus.COMPLETED, actor="new")
    assert store.committed_versions() == {"up1": 7, "up2": 9}
    nxt, created = store.create_batch(
        [UpstreamPosition("up1", 8, None), UpstreamPosition("up2", 9, None)],
        {"pipe_a": ["up1", "up2"]},
        actor="new",
    )
    assert created
    assert nxt is not None
    assert nxt.seq == 5
    # A second process finds nothing left to upgrade.
    again = WatermarkStore(root)
    again.ensure_tables()
    assert again.migrated == {}
    assert len([r for r in again.history() if r["event"] == "CONTROL_TABLE_UPGRADED"]) == 3


def _upgrade(root: str) -> dict[str, int]:
    store = WatermarkStore(root)
    store.ensure_tables()
    return {t: n for t, n in store.migrated.items() if n}


def test_concurrent_upgrades_rewrite_each_table_once(tmp_path: Path, pool) -> None:
    root = _old_root(tmp_path)
    before = {t: DeltaTable(str(root / t)).to_pyarrow_table().num_rows for t in schema.BUCKETED}
    results = pool.map(_upgrade, [str(root)] * 3)
    rewritten = [t for result in results for t in result]
    assert sorted(rewritten) == sorted(schema.BUCKETED)  # each table by exactly one process
    store = WatermarkStore(root)
    for table in ("batches", "pipeline_checkpoints"):
        assert DeltaTable(str(root / table)).to_pyarrow_table().num_rows == before[table]
    assert len([r for r in store.history() if r["event"] == "CONTROL_TABLE_UPGRADED"]) == 3


def test_strategy_runs_are_the_pipelines_measured_runs_in_the_newest_two_buckets(
    tmp_path: Path,
) -> None:
    """What `auto` weighs: the strategy each PIPELINE_SUCCEEDED row of the pipeline records
    (as run_pipeline writes it, in the checkpoint row that closes the attempt, or as an
    older release wrote it, in history), from the newest STRATEGY_BUCKETS buckets only, so
    the read stays flat however long history grows."""
    from watermark_dagster.config.pipeline import Strategy
    from watermark_dagster.core.strategy import MeasuredStrategy, StrategyChoice
    from watermark_dagster.store.history import STRATEGY_BUCKETS

    store = WatermarkStore(tmp_path)
    size = schema.BUCKET_SIZE

    def succeeded(seq: int, pipeline: str, strategy: Strategy | None, seconds: float) -> None:
        detail: dict[str, object] = {"attempt": 1, "rows_read": 1, "rows_written": 1}
        if strategy is not None:
            choice = StrategyChoice(strategy, "test", changed_bytes=seq, snapshot_bytes=1000)
            detail["strategy"] = MeasuredStrategy(choice, seconds).measured()
        batch_id = f"b{seq:06d}"
        if seq == size + 5:  # an older release's row, appended to history apart
            store.record(
                "PIPELINE_SUCCEEDED", actor="t", batch_id=batch_id, pipeline=pipeline, detail=detail
            )
            return
        attempt = store.begin_checkpoint(pipeline, batch_id, run_id="t")
        ok = CheckpointStatus.SUCCESS
        store.finish_checkpoint(pipeline, batch_id, attempt, ok, actor="t", detail=detail)

    succeeded(5, "totals", Strategy.FULL, 9.0)  # bucket 0: older than the newest two
    succeeded(size + 5, "totals", Strategy.INCREMENTAL, 2.0)
    succeeded(size + 6, "other", Strategy.FULL, 1.0)  # another pipeline
    succeeded(2 * size + 1, "totals", None, 0.0)  # a full load: nothing measured
    succeeded(2 * size + 2, "totals", Strategy.FULL, 3.5)
    failed = f"b{2 * size + 3:06d}"
    assert store.begin_checkpoint("totals", failed, run_id="t") == 1
    store.finish_checkpoint(
        "totals", failed, 1, CheckpointStatus.FAILED, actor="t", detail={"attempt": 1}
    )

    runs = store.strategy_runs("totals")
    assert STRATEGY_BUCKETS == 2
    assert [(r.batch_id, r.strategy, r.seconds) for r in runs] == [
        (f"b{size + 5:06d}", Strategy.INCREMENTAL, 2.0),
        (f"b{2 * size + 2:06d}", Strategy.FULL, 3.5),
    ]
    assert (runs[1].changed_bytes, runs[1].snapshot_bytes) == (2 * size + 2, 1000)
    assert store.strategy_runs("unknown") == []
