"""Observe → plan → run → finalize with real Spark, real Delta tables and a real Dagster
instance (SQLite in a temporary DAGSTER_HOME), driven tick by tick like the daemon would."""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.instance.ref import InstanceRef
from pyspark.sql import functions as F

from tests.conftest import REPO, SPARK_TEST_CONF
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.records import BatchStatus, CheckpointStatus
from watermark_dagster.dagster_defs.definitions import build_definitions
from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
from watermark_dagster.dagster_defs.resources import SparkSessionResource
from watermark_dagster.dagster_defs.runs import ATTEMPT_TAG
from watermark_dagster.dagster_defs.sensors import COORDINATOR, FINALIZER, WatermarkSettings
from watermark_dagster.demo import DemoPaths, apply_round, build_demo_registry, seed
from watermark_dagster.demo.data import ORDERS
from watermark_dagster.demo.verify import compare_with_full_recompute
from watermark_dagster.observe.log import latest_local_version
from watermark_dagster.read.derive import transform_of
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.spark

UPSTREAMS = ("customers", "orders", "payments")


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
            min_batch_interval_seconds=0, max_attempts=3, keep_batch_partitions=2
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
                assert meta[f"{upstream}/read_mode"] == "CDF"
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
    # customer_payments had no run: the finalizer recorded it as done with nothing to do.
    [nothing] = location.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("customer_payments"), asset_partitions=["b000002"]),
        limit=5,
    ).records
    assert nothing.run_id not in {r.run_id for r in report.runs}
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
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]

    planned = location.store.open_batch()
    assert planned is not None
    [dead_run] = location.instance.get_runs(RunsFilter(tags={"dagster/partition": "b000002"}))
    assert dead_run.status is DagsterRunStatus.STARTED  # Dagster still thinks it runs
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
    assert location.instance.get_run_by_id(dead_run.run_id).status is DagsterRunStatus.FAILURE  # type: ignore[union-attr]
    assert [r.success for r in report.runs] == [True]
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
    # The first pipeline's merge landed twice (before the kill and on retry): no duplicates.
    _assert_targets_exact(spark, location.paths)


def test_backfill_of_an_older_batch_never_overwrites_newer_state(spark, location: Location) -> None:
    location.runner.run_until_idle()
    apply_round(spark, location.paths, 1)  # deletes an order and a payment, among others
    location.runner.run_until_idle()
    targets = {p: location.paths.target(p) for p in ("orders_enriched", "customer_payments")}
    versions = {p: latest_local_version(t) for p, t in targets.items()}

    # An operator backfills batch 1 (as the UI's asset backfill would): same job, old partition.
    before = _materialization_metadata(location.instance, "orders_enriched", "b000001")
    job = location.runner.defs.resolve_job_def("watermark_batch_job")
    result = job.execute_in_process(
        instance=location.instance, partition_key="b000001", raise_on_error=False
    )
    # Refused loudly, naming the replay of the batch's ranges; nothing written.
    assert not result.success
    failures = [
        e.event_specific_data.user_failure_data.description  # type: ignore[union-attr]
        for e in result.all_events
        if e.is_step_failure
    ]
    assert failures
    assert all("watermark replay -t " in f for f in failures), failures
    assert {p: latest_local_version(t) for p, t in targets.items()} == versions  # untouched
    # The partition keeps the materialization that applied it, with its ranges.
    meta = _materialization_metadata(location.instance, "orders_enriched", "b000001")
    assert meta == before
    assert "skipped" not in meta
    assert "orders/end_version" in meta
    assert location.store.get_batch("b000001").status is BatchStatus.COMPLETED
    _assert_targets_exact(spark, location.paths)
