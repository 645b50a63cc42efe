"""``dagster dev`` (or ``watermark dev``) on a loopback port, as the live tests run it: in
its own process group, its output in a log file, every process it starts tracked until it
is stopped, and its GraphQL API to watch it through."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from deltalake.exceptions import DeltaError

from tests.conftest import REPO
from tests.support.process_tree import (
    ProcInfo,
    command_line,
    descendants,
    is_alive,
    is_spark_driver,
    proc_stat,
)

DAGSTER = Path(sys.executable).with_name("dagster")
if not DAGSTER.exists():  # run by another interpreter: fall back to the repository's venv
    DAGSTER = REPO / ".venv" / "bin" / "dagster"
# The `watermark` console script installed beside DAGSTER.
WATERMARK = DAGSTER.with_name("watermark")

# Bounds on waiting, not expectations: the suite runs in two worker processes on two
# cores (README), so the other worker's Spark work may share the machine.
STARTUP_TIMEOUT = 300
# Dagster's sensor daemon looks at its sensors every 5 s (MIN_INTERVAL_LOOP_TIME) and skips
# one whose last tick is younger than its interval: at 5 s most looks came just short and a
# tick ran every 10 s; at 3 s one runs at each look.
SENSOR_INTERVAL_SECONDS = 3
# A batch is planned at the coordinator's first tick after a commit. The commits of the
# round (spread over 10-40 s) land in one batch because the coordinator is stopped while
# they are made, as an operator would (`_coordinator_stopped` of
# tests/live/test_live_dagster_dev.py); were a tick to slip in anyway, the test still passes
# (every check holds for any number of batches).
MIN_BATCH_INTERVAL_SECONDS = 0
POLL_SECONDS = 2.0
WATCH_SECONDS = 0.5
LOG_TAIL_LINES = 120


class DagsterDev:
    """``dagster dev`` (or ``command``, which starts it on ``port``) in its own process
    group, its output in a log file.

    A watcher thread remembers every descendant it ever sees (pid, start time, parent,
    command line): one that left the process group or was re-parented is still stopped, by
    its own pid, at the end, and the test can count the JVMs each run started.
    """

    def __init__(
        self,
        *,
        cwd: Path,
        env: dict[str, str],
        port: int,
        log_path: Path,
        command: list[str] | None = None,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/graphql"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            command
            or [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        root_stat = proc_stat(self.proc.pid)
        self._lock = threading.Lock()
        self.drivers: dict[int, ProcInfo] = {}
        self.known: dict[int, ProcInfo] = {
            self.proc.pid: ProcInfo(
                root_stat[2] if root_stat else "?", os.getpid(), command_line(self.proc.pid)
            )
        }
        self.http = requests.Session()
        self.http.trust_env = False  # never go through a proxy: loopback only
        self.leftovers: list[str] = []
        self._stop_watching = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="dagster-dev-watcher")
        self._watcher.daemon = True
        self._watcher.start()

    # -- bookkeeping

    def _watch(self) -> None:
        while not self._stop_watching.wait(WATCH_SECONDS):
            self.track()

    def track(self) -> None:
        """Remember the current descendants."""
        if self.proc.poll() is not None:
            return
        for pid, (start, ppid) in descendants(self.proc.pid).items():
            # Read every time: spark-submit and spark-class exec into java in the same pid.
            info = ProcInfo(start, ppid, command_line(pid))
            with self._lock:
                if info.cmdline not in ("?", "") or pid not in self.known:  # "": a zombie
                    self.known[pid] = info
                if is_spark_driver(info.cmdline):
                    self.drivers[pid] = info

    def processes(self) -> dict[int, ProcInfo]:
        with self._lock:
            return dict(self.known)

    def alive(self) -> list[tuple[int, str]]:
        return [(pid, p.start) for pid, p in self.processes().items() if is_alive(pid, p.start)]

    def jvms_by_run(self, run_pids: set[int]) -> tuple[dict[int | None, list[int]], str]:
        """Spark driver JVMs seen, by the run process they descend from (None: no run).

        Also returns each driver's ancestry, for assertion messages.
        """
        procs = self.processes()
        with self._lock:
            drivers = dict(self.drivers)
        found: dict[int | None, list[int]] = {}
        chains = []
        for pid, info in sorted(drivers.items()):
            if info.ppid in drivers:
                # A JVM forks helpers (briefly carrying its command line) before they exec:
                # a real driver's parent is Python, never another driver.
                continue
            chain, owner, parent = [pid], None, info.ppid
            while parent in procs and parent not in chain:
                chain.append(parent)
                if parent in run_pids:
                    owner = parent
                    break
                parent = procs[parent].ppid
            found.setdefault(owner, []).append(pid)
            chains.append(
                f"driver {pid}: "
                + " <- ".join(f"{p} {procs.get(p, info).cmdline[:90]!r}" for p in chain)
            )
        return found, "\n".join(chains)

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log_text().splitlines()[-lines:]
        return f"\n---- last {len(text)} lines of {self.log_path} ----\n" + "\n".join(text)

    def explain(self, message: str) -> str:
        return message + self.log_tail()

    # -- GraphQL

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.http.post(
            self.url, json={"query": query, "variables": variables or {}}, timeout=60
        )
        assert response.status_code == 200, self.explain(
            f"GraphQL HTTP {response.status_code}: {response.text[:2000]}"
        )
        body = response.json()
        assert not body.get("errors"), self.explain(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def try_graphql(self, query: str, variables: dict[str, Any] | None = None) -> Any:
        """Like :meth:`graphql`, but None while the server cannot answer it yet."""
        try:
            response = self.http.post(
                self.url, json={"query": query, "variables": variables or {}}, timeout=60
            )
            body = response.json() if response.status_code == 200 else {}
        except (requests.RequestException, ValueError):
            return None
        return None if body.get("errors") else body.get("data")

    # -- waiting

    def wait_for(
        self, what: str, condition: Callable[[], Any], timeout: float, poll: float = POLL_SECONDS
    ) -> Any:
        """Poll ``condition`` until it returns something truthy; fail with the log tail."""
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                pytest.fail(self.explain(f"dagster dev exited ({code}) while waiting for {what}"))
            try:
                result = condition()
            except (requests.RequestException, OSError, DeltaError) as e:
                last_error, result = e, None  # e.g. a control table read racing a commit
            if result:
                return result
            time.sleep(poll)
        pytest.fail(
            self.explain(
                f"timed out after {timeout:.0f}s waiting for {what}"
                + (f" (last error: {last_error!r})" if last_error else "")
            )
        )

    # -- shutdown

    def stop(self) -> None:
        """SIGTERM the process group, wait, SIGKILL what is left; record survivors."""
        self._stop_watching.set()
        self._watcher.join(timeout=30)
        self.track()
        # The group id is dagster dev's pid, which cannot be reused while it is not reaped.
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)  # dagster dev maps SIGTERM to Ctrl-C
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and (self.proc.poll() is None or self.alive()):
            time.sleep(0.5)
        for pid, start in self.alive():  # stuck or gone astray: by pid, if still the same
            with contextlib.suppress(ProcessLookupError):
                if is_alive(pid, start):
                    os.kill(pid, signal.SIGKILL)
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=15)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.2)
        self.leftovers = [f"{pid}: {command_line(pid)[:300]}" for pid, _ in self.alive()]
        self.http.close()
        self._log.close()


def dev_env(dagster_home: Path, watermark_home: Path) -> dict[str, str]:
    """The environment ``dagster dev`` runs in: the test's homes, quick sensors, a small
    loopback-only Spark."""
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(dagster_home),
        WATERMARK_HOME=str(watermark_home),
        WATERMARK_SENSOR_INTERVAL_SECONDS=str(SENSOR_INTERVAL_SECONDS),
        WATERMARK_MIN_BATCH_INTERVAL_SECONDS=str(MIN_BATCH_INTERVAL_SECONDS),
        WATERMARK_SPARK_MASTER="local[1]",
        WATERMARK_SPARK_CONF=json.dumps(
            {
                "spark.sql.shuffle.partitions": "1",
                "spark.default.parallelism": "1",
                "spark.databricks.delta.snapshotPartitions": "1",
                # A short-lived driver on a small machine: the C1 JIT alone warms up sooner
                # (runs about 20% faster here) and the serial GC needs no extra threads.
                "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                # Loopback only (Spark would otherwise bind to the first non-loopback address).
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
            }
        ),
        SPARK_LOCAL_IP="127.0.0.1",
        # Show DeprecationWarnings (hidden by default outside __main__) so the log check of
        # tests/live/test_live_dagster_dev.py can see the ones raised from watermark_dagster's
        # code.
        PYTHONWARNINGS="default::DeprecationWarning",
        PYSPARK_PYTHON=sys.executable,
        PYTHONUNBUFFERED="1",
    )
    env.pop("WATERMARK_SPARK_REMOTE", None)
    env.pop("WATERMARK_ENGINE", None)  # `watermark dev` sets it for its children
    return env
