"""Observe → plan → run → finalize with real Spark, real Delta tables and a real Dagster
instance (SQLite in a temporary DAGSTER_HOME), driven tick by tick like the daemon would."""

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunsFilter,
)
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.instance.ref import InstanceRef
from dagster._core.loader import LoadingContextForTest
from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import functions as F

from tests.conftest import REPO, SPARK_TEST_CONF
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.ranges import ReadMode
from watermark_dagster.core.records import BatchKind, BatchStatus, CheckpointStatus
from watermark_dagster.dagster_defs.definitions import build_definitions
from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
from watermark_dagster.dagster_defs.health_drift import DRIFT_CHECK
from watermark_dagster.dagster_defs.health_stuck import STUCK_CHECK
from watermark_dagster.dagster_defs.replay_backfill import REPLAY_TAG
from watermark_dagster.dagster_defs.resources import SparkSessionResource
from watermark_dagster.dagster_defs.runs import ATTEMPT_TAG, DIED_TAG
from watermark_dagster.dagster_defs.sensors import COORDINATOR, FINALIZER
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.demo import DemoPaths, apply_round, build_demo_registry, seed
from watermark_dagster.demo.data import ORDERS
from watermark_dagster.demo.verify import compare_with_full_recompute
from watermark_dagster.observe.log import latest_local_version
from watermark_dagster.read.derive import transform_of
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.spark

UPSTREAMS = ("customers", "orders", "payments")
PIPELINES = {
    "orders_enriched": ("customers", "orders"),
    "customer_payments": ("customers", "payments"),
}


@dataclass
class Location:
    paths: DemoPaths
    runner: HeadlessRunner
    instance: DagsterInstance
    store: WatermarkStore
    fail_flag: Path

    def latest(self) -> dict[str, int]:
        return {u: latest_local_version(self.paths.upstream(u)) for u in UPSTREAMS}  # type: ignore[misc]


def _with_failure_switch(registry: Registry, pipeline: str, flag: Path) -> Registry:
    """The demo registry, with one transform failing while ``flag`` exists.

    A stand-in for a user's transform hitting a bad row; Spark, Delta and Dagster stay real.
    """
    original = transform_of(registry.pipelines[pipeline])

    def transform(batch):
        if flag.exists():
            raise RuntimeError(f"injected failure in {pipeline}")
        return original(batch)

    pipelines = [
        replace(p, transform=transform, declared=None) if p.name == pipeline else p
        for p in registry.pipelines.values()
    ]
    return Registry(upstreams=registry.upstreams.values(), pipelines=pipelines)


@pytest.fixture
def location(spark, tmp_path: Path, dagster_home: Path) -> Iterator[Location]:
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    flag = tmp_path / "fail_customer_payments"
    registry = _with_failure_switch(build_demo_registry(paths), "customer_payments", flag)
    defs = build_definitions(
        registry,
        control_root=paths.control_root,
        spark=SparkSessionResource(master="local[2]", conf=SPARK_TEST_CONF),
        # Two batch partitions kept: the third batch prunes the first (see the first test).
        settings=WatermarkSettings(
            min_batch_interval_seconds=0,
            max_attempts=3,
            keep_batch_partitions=2,
            death_backoff_seconds=0,  # a killed run is resumed at once
        ),
    )
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        yield Location(
            paths,
            HeadlessRunner(defs, instance),
            instance,
            WatermarkStore(paths.control_root),
            flag,
        )
    finally:
        instance.dispose()


def _assert_targets_exact(spark, paths: DemoPaths) -> None:
    for check in compare_with_full_recompute(spark, paths):
        assert check.ok, (check.target, check.missing, check.unexpected)


def _materialization_metadata(instance: DagsterInstance, asset: str, partition: str) -> dict:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[partition]), limit=1
    ).records
    assert records, f"no materialization of {asset} for {partition}"
    meta = records[0].asset_materialization.metadata  # type: ignore[union-attr]
    return {k: getattr(v, "value", v) for k, v in meta.items()}


