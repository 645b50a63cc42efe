"""Lag and health as Dagster signals under a real ``dagster dev``, read through GraphQL.

A small code location (one upstream written with delta-rs, one Spark pipeline whose
transform raises while a marker file exists) runs under ``dagster dev`` with nothing
launched by hand: the coordinator's lag and stuck-batch checks pass after the first batch;
with the marker in place the next batch's run fails and the batch is stuck, so the stuck
check fails naming the run's error and the lag check fails as the upstream runs ahead;
once the marker is gone and ``watermark run --retry`` recovers the batch, both pass again.
The retention check is evaluated on its own: by the coordinator's first look, then by its schedule.
"""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from tests.conftest import REPO, SPARK_TEST_CONF
from tests.support.dagster_dev import WATERMARK, DagsterDev
from tests.support.ports import free_port
from tests.support.spec_lake import commit_rows
from watermark_dagster.dagster_defs.checks import RETENTION_CHECK
from watermark_dagster.dagster_defs.health_lag import LAG_CHECK
from watermark_dagster.dagster_defs.health_stuck import STUCK_CHECK
from watermark_dagster.dagster_defs.names import RETENTION_JOB
from watermark_dagster.store import WatermarkStore

pytestmark = [pytest.mark.live, pytest.mark.spark, pytest.mark.e2e]

STARTUP_TIMEOUT = 300  # bounds on waiting (two test workers may share the cores)
BATCH_TIMEOUT = 900  # a Spark run; slow on a loaded 2-core machine
RETENTION_TIMEOUT = 150  # a cron of every minute, plus a run process's start

MODULE = '''"""The code location of test_live_health.py."""

from pathlib import Path

from tests.support.lakes import copy_rows
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream_kinds import declare_upstream
from watermark_dagster.dagster_defs.definitions import build_definitions
from watermark_dagster.dagster_defs.health import HealthSettings
from watermark_dagster.dagster_defs.resources import SparkSessionResource
from watermark_dagster.dagster_defs.settings import WatermarkSettings

ROOT = Path({root!r})
MARKER = ROOT / "fail"
_copy = copy_rows("up")


def transform(batch):
    """Copies the upstream's rows, or fails while the marker file exists."""
    if MARKER.exists():
        raise RuntimeError(f"injected failure: {{MARKER}} exists")
    return _copy(batch)


defs = build_definitions(
    Registry(
        upstreams=[declare_upstream(name="up", path=str(ROOT / "up"))],
        pipelines=[
            Pipeline(
                name="copy",
                upstreams=("up",),
                target=str(ROOT / "target"),
                keys=("id",),
                transform=transform,
            )
        ],
    ),
    control_root=str(ROOT / "control"),
    spark=SparkSessionResource(master="local[1]", conf={conf!r}),
    settings=WatermarkSettings(
        min_batch_interval_seconds=0,
        sensor_interval_seconds=3,
        max_attempts=1,
        health=HealthSettings(
            lag_max_versions=1, observe_every_seconds=0, retention_check_cron="* * * * *"
        ),
    ),
)
'''

EXECUTIONS = """
query Executions($key: AssetKeyInput!, $check: String!) {
  assetCheckExecutions(assetKey: $key, checkName: $check, limit: 20) {
    runId
    evaluation { success description }
    run { jobName }
  }
}
"""

MATERIALIZING_RUNS = """
query Runs($job: String!) {
  runsOrError(filter: {pipelineName: $job}) {
    ... on Runs { results { runId status assetSelection { path } } }
  }
}
"""


def _executions(dev: DagsterDev, asset: str, check: str) -> list[dict[str, Any]]:
    """Evaluations of a check, newest first (executions without one left out)."""
    data = dev.graphql(EXECUTIONS, {"key": {"path": [asset]}, "check": check})
    return [e for e in data["assetCheckExecutions"] if e["evaluation"] is not None]


def _latest(dev: DagsterDev, asset: str, check: str) -> dict[str, Any] | None:
    found = _executions(dev, asset, check)
    return found[0]["evaluation"] if found else None


def _passing(dev: DagsterDev, asset: str, check: str) -> bool:
    latest = _latest(dev, asset, check)
    return latest is not None and latest["success"]


