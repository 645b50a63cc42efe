"""Work that decides "nothing to do" starts no JVM: a `watermark run` cycle with no new
versions, a backfill of a superseded batch, and a pipeline a batch did not need.

Each case runs in a fresh process whose ``JAVA_HOME`` points at a shim that records every
launch before handing over to the real ``java`` (Spark's launcher runs ``$JAVA_HOME/bin/java``),
so a JVM started anywhere in that process tree leaves a line behind. The control tables and
upstreams are written with delta-rs; the checks need no Spark of their own.
"""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.conftest import REPO
from tests.support.cli import SCRIPT
from tests.support.java_shim import java_shim, shim_env
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.core.records import BatchStatus, CheckpointStatus
from watermark_dagster.demo import DemoPaths
from watermark_dagster.store import WatermarkStore

PIPELINES = {
    "orders_enriched": ["orders", "customers"],
    "customer_payments": ["customers", "payments"],
}


def _complete(store: WatermarkStore, versions: dict[str, int], ran: list[str]) -> str:
    """Plan a batch up to ``versions``, record its pipelines in ``ran`` as succeeded, commit
    its watermarks and complete it (what a clean run would have left behind)."""
    batch, created = store.create_batch(
        [UpstreamPosition(u, v, None) for u, v in versions.items()], PIPELINES, actor="test"
    )
    assert batch is not None
    assert created
    for pipeline in ran:
        attempt = store.begin_checkpoint(pipeline, batch.batch_id, run_id="test")
        store.finish_checkpoint(
            pipeline, batch.batch_id, attempt, CheckpointStatus.SUCCESS, rows_read=1
        )
    for upstream in batch.ranged_upstreams:
        store.advance(batch, upstream, actor="test")
    store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="test")
    return batch.batch_id


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The demo home of :func:`applied_home`."""
    return applied_home(tmp_path)


def applied_home(tmp_path: Path) -> Path:
    """A demo ``WATERMARK_HOME`` (its Dagster home in ``dagster``) with two completed
    batches: b000001 ran both pipelines; b000002 changed only orders, so only
    orders_enriched ran it. Every upstream is fully committed and every target exists:
    nothing to plan."""
    paths = DemoPaths(tmp_path / "wm")
    for name in ("customers", "orders", "payments"):
        write_deltalake(paths.upstream(name), pa.table({"id": pa.array([1], pa.int64())}))
    for name in PIPELINES:  # a missing target would be planned a first load
        write_deltalake(paths.target(name), pa.table({"id": pa.array([1], pa.int64())}))
    store = WatermarkStore(paths.control_root)
    assert _complete(store, {"customers": 0, "orders": 0, "payments": 0}, list(PIPELINES)) == (
        "b000001"
    )
    write_deltalake(
        paths.upstream("orders"), pa.table({"id": pa.array([2], pa.int64())}), mode="append"
    )
    assert _complete(store, {"customers": 0, "orders": 1, "payments": 0}, ["orders_enriched"]) == (
        "b000002"
    )
    assert store.get_batch("b000002").pipelines == ("orders_enriched",)
    (paths.home / "dagster").mkdir()
    shutil.copy(REPO / "dagster.yaml", paths.home / "dagster" / "dagster.yaml")
    return paths.home


def test_watermark_run_with_nothing_to_do_starts_no_jvm(home: Path, tmp_path: Path) -> None:
    java_home, launches = java_shim(tmp_path)
    proc = subprocess.run(
        [str(SCRIPT), "run", "--json"],
        env=shim_env(home, java_home),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["runs"] == []
    assert out["completed"] == []
    assert not launches.exists(), launches.read_text()


# Executes run requests the way the coordinator's do (through HeadlessRunner, with the
# attempt tag) and then as a UI backfill does (the batch job on one partition, by hand),
# printing what the caller checks. With a third argument, the by-hand run is of a location
# where the pipeline writes with that mode instead (its replay is refused).
_BACKFILL = textwrap.dedent(
    """
    import json, sys
    from dataclasses import replace
    from dagster import AssetKey, DagsterInstance, RunRequest, SensorResult
    from watermark_dagster.config.pipeline import WriteMode
    from watermark_dagster.config.registry import Registry
    from watermark_dagster.dagster_defs.pipeline_outcomes import SKIPPED_TAG
    from watermark_dagster.dagster_defs.definitions import build_definitions
    from watermark_dagster.dagster_defs.resources import held_spark_sessions, spark_was_started
    from watermark_dagster.dagster_defs.runs import ATTEMPT_TAG
    from watermark_dagster.definitions import defs, location
    from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner

    partition, pipeline = sys.argv[1], sys.argv[2]
    by_hand_defs = defs
    if len(sys.argv) > 3:
        registry = location.registry
        changed = replace(
            registry.pipelines[pipeline],
            write=WriteMode(sys.argv[3]),
            declared=None,
            transform=lambda batch: batch.spark.range(0),
        )
        by_hand_defs = build_definitions(
            Registry(
                upstreams=registry.upstreams.values(),
                pipelines=[
                    changed if p.name == pipeline else p for p in registry.pipelines.values()
                ],
            ),
            control_root=location.control_root,
        )
    instance = DagsterInstance.get()
    instance.add_dynamic_partitions("watermark_batches", sorted({"b000001", "b000002", partition}))
    lines = []
    runner = HeadlessRunner(defs, instance, log=lines.append)
    report = CycleReport()
    request = RunRequest(
        partition_key=partition,
        asset_selection=[AssetKey(pipeline)],
        asset_check_keys=[],  # as the coordinator's requests (sensors.resume_request)
        tags={ATTEMPT_TAG: "2"},
    )
    with held_spark_sessions():
        runner.execute_requests(SensorResult(run_requests=[request]), report)
    job = by_hand_defs.resolve_job_def("watermark_batch_job")
    direct = job.execute_in_process(
        instance=instance,
        partition_key=partition,
        asset_selection=[AssetKey(pipeline)],
        raise_on_error=False,
    )
    [run] = report.runs
    logs = [
        e.user_message
        for r in (run.run_id, direct.run_id)
        for e in instance.all_logs(r)
        if "SKIPPED" in (e.user_message or "")
    ]
    failures = [
        e.event_specific_data.user_failure_data.description
        for e in direct.all_events
        if e.is_step_failure
    ]
    print(json.dumps({
        "jvm": spark_was_started(),
        "success": [run.success, direct.success],
        "skipped": run.skipped,
        "lines": lines,
        "run_log": logs,
        "failures": failures,
        "materialized": [
            len([
                e for e in instance.all_logs(r)
                if e.dagster_event and e.dagster_event.is_step_materialization
            ])
            for r in (run.run_id, direct.run_id)
        ],
        "tags": [
            instance.get_run_by_id(r).tags.get(SKIPPED_TAG) for r in (run.run_id, direct.run_id)
        ],
        "steps": sorted(
            e.step_key for e in instance.all_logs(run.run_id)
            if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"
        ),
    }))
    """
)


def _run_both(home: Path, tmp_path: Path, partition: str, pipeline: str, *write: str) -> dict:
    java_home, launches = java_shim(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", _BACKFILL, partition, pipeline, *write],
        env=shim_env(home, java_home),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not launches.exists(), launches.read_text()
    assert out["jvm"] is False
    return out


@pytest.mark.parametrize(
    ("partition", "write"),
    [
        pytest.param("b000001", "overwrite", id="older-batch-overwrite"),
        pytest.param("b000002", "append", id="newest-batch-append"),
    ],
)
def test_a_batch_already_applied_is_skipped_quietly_or_its_replay_refused_by_hand(
    home: Path, tmp_path: Path, partition: str, write: str
) -> None:
    out = _run_both(home, tmp_path, partition, "orders_enriched", write)
    # The coordinator's retry of a batch the pipeline already applied skips it: no write,
    # no materialization (the partition keeps the one of the run that applied it).
    assert out["success"] == [True, False]
    assert "already succeeded" in out["skipped"]["orders_enriched"]
    [line] = out["lines"]
    assert "orders_enriched SKIPPED" in line
    [log] = out["run_log"]
    assert "SKIPPED (already applied)" in log
    assert out["materialized"] == [0, 0]
    assert out["tags"] == ["orders_enriched=already_applied", None]
    # A backfill by hand replays a merge pipeline's batch; one that overwrites or appends
    # is refused before any Spark work or store write, saying why.
    [failure] = out["failures"]
    assert failure.startswith("Not replayed: 'orders_enriched' on batch"), failure
    assert f"write with ['{write}']" in failure
    assert "an overwrite target would go back in time" in failure
    assert "Nothing was read or written" in failure
    store = WatermarkStore(DemoPaths(home).control_root)
    assert [b.kind.value for b in store.batches()] == ["SCHEDULED", "SCHEDULED"]


def test_a_pipeline_the_batch_did_not_need_is_done_with_nothing_to_do(
    home: Path, tmp_path: Path
) -> None:
    out = _run_both(home, tmp_path, "b000002", "customer_payments")
    assert out["success"] == [True, True]
    assert "no upstream" in out["skipped"]["customer_payments"]
    assert len(out["run_log"]) == 2
    assert all("nothing changed for it" in m for m in out["run_log"])
    # Shown as done with nothing to do, never missing.
    assert out["materialized"] == [1, 1]
    assert out["tags"] == ["customer_payments=not_in_batch"] * 2
    # A coordinator's request runs the pipeline alone, not the checks on its asset.
    assert out["steps"] == ["customer_payments"]


@pytest.mark.parametrize("partition", ["b000009", "monday-rerun"])
def test_a_partition_added_by_hand_is_refused_as_no_batch(
    home: Path, tmp_path: Path, partition: str
) -> None:
    """The launchpad's "Add a partition" invents a batch partition; a run of it pins
    nothing to read. It fails before any Spark work or write, saying it is no batch and
    how to go on. Before, an id that does not parse failed with a raw ValueError."""
    out = _run_both(home, tmp_path, partition, "orders_enriched")
    assert out["success"] == [False, False]
    [failure] = out["failures"]
    assert f"Partition '{partition}' is not a batch" in failure, failure
    assert "Nothing was read or written" in failure
    assert "delete that partition" in failure
    assert out["materialized"] == [0, 0]
    store = WatermarkStore(DemoPaths(home).control_root)
    assert [b.batch_id for b in store.batches()] == ["b000002", "b000001"]