def test_three_batches_track_changing_upstreams_exactly(spark, location: Location) -> None:
    previous_end: dict[str, int] = {}
    for round_no in range(3):
        if round_no:
            apply_round(spark, location.paths, round_no)
        report = location.runner.run_until_idle()
        assert len(report.completed) == 1, report
        assert not report.failed_runs
        batch = location.store.get_batch(report.completed[0])
        assert batch.status is BatchStatus.COMPLETED
        # Every upstream changed each round: each range starts right after the last (I1).
        for upstream, planned in batch.inputs.items():
            assert planned.range is not None
            assert planned.range.start == previous_end.get(upstream, -1) + 1
            previous_end[upstream] = planned.range.end
        assert location.store.committed_versions() == location.latest()
        _assert_targets_exact(spark, location.paths)

        meta = _materialization_metadata(location.instance, "orders_enriched", batch.batch_id)
        # The first batch loads snapshots (nothing committed yet); later ones read changes.
        assert meta["full_load"] is (round_no == 0)
        for upstream in ("orders", "customers"):
            rng = batch.inputs[upstream].range
            assert rng is not None
            if round_no == 0:
                assert meta[f"{upstream}/read_mode"] == "SNAPSHOT"
                assert meta[f"{upstream}/start_version"] == 0  # a snapshot: every version
            else:
                # A rewrite (auto's choice for these small targets, whose change feeds no
                # pipeline reads) reads the snapshot at the range's end, not the range.
                mode = "SNAPSHOT" if meta.get("strategy") == "rewrite" else "CDF"
                assert meta[f"{upstream}/read_mode"] == mode
                assert meta[f"{upstream}/start_version"] == rng.start
            assert meta[f"{upstream}/end_version"] == rng.end
            assert meta[f"{upstream}/rows_read"] > 0
        assert meta["rows_written"] > 0
        # The newest two batch partitions stay in Dagster; the finalizer that completed the
        # third batch deleted the first one's.
        partitions = location.instance.get_dynamic_partitions("watermark_batches")
        assert partitions == [f"b{i:06d}" for i in range(max(1, round_no), round_no + 2)]
    assert [b.batch_id for b in location.store.batches()] == ["b000003", "b000002", "b000001"]
    # Pruning shortened only Dagster's partition list: the batch, its ranges and its
    # materializations are all still there.
    assert location.store.get_batch("b000001").status is BatchStatus.COMPLETED
    assert _materialization_metadata(location.instance, "orders_enriched", "b000001")["full_load"]


def _one_cycle(location: Location) -> CycleReport:
    report = CycleReport()
    location.runner.execute_requests(location.runner.tick(COORDINATOR), report)
    location.runner.tick(FINALIZER)
    return report


def test_fan_out_gating_holds_the_shared_upstream(spark, location: Location) -> None:
    location.fail_flag.touch()
    report = _one_cycle(location)
    assert len(report.runs) == 1
    assert not report.runs[0].success
    assert "injected failure in customer_payments" in (report.runs[0].error or "")
    batch = location.store.open_batch()
    assert batch is not None
    assert batch.batch_id == "b000001"
    # orders is read only by orders_enriched (succeeded): advanced. customers is shared with
    # the failed customer_payments, payments read only by it: both held back.
    committed = location.store.committed_versions()
    assert committed == {"orders": batch.inputs["orders"].snapshot_version}
    failed = location.store.checkpoints(pipeline="customer_payments")
    assert [(c.attempt, c.status) for c in failed] == [(1, CheckpointStatus.FAILED)]
    assert "injected failure" in (failed[0].error or "")

    location.fail_flag.unlink()
    report = _one_cycle(location)
    assert [r.pipelines for r in report.runs] == [["customer_payments"]]  # only the unfinished
    assert report.runs[0].success
    assert location.store.open_batch() is None
    assert location.store.get_batch("b000001").status is BatchStatus.COMPLETED
    assert location.store.committed_versions() == location.latest()
    runs = location.instance.get_runs(RunsFilter(tags={"dagster/partition": "b000001"}))
    assert sorted(r.tags[ATTEMPT_TAG] for r in runs) == ["1", "2"]
    _assert_targets_exact(spark, location.paths)


