"""Work that decides "nothing to do" starts no JVM: a `watermark run` cycle with no new
versions, a backfill of a superseded batch, and a pipeline a batch did not need.

Each case runs in a fresh process whose ``JAVA_HOME`` points at a shim that records every
launch before handing over to the real ``java`` (Spark's launcher runs ``$JAVA_HOME/bin/java``),
so a JVM started anywhere in that process tree leaves a line behind. The control tables and
upstreams are written with delta-rs; the checks need no Spark of their own.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.conftest import REPO
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.core.records import BatchStatus, CheckpointStatus
from watermark_dagster.demo import DemoPaths
from watermark_dagster.store import WatermarkStore

SCRIPT = Path(sys.executable).with_name("watermark")
PIPELINES = {
    "orders_enriched": ["orders", "customers"],
    "customer_payments": ["customers", "payments"],
}


def _java_shim(tmp_path: Path) -> tuple[Path, Path]:
    """A JAVA_HOME whose bin/java appends its arguments to a log, then runs the real java."""
    real = os.path.realpath(
        os.path.join(os.environ["JAVA_HOME"], "bin", "java")
        if os.environ.get("JAVA_HOME")
        else shutil.which("java") or "java"
    )
    launches = tmp_path / "java-launches.log"
    home = tmp_path / "java-shim"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f'#!/bin/sh\necho "$*" >> "{launches}"\nexec "{real}" "$@"\n')
    java.chmod(0o755)
    return home, launches


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
    """Two completed batches: b000001 ran both pipelines; b000002 changed only orders, so
    only orders_enriched ran it. Every upstream is fully committed and every target exists:
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


def _env(home: Path, java_home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "WATERMARK_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "JAVA_HOME": str(java_home),
        "NO_COLOR": "1",
    }


def test_watermark_run_with_nothing_to_do_starts_no_jvm(home: Path, tmp_path: Path) -> None:
    java_home, launches = _java_shim(tmp_path)
    proc = subprocess.run(
        [str(SCRIPT), "run", "--json"],
        env=_env(home, java_home),
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


# Executes run requests the way `watermark run` does (HeadlessRunner) and then as a UI
# backfill does (the batch job on one partition), printing what the caller checks.
_BACKFILL = textwrap.dedent(
    """
    import json, sys
    from dagster import AssetKey, DagsterInstance, RunRequest, SensorResult
    from watermark_dagster.dagster_defs.assets import SKIPPED_TAG
    from watermark_dagster.dagster_defs.resources import held_spark_sessions, spark_was_started
    from watermark_dagster.definitions import defs
    from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner

    partition, pipeline = sys.argv[1], sys.argv[2]
    instance = DagsterInstance.get()
    instance.add_dynamic_partitions("watermark_batches", ["b000001", "b000002"])
    lines = []
    runner = HeadlessRunner(defs, instance, log=lines.append)
    report = CycleReport()
    request = RunRequest(partition_key=partition, asset_selection=[AssetKey(pipeline)])
    with held_spark_sessions():
        runner.execute_requests(SensorResult(run_requests=[request]), report)
    job = defs.resolve_job_def("watermark_batch_job")
    direct = job.execute_in_process(
        instance=instance, partition_key=partition, asset_selection=[AssetKey(pipeline)]
    )
    [run] = report.runs
    logs = [
        e.user_message
        for r in (run.run_id, direct.run_id)
        for e in instance.all_logs(r)
        if "SKIPPED" in (e.user_message or "")
    ]
    print(json.dumps({
        "jvm": spark_was_started(),
        "success": [run.success, direct.success],
        "skipped": run.skipped,
        "lines": lines,
        "run_log": logs,
        "tags": [
            instance.get_run_by_id(r).tags.get(SKIPPED_TAG) for r in (run.run_id, direct.run_id)
        ],
    }))
    """
)


@pytest.mark.parametrize(
    ("partition", "pipeline", "kind", "words"),
    [
        pytest.param("b000001", "orders_enriched", "superseded", "superseded", id="superseded"),
        pytest.param("b000002", "customer_payments", "not_in_batch", "no upstream", id="noop"),
    ],
)
def test_a_run_that_skips_starts_no_jvm_and_says_why(
    home: Path, tmp_path: Path, partition: str, pipeline: str, kind: str, words: str
) -> None:
    java_home, launches = _java_shim(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", _BACKFILL, partition, pipeline],
        env=_env(home, java_home),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not launches.exists(), launches.read_text()
    assert out["jvm"] is False
    assert out["success"] == [True, True]
    # The headless progress line, the run's own log and its tags all say it skipped.
    assert words in out["skipped"][pipeline]
    [line] = out["lines"]
    assert f"{pipeline} SKIPPED" in line
    assert words in line
    assert len(out["run_log"]) == 2
    assert all(words in m for m in out["run_log"])
    assert out["tags"] == [f"{pipeline}={kind}"] * 2


def test_headless_ticks_reuse_the_open_instance(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A headless tick evaluates the sensors on the runner's open instance: no new instance
    from its ref (a storage connection and a schema check every tick, every batch)."""
    from dagster import DagsterInstance

    from watermark_dagster.dagster_defs.headless import HeadlessRunner
    from watermark_dagster.dagster_defs.sensors import COORDINATOR, FINALIZER
    from watermark_dagster.definitions import build_demo_definitions

    opened: list[object] = []
    from_ref = DagsterInstance.from_ref

    def counting_from_ref(ref: object) -> DagsterInstance:
        opened.append(ref)
        return from_ref(ref)  # type: ignore[arg-type]

    with DagsterInstance.from_config(str(home / "dagster")) as instance:
        runner = HeadlessRunner(build_demo_definitions(home), instance)
        monkeypatch.setattr(DagsterInstance, "from_ref", staticmethod(counting_from_ref))
        for name in (COORDINATOR, FINALIZER, COORDINATOR):
            result = runner.tick(name)
            assert not result.run_requests  # everything is committed: nothing to plan
    assert opened == []
