"""A command killed with SIGKILL takes every process it started with it (issue 64, item 10).

Each command runs as a console script with a mark of its own in its environment
(``WATERMARK_TEST_TREE``), which every process it starts inherits: a process whose
``/proc/PID/environ`` holds the mark is one of the command's, wherever it was re-parented
and whatever process group or session it moved to. The command is killed (SIGKILL: it can
run no cleanup) while its children work: ``watermark run`` inside a batch's write, with its
Spark JVM running a task; ``watermark engine`` with its Spark Connect server up;
``watermark dev`` with ``dagster dev``'s webserver, daemon and code server and the engine's
JVM up. Within a bounded wait no process with the mark may be left.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.cli import SCRIPT
from tests.support.dagster_dev import WATERMARK, dev_env
from tests.support.lakes import location_path, write_spec
from tests.support.ports import free_port
from tests.support.process_tree import command_line
from tests.support.spec_lake import up_copy_lake

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

MARK = "WATERMARK_TEST_TREE"
START_TIMEOUT = 600  # a bound, not an expectation: the JVMs share two cores with the suite
# How long the children of a killed command may take to end: the kernel's SIGKILL of a
# child whose parent died is immediate; a JVM told by its closed stdin runs its shutdown
# hooks first.
GONE_SECONDS = 30

HELD = '''
"""The code location of spec.json whose pipeline's write holds in a Spark task."""

import json
import os
import time
from pathlib import Path

from pyspark.sql import functions as F

from tests.support import lakes


def _hold(value):
    # In a Python worker of a Spark task: the batch's write is running in the JVM.
    mark = os.environ.get("WM_HOLD_MARK")
    if mark:
        Path(mark).write_text(str(os.getpid()))
        time.sleep(3600)
    return value


def held(upstream):
    inner = lakes.copy_rows(upstream)

    def transform(batch):
        return inner(batch).withColumn("value", F.udf(_hold, "bigint")(F.col("value")))

    return transform


lakes.TRANSFORMS["held"] = held
defs = lakes.defs_from(json.loads(Path(__file__).with_name("spec.json").read_text()))
'''


def _marked(tag: str) -> dict[int, str]:
    """The command line of every live process whose environment holds ``MARK=tag``, by pid."""
    needle = f"{MARK}={tag}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state not in ("Z", "X"):
            found[int(entry)] = command_line(int(entry))
    return found


def _wait(what: str, condition, process: subprocess.Popen, log: Path, timeout=START_TIMEOUT):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert process.poll() is None, (
            f"exited {process.returncode} before {what}: " + (log.read_text()[-3000:])
        )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
    return found


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def _command(argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> Iterator[tuple]:
    """``argv`` started with a fresh mark; yields (process, mark). On leaving, whatever
    still holds the mark is killed by its pid (what the test found left, if it failed)."""
    tag = uuid.uuid4().hex
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            env={**env, MARK: tag},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process, tag
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for pid in _marked(tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _assert_all_gone(process: subprocess.Popen, tag: str, log: Path) -> None:
    """SIGKILL ``process``, then wait until no process holds the mark."""
    before = _marked(tag)
    process.kill()
    assert process.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + GONE_SECONDS
    while (left := _marked(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, (
        f"{GONE_SECONDS} s after the command was killed, processes it started still run: "
        f"{_short(left)} (of {_short(before)}); its output:\n{log.read_text()[-2000:]}"
    )


def _short(found: dict[int, str]) -> dict[int, str]:
    """Command lines cut to their program and last words (a JVM's is pages long)."""
    return {pid: c if len(c) < 160 else f"{c[:60]} ... {c[-90:]}" for pid, c in found.items()}


def test_a_killed_run_leaves_no_process_and_writes_nothing(
    spark, tmp_path: Path, dagster_home: Path
) -> None:
    """`watermark run` SIGKILLed while its batch's write runs a Spark task: its worker
    process, its JVM and the JVM's Python workers all end, and the target gains no row;
    the next `watermark run` applies the batch once."""
    lake = up_copy_lake(tmp_path, dagster_home, spark_master="local[1]")
    lake.spec["pipelines"][0]["transform"] = "held"
    spec_file = write_spec(tmp_path / "spec.json", lake.spec)
    (tmp_path / "lake_spec.py").write_text(HELD)  # the module location_defs names
    hold = tmp_path / "held"
    env = {
        **os.environ,
        "PYTHONPATH": location_path(spec_file),
        "DAGSTER_HOME": str(dagster_home),
        "WM_HOLD_MARK": str(hold),
    }
    argv = [str(SCRIPT), "run", "--defs", "lake_spec:defs"]
    log = tmp_path / "run.log"
    with _command(argv, env, log, REPO) as (process, tag):
        _wait("the batch's write to run", hold.exists, process, log)
        under = _marked(tag)
        assert any("java" in c and "SparkSubmit" in c for c in under.values()), under
        assert int(hold.read_text()) in under  # the Spark task's Python worker
        _assert_all_gone(process, tag, log)
    target = str(tmp_path / "up_copy")
    assert not (tmp_path / "up_copy" / "_delta_log").exists() or not _rows(spark, target)

    env.pop("WM_HOLD_MARK")
    again = subprocess.run(
        argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=START_TIMEOUT
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert _rows(spark, target) == [(i, i) for i in range(3)]


def _rows(spark, path: str) -> list[tuple]:
    return sorted(
        tuple(r) for r in spark.read.format("delta").load(path).select("id", "value").collect()
    )


def _engine_env(home: Path) -> dict[str, str]:
    from tests.conftest import SPARK_TEST_CONF

    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {
        **os.environ,
        "WATERMARK_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        "WATERMARK_SPARK_MASTER": "local[1]",
        "WATERMARK_SPARK_CONF": json.dumps(SPARK_TEST_CONF),
    }
    for name in ("WATERMARK_ENGINE", "WATERMARK_SPARK_REMOTE", "WATERMARK_REGISTRY"):
        env.pop(name, None)
    return env


def test_a_killed_engine_leaves_no_spark_connect_server(tmp_path: Path) -> None:
    """`watermark engine` SIGKILLed with its Spark Connect server up: the server's JVM
    ends too."""
    home = tmp_path / "wm"
    log = tmp_path / "engine.log"
    with _command([str(SCRIPT), "engine"], _engine_env(home), log, REPO) as (process, tag):
        record = home / "engine" / "connect.json"
        _wait("the engine to record its server", record.exists, process, log)
        port = json.loads(record.read_text())["port"]
        _wait("the server to listen", lambda: _listening(port), process, log)
        under = _marked(tag)
        assert any("SparkConnectServer" in c for c in under.values()), under
        _assert_all_gone(process, tag, log)


@pytest.mark.live
def test_a_killed_watermark_dev_leaves_no_process(
    tmp_path: Path, dagster_home: Path, watermark_home: Path
) -> None:
    """`watermark dev` SIGKILLed with dagster dev (webserver, daemon, code server) and the
    home's engine up: every one of them ends."""
    env = dev_env(dagster_home, watermark_home)  # the demo code location
    env.pop("WATERMARK_REGISTRY", None)
    port = free_port()
    argv = [str(WATERMARK), "dev", "--host", "127.0.0.1", "--port", str(port)]
    log = tmp_path / "dev.log"
    with _command(argv, env, log, tmp_path) as (process, tag):
        _wait("the webserver to listen", lambda: _listening(port), process, log)
        under = _marked(tag)
        assert any("SparkConnectServer" in c for c in under.values()), under
        assert any("dagster" in c and "daemon" in c for c in under.values()), under
        _assert_all_gone(process, tag, log)