def test_only_pipelines_with_new_input_run(spark, location: Location) -> None:
    location.runner.run_until_idle()
    before = location.store.committed_versions()
    spark.createDataFrame([(999, 1, 4200, "new")], ORDERS).write.format("delta").mode(
        "append"
    ).save(location.paths.upstream("orders"))

    report = location.runner.run_until_idle()
    assert report.completed == ["b000002"]
    batch = location.store.get_batch("b000002")
    assert batch.pipelines == ("orders_enriched",)
    for upstream in ("customers", "payments"):  # nothing new: NOOP, no range
        assert batch.inputs[upstream].range is None
        assert batch.inputs[upstream].snapshot_version == before[upstream]
    assert [r.pipelines for r in report.runs] == [["orders_enriched"]]
    # customer_payments had no run: the batch's run, finalizing the batch in its last
    # step, recorded it as done with nothing to do (the finalizer sensor would have).
    [nothing] = location.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("customer_payments"), asset_partitions=["b000002"]),
        limit=5,
    ).records
    assert [nothing.run_id] == [r.run_id for r in report.runs]
    meta = nothing.asset_materialization.metadata  # type: ignore[union-attr]
    assert meta["skip_kind"].value == "not_in_batch"
    after = location.store.committed_versions()
    assert after["orders"] == before["orders"] + 1
    assert {u: after[u] for u in ("customers", "payments")} == {
        u: before[u] for u in ("customers", "payments")
    }
    target = spark.read.format("delta").load(location.paths.target("orders_enriched"))
    assert target.where(F.col("order_id") == 999).count() == 1


