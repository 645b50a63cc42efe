"""Real Spark servers on loopback for the scale tier, each in its own process group and
stopped with no process left behind: a standalone cluster (a master and two workers from
the installed PySpark distribution) and a Spark Connect server with Delta's jars.

Both are started with ``spark-class``/``spark-submit`` exactly as an operator would start
them on a cluster's machines; only the addresses (127.0.0.1, free ports) are the test's.
"""

import contextlib
import importlib.metadata
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import SPARK_TEST_CONF
from watermark_dagster.runtime.spark import DELTA_CONF, cached_delta_jars

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_SECONDS = 300
# A server that has not stopped 20 s after SIGTERM is killed (a Connect server whose client
# went away has been seen to ignore SIGTERM for a minute under load); the tests still check
# that no process of its group is left.
STOP_TIMEOUT_SECONDS = 20


def spark_bin(name: str) -> str:
    """A launcher script of the installed PySpark distribution (``spark-class``...)."""
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / name)


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def delta_jar_args() -> list[str]:
    """``spark-submit`` arguments putting Delta's jars on a server: the cached files the
    install step resolved, else the package (resolved by Ivy)."""
    jars = cached_delta_jars()
    if jars:
        return ["--conf", f"spark.jars={','.join(jars)}"]
    delta = importlib.metadata.version("delta-spark")
    return ["--packages", f"io.delta:delta-spark_4.2_2.13:{delta}"]


def _loopback_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **dict(extra or {})}


@dataclass
class Server:
    """One started server process (its own process group) and its log."""

    name: str
    process: subprocess.Popen
    log: Path

    def tail(self) -> str:
        """The end of the server's log, for failure messages."""
        return self.log.read_text(errors="replace")[-4000:]

    def wait_for(self, ready: Callable[[str], bool]) -> None:
        """Block until ``ready(log text)``; fail with the log if the process exits first."""
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not ready(self.log.read_text(errors="replace")):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{self.tail()}")
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM the process group and wait until every process of it is gone; SIGKILL
        what is left after :data:`STOP_TIMEOUT_SECONDS` (the launcher scripts' children
        outlive the leader by a moment)."""
        pgid = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while group_alive(pgid) and time.monotonic() < deadline:
            self.process.poll()  # reap the leader, so only live members keep the group
            time.sleep(0.2)
        if group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            # Killed members linger until reaped (by the leader, or by init once the
            # leader is gone): wait for that too, so "no process left" means it.
            deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
            while group_alive(pgid) and time.monotonic() < deadline:
                self.process.poll()
                time.sleep(0.2)
        self.process.wait()


def start(
    name: str,
    argv: list[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    *,
    inherit: bool = True,
) -> Server:
    """Start ``argv`` in a new process group with its output in ``log``: with loopback
    addresses and ``env`` over this process's environment, or (``inherit`` off) with
    ``env`` alone."""
    with log.open("w") as out:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_loopback_env(env) if inherit else dict(env or {}),
            start_new_session=True,
        )
    return Server(name, process, log)


def group_alive(pgid: int) -> bool:
    """True while any process of the group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass(frozen=True)
class Cluster:
    """A running standalone cluster."""

    master_url: str
    servers: tuple[Server, ...]


@contextmanager
def standalone_cluster(
    folder: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g"
) -> Iterator[Cluster]:
    """A master and ``workers`` workers on loopback; every process group is gone after."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    env = {
        # Keep the daemons small: the workers' own heap, not the executors'.
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": SPARK_TEST_CONF["spark.driver.extraJavaOptions"],
        "SPARK_WORKER_DIR": str(folder / "work"),
    }
    servers: list[Server] = []
    with ExitStack() as stack:
        try:
            master = start(
                "spark master",
                [
                    spark_bin("spark-class"),
                    MASTER_CLASS,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(free_port()),
                ],
                folder / "master.log",
                env,
            )
            servers.append(master)
            master.wait_for(lambda text: "I have been elected leader" in text)
            for i in range(workers):
                worker = start(
                    f"spark worker {i}",
                    [
                        spark_bin("spark-class"),
                        WORKER_CLASS,
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        str(cores),
                        "--memory",
                        memory,
                        "--webui-port",
                        str(free_port()),
                        url,
                    ],
                    folder / f"worker-{i}.log",
                    env,
                )
                servers.append(worker)
            for worker in servers[1:]:
                worker.wait_for(lambda text: "Successfully registered with master" in text)
            yield Cluster(url, tuple(servers))
        finally:
            for server in reversed(servers):
                stack.callback(server.stop)


@contextmanager
def connect_server(
    folder: Path, *, delta: bool = True, conf: Mapping[str, str] | None = None
) -> Iterator[tuple[str, Server]]:
    """A Spark Connect server on a loopback port (``local[2]`` inside), with Delta's jars
    and SQL extension unless ``delta`` is False; yields its ``sc://`` URL."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    settings = {
        **(DELTA_CONF if delta else {}),
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "1g",
        # A server that lives for one test: the quick JIT and the serial collector, as for
        # the tests' short-lived drivers (tests/conftest.py).
        "spark.driver.extraJavaOptions": SPARK_TEST_CONF["spark.driver.extraJavaOptions"],
        # Small logs: one partition to rebuild a Delta snapshot, not Delta's 50 tasks.
        "spark.databricks.delta.snapshotPartitions": "1",
        **dict(conf or {}),
    }
    argv = [
        spark_bin("spark-submit"),
        "--class",
        CONNECT_SERVER_CLASS,
        "--master",
        "local[2]",
        *(delta_jar_args() if delta else []),
        *[a for k, v in settings.items() for a in ("--conf", f"{k}={v}")],
        "spark-internal",
    ]
    server = start("spark connect server", argv, folder / "connect-server.log")
    try:
        server.wait_for(lambda text: "Spark Connect server started" in text)
        yield f"sc://127.0.0.1:{port}", server
    finally:
        server.stop()
