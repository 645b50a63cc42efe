"""A real `dagster-daemon` shows the recreated upstream's failing continuity check with
nothing launched by hand (the no-daemon cases are in tests/dagster/test_blocked_upstreams.py)."""

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef

from tests.support.blocked import RESET, blocked_lake, check_history, recreate
from tests.support.cli import DAEMON
from tests.support.lakes import location_defs, location_path, write_spec
from tests.support.spec_lake import Lake


@pytest.fixture
def lake(tmp_path: Path, dagster_home: Path) -> Lake:
    """Two upstreams, each read by one pipeline; a first batch already applied."""
    return blocked_lake(tmp_path, dagster_home)


@pytest.mark.live
def test_the_daemon_shows_the_failing_check_without_a_click(lake: Lake) -> None:
    """A real ``dagster-daemon`` ticks the coordinator on its own; the recreated upstream's
    check turns failing in the instance with nobody launching anything."""
    lake.spec["sensor_interval_seconds"] = 1
    spec_file = write_spec(lake.root / "spec.json", lake.spec)
    workspace = lake.root / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_module:\n"
        f"      module_name: {location_defs(spec_file).split(':')[0]}\n"
        f"      attribute: defs\n      working_directory: {spec_file.parent}\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": location_path(spec_file),
        "DAGSTER_HOME": str(lake.dagster_home),
    }
    # Create the instance's SQLite storages before the daemon and its code server start:
    # two processes creating them at once can stamp two alembic heads (seen on a fresh
    # clone: "Version table 'alembic_version' has more than one head present").
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(lake.dagster_home)))
    instance.get_runs(limit=1)
    log = (lake.root / "daemon.log").open("w")
    daemon = subprocess.Popen(
        [str(DAEMON), "run", "-w", str(workspace)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def wait_for(predicate: Any, what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            assert daemon.poll() is None, (lake.root / "daemon.log").read_text()[-3000:]
            time.sleep(1)
        raise AssertionError(f"{what}: {(lake.root / 'daemon.log').read_text()[-3000:]}")

    try:
        wait_for(lambda: check_history(instance, "up"), "no continuity check reported")
        assert [e.passed for e in check_history(instance, "up")] == [True]
        recreate(lake, 5)
        wait_for(
            lambda: not check_history(instance, "up")[-1].passed,
            "the recreated upstream's check never failed",
        )
        failed = check_history(instance, "up")[-1]
        assert RESET in failed.description
        assert len(lake.store.batches()) == 1  # nothing planned for it
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
        log.close()
        instance.dispose()