def test_open_batch_is_resumed_after_its_run_is_killed(
    spark, location: Location, dagster_home: Path
) -> None:
    # The first batch (a snapshot load) runs normally; the second merges changes.
    assert len(location.runner.run_until_idle().completed) == 1
    apply_round(spark, location.paths, 1)
    # A real `watermark run` process is SIGKILLed right after its first pipeline committed
    # to its target, before the checkpoint and the materialization.
    env = {
        **os.environ,
        "WATERMARK_HOME": str(location.paths.home),
        "DAGSTER_HOME": str(dagster_home),
        "WATERMARK_FAULTS": "after_target_commit",
        "WATERMARK_SPARK_MASTER": "local[1]",
        "WATERMARK_SPARK_CONF": json.dumps(SPARK_TEST_CONF),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "watermark_dagster.cli", "run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # The command's process saw its worker child die by the signal, said so, recorded the
    # run as died and exited as a shell reports a killed process.
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr[-3000:]
    assert "its process was killed by SIGKILL (signal 9)" in proc.stderr
    assert "a crash, not a failure" in proc.stderr

    planned = location.store.open_batch()
    assert planned is not None
    [dead_run] = location.instance.get_runs(RunsFilter(tags={"dagster/partition": "b000002"}))
    assert dead_run.status is DagsterRunStatus.FAILURE
    assert "killed by SIGKILL (signal 9)" in dead_run.tags[DIED_TAG]
    killed = location.store.checkpoints(batch_id="b000002")
    assert [(c.pipeline, c.attempt, c.status) for c in killed] == [
        (killed[0].pipeline, 1, CheckpointStatus.RUNNING)
    ]

    report = location.runner.run_until_idle()
    assert report.completed == ["b000002"]
    assert len(location.store.batches()) == 2  # resumed, not re-planned
    resumed = location.store.get_batch("b000002")
    assert resumed.plan_id == planned.plan_id
    assert resumed.inputs == planned.inputs
    assert [r.success for r in report.runs] == [True]
    # The death is in history once, with its signal; it spent no attempt.
    died = [json.loads(h["detail"]) for h in location.store.history() if h["event"] == "RUN_DIED"]
    assert died == [{"run_id": dead_run.run_id, "how": "killed by SIGKILL (signal 9)"}]
    for pipeline, ups in (
        ("orders_enriched", ("orders", "customers")),
        ("customer_payments", ("customers", "payments")),
    ):
        meta = _materialization_metadata(location.instance, pipeline, "b000002")
        assert meta["attempt"] >= 1
        for u in ups:
            rng = planned.inputs[u].range
            assert rng is not None
            assert (meta[f"{u}/start_version"], meta[f"{u}/end_version"]) == (rng.start, rng.end)
    statuses = {(c.pipeline, c.attempt): c.status for c in location.store.checkpoints()}
    assert statuses[(killed[0].pipeline, 1)] is CheckpointStatus.RUNNING
    assert statuses[(killed[0].pipeline, 2)] is CheckpointStatus.SUCCESS
    assert location.store.committed_versions() == location.latest()
    # The killed pipeline's write (a rewrite in the killed run: `auto` on these small
    # targets, whose change feeds no pipeline reads; a MERGE before rewrites) landed before
    # the kill; its retry found that commit in the target's log and made no second one.
    first = killed[0].pipeline
    assert _materialization_metadata(location.instance, first, "b000002")["already_applied"]
    history = RsDeltaTable(location.paths.target(first)).history()
    ours = [c for c in history if str(c.get("userMetadata", "")).find("batch=b000002 ") >= 0]
    assert len(ours) == 1, ours
    assert ours[0]["operation"] in ("WRITE", "MERGE"), ours
    _assert_targets_exact(spark, location.paths)


# Runs start at once and execute in the launching process: no daemon, no run worker. These
# blocks replace the shipped dagster.yaml's (its run_coordinator is the queued one).
_SYNC_RUNS = {
    "run_coordinator": {
        "module": "dagster._core.run_coordinator",
        "class": "DefaultRunCoordinator",
    },
    "run_launcher": {
        "module": "dagster._core.launcher.sync_in_memory_run_launcher",
        "class": "SyncInMemoryRunLauncher",
    },
}

BACKFILL = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""


LAUNCH = """
mutation Launch($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on PythonError { message }
  }
}
"""


@contextmanager
def _ui(location: Location, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The demo code location over ``location``'s tables, served by a real code server to
    Dagster's GraphQL API (what the UI calls), on an instance whose runs execute
    synchronously in this process (so they reuse this process's Spark session)."""
    from dagster_graphql.test.utils import define_out_of_process_context

    from watermark_dagster import definitions

    home = Path(os.environ["DAGSTER_HOME"])
    config = yaml.safe_load((home / "dagster.yaml").read_text())
    (home / "dagster.yaml").write_text(yaml.safe_dump({**config, **_SYNC_RUNS}))
    monkeypatch.setenv("WATERMARK_HOME", str(location.paths.home))
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
    try:
        with define_out_of_process_context(definitions.__file__, "defs", instance) as context:
            yield context
    finally:
        instance.dispose()


def _ui_backfill(context: Any, assets: list[str], partition: str) -> list[DagsterRun]:
    """Backfill ``partition`` of ``assets`` as the UI does (the ``launchPartitionBackfill``
    mutation), then run the backfill daemon's iterations; the backfill's runs."""
    from dagster._daemon.backfill import execute_backfill_iteration
    from dagster_graphql.test.utils import execute_dagster_graphql

    params = {"partitionNames": [partition], "assetSelection": [{"path": [a]} for a in assets]}
    launched = execute_dagster_graphql(context, BACKFILL, {"params": params}).data
    answer = launched["launchPartitionBackfill"]
    assert answer["__typename"] == "LaunchBackfillSuccess", answer
    instance = context.instance
    for _ in range(5):
        list(execute_backfill_iteration(context.process_context, logging.getLogger("backfill")))
        backfill = instance.get_backfill(answer["backfillId"])
        assert backfill is not None
        if backfill.status is not BulkActionStatus.REQUESTED:
            break
    assert backfill.status is BulkActionStatus.COMPLETED_SUCCESS, backfill
    return list(instance.get_runs(RunsFilter(tags={"dagster/backfill": answer["backfillId"]})))


def _ui_launch(context: Any, job: str, run_config: dict[str, Any]) -> DagsterRun:
    """Launch ``job`` with ``run_config`` as the launchpad does; the finished run."""
    from dagster_graphql.test.utils import execute_dagster_graphql, infer_repository_selector

    params = {
        "selector": {**infer_repository_selector(context), "pipelineName": job},
        "runConfigData": run_config,
    }
    launched = execute_dagster_graphql(context, LAUNCH, {"executionParams": params}).data
    answer = launched["launchPipelineExecution"]
    assert answer["__typename"] == "LaunchRunSuccess", answer
    run = context.instance.get_run_by_id(answer["run"]["runId"])
    assert run is not None
    return run


def _target_rows(spark, path: str) -> dict[tuple, int]:
    """The target's rows (with the batch position ``_wm_seq`` each carries, not the label
    of the batch that last wrote it) and that position."""
    frame = spark.read.format("delta").load(path)
    frame = frame.drop(*[c for c in frame.columns if c.startswith("_wm_") and c != "_wm_seq"])
    return {tuple(r): r["_wm_seq"] for r in frame.collect()}


def test_ui_backfill_of_an_older_batch_replays_it_without_regressing_newer_rows(
    spark, location: Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    location.runner.run_until_idle()
    apply_round(spark, location.paths, 1)  # deletes an order and a payment, among others
    location.runner.run_until_idle()
    # The declared pipeline's batch (rewrite: `auto` on tables this small, whose change
    # feeds no pipeline reads) replaced the target without comparing it, and its run
    # evaluated the watermark_drift check for its materialization: passed, not measured (a
    # `full` batch's drift is checked in tests/spark/test_declared_proofs.py).
    drift = AssetCheckKey(AssetKey("orders_enriched"), DRIFT_CHECK)
    storage = location.instance.event_log_storage
    record = storage.get_latest_asset_check_execution_by_key([drift])[drift]
    assert record.evaluation is not None, record
    assert record.evaluation.passed, record.evaluation
    assert "drift not measured" in (record.evaluation.description or ""), record.evaluation
    pipelines = tuple(PIPELINES)
    targets = {p: location.paths.target(p) for p in pipelines}
    before = {p: _target_rows(spark, t) for p, t in targets.items()}
    committed = location.store.committed_versions()
    first = location.store.get_batch("b000001")

    # An operator backfills batch 1, the first load, from the UI: both pipelines.
    with _ui(location, monkeypatch) as ui:
        runs = _ui_backfill(ui, list(pipelines), "b000001")
        assert [r.status for r in runs] == [DagsterRunStatus.SUCCESS] * len(runs), runs
        # Then an operator replays batch 2's orders range from the launchpad.
        second = location.store.get_batch("b000002").inputs["orders"].range
        assert second is not None
        config = {
            "upstream": "orders",
            "from_version": second.start,
            "to_version": second.end,
            "pipelines": ["orders_enriched"],
        }
        launched = _ui_launch(
            ui, "watermark_replay_job", {"ops": {"watermark_replay": {"config": config}}}
        )
    assert launched.status is DagsterRunStatus.SUCCESS, launched

    # It replayed: one REPLAY batch per pipeline, re-reading batch 1's ranges (the first
    # load's snapshots as the changes of [0, v]), written at batch 1's position, completed.
    *replays, by_launchpad = sorted(
        (b for b in location.store.batches() if b.kind is BatchKind.REPLAY), key=lambda b: b.seq
    )
    assert sorted(b.pipelines for b in replays) == [(p,) for p in sorted(pipelines)]
    for replay in replays:
        assert replay.status is BatchStatus.COMPLETED
        assert replay.order_seq == first.seq
        for upstream in PIPELINES[replay.pipelines[0]]:
            assert replay.inputs[upstream].mode is ReadMode.CDF
            assert replay.inputs[upstream].range == first.inputs[upstream].range
        [done] = location.store.checkpoints(batch_id=replay.batch_id)
        assert done.status is CheckpointStatus.SUCCESS
        assert done.rows_read > 0
        # The backfilled partition's materialization says it was this replay.
        [pipeline] = replay.pipelines
        meta = _materialization_metadata(location.instance, pipeline, "b000001")
        assert meta["replay_batch_id"] == replay.batch_id, meta
        assert meta["batch_id"] == "b000001"
        assert meta["replay"].startswith("replayed: batch b000001's ranges re-read as REPLAY")
    # No watermark moved, no newer row regressed, no deleted row came back: every row
    # batch 2 wrote is as it was (both replays), and the targets equal a full recompute.
    assert location.store.committed_versions() == committed
    for pipeline, rows in before.items():
        after = _target_rows(spark, targets[pipeline])
        newer = {row for row, seq in rows.items() if seq == 2}
        assert newer, pipeline
        assert newer <= set(after), pipeline
        assert len(after) == len(rows), pipeline
    # The launchpad's replay is recorded as `watermark replay` records it: a REPLAY batch at
    # batch 2's position whose partition shows the pipeline's materialization.
    assert by_launchpad.pipelines == ("orders_enriched",)
    assert by_launchpad.status is BatchStatus.COMPLETED
    assert by_launchpad.order_seq == 2
    assert by_launchpad.inputs["orders"].range == second
    assert by_launchpad.inputs["customers"].mode is ReadMode.NOOP
    meta = _materialization_metadata(location.instance, "orders_enriched", by_launchpad.batch_id)
    assert meta["orders/read_mode"] == "CDF"
    assert meta["rows_read"] > 0
    assert launched.tags[REPLAY_TAG] == by_launchpad.batch_id
    # It says it was a replay, of which batch and ranges, by whom (the run).
    assert meta["replay_of"] == "b000002", meta
    assert meta["replay_batch_id"] == by_launchpad.batch_id
    assert meta["replay_ranges"] == f"orders CDF {second}"
    assert meta["replay_actor"] == launched.run_id
    assert meta["replay"].startswith(f"replayed: orders CDF {second}, applied by batch b000002")
    # The pipeline the replay does not concern shows its partition done, not missing.
    other = _materialization_metadata(location.instance, "customer_payments", by_launchpad.batch_id)
    assert other["skip_kind"] == "not_in_batch", other
    assert "does not concern 'customer_payments'" in other["skipped"]
    # No pipeline's partition is missing: every batch partition (the replay's included)
    # has a materialization of each pipeline.
    partitions = set(location.instance.get_dynamic_partitions("watermark_batches"))
    assert by_launchpad.batch_id in partitions
    for pipeline in pipelines:
        materialized = location.instance.get_materialized_partitions(AssetKey(pipeline))
        assert partitions <= materialized, (pipeline, sorted(partitions - materialized))
    # The checks are evaluated after the replay: each pipeline's latest check execution is
    # the launchpad run's and belongs to its new materialization (the UI shows it for that
    # one, not "Not evaluated").
    for pipeline in pipelines:
        [latest] = location.instance.fetch_materializations(AssetKey(pipeline), limit=1).records
        assert (latest.run_id, latest.partition_key) == (launched.run_id, by_launchpad.batch_id)
        key = AssetCheckKey(AssetKey(pipeline), STUCK_CHECK)
        storage = location.instance.event_log_storage
        record = storage.get_latest_asset_check_execution_by_key([key])[key]
        assert record.run_id == launched.run_id, record
        assert record.evaluation is not None, record
        assert record.evaluation.passed, record.evaluation
        assert asyncio.run(
            record.targets_latest_materialization(LoadingContextForTest(location.instance))
        ), record
    _assert_targets_exact(spark, location.paths)
    # The coordinator has nothing to do: a replay is no open batch.
    report = location.runner.run_until_idle()
    assert report.runs == []
    assert report.completed == []


def test_backfill_of_the_open_batch_runs_it_as_the_coordinator_would(
    spark, location: Location
) -> None:
    location.fail_flag.touch()
    _one_cycle(location)  # orders_enriched applies b000001, customer_payments fails
    location.fail_flag.unlink()
    [applied] = location.store.checkpoints(pipeline="orders_enriched")

    # An operator backfills the open batch by hand (no coordinator attempt tag).
    job = location.runner.defs.resolve_job_def("watermark_batch_job")
    result = job.execute_in_process(instance=location.instance, partition_key="b000001")
    assert result.success
    # orders_enriched skips the batch it applied (no new attempt; the run's finalize
    # recorded the target position the batch's advance reached on its checkpoint);
    # customer_payments runs it.
    [skipped] = location.store.checkpoints(pipeline="orders_enriched")
    assert (skipped.attempt, skipped.status, skipped.run_id) == (
        applied.attempt,
        applied.status,
        applied.run_id,
    )
    statuses = [c.status for c in location.store.checkpoints(pipeline="customer_payments")]
    assert statuses == [CheckpointStatus.FAILED, CheckpointStatus.SUCCESS]
    assert not [b for b in location.store.batches() if b.kind is BatchKind.REPLAY]
    # The backfill's run completed it, as the coordinator's own retry would; the
    # finalizer's tick after it changes nothing.
    assert location.store.get_batch("b000001").status is BatchStatus.COMPLETED
    location.runner.tick(FINALIZER)
    assert location.store.get_batch("b000001").status is BatchStatus.COMPLETED
    assert location.store.committed_versions() == location.latest()
    _assert_targets_exact(spark, location.paths)
