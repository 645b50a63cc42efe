"""The resident engine: `watermark engine` keeps one warm Spark session and the runs of
`watermark run` (WATERMARK_ENGINE=resident) send their pipelines to it, starting no JVM of
their own; without an engine, runs fall back to their own session.

Real processes throughout: the engine and every `watermark run` are console-script
subprocesses; the run processes get a JAVA_HOME shim that records any JVM launch.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from tests.conftest import REPO, SPARK_TEST_CONF
from tests.dagster.test_no_jvm import _java_shim
from watermark_dagster.dagster_defs.assets import ENGINE_TAG
from watermark_dagster.demo import DemoPaths, apply_round, seed
from watermark_dagster.demo.verify import compare_with_full_recompute
from watermark_dagster.runtime.engine import EngineAddress

pytestmark = pytest.mark.spark

SCRIPT = Path(sys.executable).with_name("watermark")


def _run(env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [str(SCRIPT), "run", "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _engine_tags(dagster_home: Path) -> list[str | None]:
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        return [r.tags.get(ENGINE_TAG) for r in reversed(instance.get_runs())]
    finally:
        instance.dispose()


def _assert_exact(spark, paths: DemoPaths) -> None:
    for check in compare_with_full_recompute(spark, paths):
        assert check.ok, (check.target, check.missing, check.unexpected)


def test_runs_use_the_resident_engine_then_fall_back_without_it(
    spark,
    tmp_path: Path,
) -> None:
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    dagster_home = paths.home / "dagster"
    dagster_home.mkdir(parents=True)
    shutil.copy(REPO / "dagster.yaml", dagster_home / "dagster.yaml")
    env = {
        **os.environ,
        "WATERMARK_HOME": str(paths.home),
        "DAGSTER_HOME": str(dagster_home),
        "WATERMARK_ENGINE": "resident",
        "WATERMARK_SPARK_MASTER": "local[2]",
        "WATERMARK_SPARK_CONF": json.dumps(SPARK_TEST_CONF),
        "NO_COLOR": "1",
    }
    address = EngineAddress.under(paths.home)
    log = tmp_path / "engine.log"
    with log.open("w") as out:
        engine = subprocess.Popen(
            [str(SCRIPT), "engine"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 600
        while not address.socket.exists():
            assert engine.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        assert address.key_file.stat().st_mode & 0o077 == 0  # the key is the user's only

        java_home, launches = _java_shim(tmp_path)
        run_env = {**env, "JAVA_HOME": str(java_home)}
        first = _run(run_env)  # the first loads
        apply_round(spark, paths, 1)
        second = _run(run_env)  # an incremental batch
        assert len(first["completed"]) == 1
        assert len(second["completed"]) == 1
        assert not launches.exists(), launches.read_text()  # no JVM in any run process
        tags = _engine_tags(dagster_home)
        assert tags, tags
        assert set(tags) == {f"resident:{engine.pid}"}, tags
        _assert_exact(spark, paths)
        assert "on batch b000002: done" in log.read_text()
    finally:
        engine.send_signal(signal.SIGTERM)  # the engine stops its Spark session and exits
        try:
            engine.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(engine.pid, signal.SIGKILL)  # anything left in its group
    assert engine.returncode == 0, log.read_text()[-3000:]
    assert not address.socket.exists()

    # Without an engine, the next batch runs in the run process's own Spark session.
    apply_round(spark, paths, 2)
    third = _run(run_env)
    assert len(third["completed"]) == 1
    assert launches.exists()
    assert "SparkSubmit" in launches.read_text()
    assert _engine_tags(dagster_home)[-1] == "process"
    _assert_exact(spark, paths)
