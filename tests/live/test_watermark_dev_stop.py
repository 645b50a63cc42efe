"""``watermark dev`` started outside the repository serves the code location and stops on
SIGTERM or SIGINT, leaving no process behind, even with a run in flight on its engine's JVM.

The code location is a registry file (``WATERMARK_REGISTRY``) over a Delta table written
with delta-rs; its one pipeline's transform never returns, so when the signal arrives a run
process and the engine's Spark JVM (the run's Connect server) are alive under
``watermark dev``. Every process seen under ``watermark dev`` before the signal must be
gone when it exits.
"""

import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.support.dagster_dev import STARTUP_TIMEOUT, WATERMARK, DagsterDev, dev_env
from tests.support.ports import free_port
from tests.support.process_tree import command_line, descendants, is_alive

pytestmark = [pytest.mark.live, pytest.mark.spark, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
# Enough for the interrupt, SIGTERM and SIGKILL steps of watermark dev's stop.
STOP_SECONDS = 10
RUN_START_TIMEOUT = 300

TRANSFORMS = '''
"""A transform that marks that its run (and so its Spark session) started, then stalls."""

import os
import time
from pathlib import Path


def stall(batch):
    Path(os.environ["WM_STALL_MARK"]).write_text(str(os.getpid()))
    time.sleep(3600)
'''

WORKSPACE_QUERY = """
{ workspaceOrError { __typename ... on Workspace {
    locationEntries { name loadStatus locationOrLoadError { __typename } } } } }
"""


def _loaded(dev: DagsterDev) -> bool:
    data = dev.try_graphql(WORKSPACE_QUERY)
    if not data or data["workspaceOrError"]["__typename"] != "Workspace":
        return False
    entries = data["workspaceOrError"]["locationEntries"]
    return any(
        e["name"] == "watermark_dagster"
        and e["loadStatus"] == "LOADED"
        and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
        for e in entries
    )


# SIGINT (Ctrl-C) takes the same path as SIGTERM (interrupt, then escalate); it runs with
# -m slow to keep the default suite's time (tests/dagster/test_cli_dev.py covers the paths).
@pytest.mark.parametrize(
    "signum",
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
    ids=["SIGTERM", "SIGINT"],
)
def test_watermark_dev_from_elsewhere_stops_on_a_signal_with_a_run_in_flight(
    tmp_path: Path, dagster_home: Path, watermark_home: Path, signum: int
) -> None:
    elsewhere = tmp_path / "elsewhere"  # not the repository: no workspace.yaml here
    elsewhere.mkdir()
    write_deltalake(
        str(tmp_path / "up"), pa.table({"id": pa.array([1, 2], pa.int64()), "value": [1, 2]})
    )
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "wm_dev_stop_transforms.py").write_text(TRANSFORMS)
    registry = elsewhere / "registry.yaml"
    registry.write_text(
        textwrap.dedent(
            f"""\
            control_root: {tmp_path / "control"}
            upstreams:
              up: {{path: {tmp_path / "up"}}}
            pipelines:
              up_stalled:
                upstreams: [up]
                target: {tmp_path / "target"}
                keys: [id]
                transform: wm_dev_stop_transforms:stall
            """
        )
    )
    mark = tmp_path / "run-started"
    env = dev_env(dagster_home, watermark_home)
    env.update(
        # Relative on purpose: watermark dev hands the code server an absolute path.
        WATERMARK_REGISTRY="registry.yaml",
        WM_STALL_MARK=str(mark),
        PYTHONPATH=os.pathsep.join(p for p in (str(modules), env.get("PYTHONPATH", "")) if p),
    )
    port = free_port()
    dev = DagsterDev(
        cwd=elsewhere,
        env=env,
        port=port,
        log_path=tmp_path / "watermark_dev.log",
        command=[str(WATERMARK), "dev", "--host", "127.0.0.1", "--port", str(port)],
    )
    try:
        dev.wait_for("the code location to load", lambda: _loaded(dev), STARTUP_TIMEOUT)
        dev.wait_for("a run's transform to start", mark.exists, RUN_START_TIMEOUT)
        dev.track()
        tree = {
            pid: (start, command_line(pid))
            for pid, (start, _ppid) in descendants(dev.proc.pid).items()
        }
        assert any("java" in cmd and "SparkSubmit" in cmd for _, cmd in tree.values()), dev.explain(
            f"no Spark JVM under watermark dev: {tree}"
        )
        run_pid = int(mark.read_text())
        assert run_pid in tree, dev.explain(f"run process {run_pid} not under watermark dev")

        dev.proc.send_signal(signum)
        try:
            code = dev.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(dev.explain(f"watermark dev still running {STOP_SECONDS}s after {signum}"))
        left = {pid: cmd for pid, (start, cmd) in tree.items() if is_alive(pid, start)}
        assert not left, dev.explain(f"processes left after watermark dev exited: {left}")
        assert code == 0, dev.explain(f"watermark dev exited {code}")
        assert (dagster_home / "workspace.yaml").is_file()
    finally:
        dev.stop()
    assert not dev.leftovers, "\n".join(dev.leftovers)