def _failing(dev: DagsterDev, asset: str, check: str) -> dict[str, Any] | None:
    latest = _latest(dev, asset, check)
    return latest if latest is not None and not latest["success"] else None


def _caught_up(store: WatermarkStore, version: int) -> bool:
    return store.committed_versions().get("up") == version and store.open_batch() is None


def test_lag_stuck_and_retention_checks_under_dagster_dev(
    tmp_path: Path, dagster_home: Path
) -> None:
    root = tmp_path / "lake"
    root.mkdir()
    commit_rows(root / "up", [1, 2])
    conf = {
        **SPARK_TEST_CONF,
        "spark.sql.shuffle.partitions": "1",
        "spark.default.parallelism": "1",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }
    (root / "health_location.py").write_text(MODULE.format(root=str(root), conf=conf))
    (root / "workspace.yaml").write_text(
        "load_from:\n  - python_module:\n      module_name: health_location\n"
        f"      attribute: defs\n      working_directory: {root}\n"
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home),
        "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("WATERMARK_SPARK_REMOTE", None)
    env.pop("WATERMARK_ENGINE", None)
    # Create the instance's storages before dagster dev's processes race to (see
    # test_live_daemon_checks.py).
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    instance.get_runs(limit=1)
    instance.dispose()
    store = WatermarkStore(root / "control")

    dev = DagsterDev(cwd=root, env=env, port=free_port(), log_path=tmp_path / "dev.log")
    try:
        # 1. The first batch runs on its own; then both checks pass.
        dev.wait_for("the first batch", lambda: _caught_up(store, 0), BATCH_TIMEOUT)
        dev.wait_for(
            "passing lag and stuck checks",
            lambda: _passing(dev, "up", LAG_CHECK) and _passing(dev, "copy", STUCK_CHECK),
            STARTUP_TIMEOUT,
        )

        # 2. The pipeline fails on the next batch (max_attempts=1: stuck at once), while the
        # upstream runs two versions ahead of its watermark (over lag_max_versions=1).
        (root / "fail").write_text("")
        commit_rows(root / "up", [3])
        commit_rows(root / "up", [4])
        stuck = dev.wait_for(
            "a failing stuck check", lambda: _failing(dev, "copy", STUCK_CHECK), BATCH_TIMEOUT
        )
        batch = store.open_batch()
        assert batch is not None
        assert batch.batch_id in stuck["description"]
        assert "injected failure" in stuck["description"], stuck  # the run's error
        assert "watermark run --retry" in stuck["description"]  # the fix
        lag = dev.wait_for(
            "a failing lag check", lambda: _failing(dev, "up", LAG_CHECK), STARTUP_TIMEOUT
        )
        assert "2 version(s) behind" in lag["description"], lag

        # 3. The cause removed, the operator recovers the batch; both checks pass again.
        (root / "fail").unlink()
        retried = subprocess.run(
            [str(WATERMARK), "run", "--retry", "--defs", "health_location:defs"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=BATCH_TIMEOUT,
        )
        assert retried.returncode == 0, retried.stdout + retried.stderr
        dev.wait_for("the recovered batches", lambda: _caught_up(store, 2), BATCH_TIMEOUT)
        dev.wait_for(
            "passing lag and stuck checks again",
            lambda: _passing(dev, "up", LAG_CHECK) and _passing(dev, "copy", STUCK_CHECK),
            STARTUP_TIMEOUT,
        )

        # 4. The retention check was evaluated with nobody launching it: by the coordinator's
        # first look, then by its schedule's runs, which materialized nothing.
        executions = dev.wait_for(
            "a retention check evaluation by the schedule's run",
            lambda: [
                e
                for e in _executions(dev, "up", RETENTION_CHECK)
                if (e["run"] or {}).get("jobName") == RETENTION_JOB
            ],
            RETENTION_TIMEOUT,
        )
        assert all(e["evaluation"]["success"] for e in executions), executions
        runs = dev.graphql(MATERIALIZING_RUNS, {"job": RETENTION_JOB})["runsOrError"]["results"]
        assert runs
        assert all(not r["assetSelection"] for r in runs), runs
    finally:
        dev.stop()
    assert not dev.leftovers, dev.leftovers
