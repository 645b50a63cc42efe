"""The local engine: one long-lived Spark Connect server with Delta Lake, which every run of
a watermark home uses as a client, so a run process starts no JVM and finds Spark warm.

``watermark engine`` starts it (``watermark dev`` does by default) with the code location's
Spark settings: Delta's jars and SQL extension, the driver memory and the shuffle
partitions a run's own session would get, on a free loopback port. It records where it
listens in ``<WATERMARK_HOME>/engine/connect.json`` and logs to
``<WATERMARK_HOME>/logs/spark-connect.log``. A server that dies is started again on the
same port by the ``watermark engine`` process that watches it, which rewrites the record.
The server dies with that process however it ends, SIGKILL included (``PR_SET_PDEATHSIG``).

A run's Spark resource (:class:`~watermark_dagster.dagster_defs.resources.SparkSessionResource`)
reads the record: with ``engine="auto"`` (the default) it uses the server when one is up
for its home and starts its own JVM otherwise; with ``engine="connect"`` (what ``watermark
dev`` sets) it waits a while for a server that is restarting, then fails as retryable with
:class:`EngineUnavailableError`. Each run is a Connect session of its own: its temporary
views and settings are its own and go when the run releases it at its end. Spark's cache
is the server's, shared by its sessions: the pipelines unpersist every frame they persist.
Plans are built in the run process, so a registry change needs no restart.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from watermark_dagster.errors import WatermarkError
from watermark_dagster.runtime.lifetime import die_with_parent

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# How long a server gets to start (the first start may resolve Delta's jars), and how long a
# run with engine="connect" waits for a server that is restarting.
START_TIMEOUT_SECONDS = 300.0
WAIT_SECONDS = 120.0
STOP_SECONDS = 20.0
_POLL_SECONDS = 0.2


class EngineUnavailableError(WatermarkError):
    """No engine is up for the home, or the run's server went away under it. A run failing
    with it is retried like any run whose worker died: its write is one Delta commit,
    applied or not, and the retry skips what was applied."""


@dataclass(frozen=True)
class EngineRecord:
    """Where a home's engine listens, as ``watermark engine`` recorded it."""

    url: str
    port: int
    pid: int
    """The ``watermark engine`` process that watches the server (and restarts it)."""
    server_pid: int
    """The server's JVM."""
    log: str
    started: str
    restarts: int = 0


def engine_folder(home: Path) -> Path:
    """``<home>/engine``: the record of the home's engine."""
    return Path(home) / "engine"


def record_file(folder: Path) -> Path:
    """The record in an engine folder."""
    return Path(folder) / "connect.json"


def log_file(home: Path) -> Path:
    """``<home>/logs/spark-connect.log``: the server's output, appended at each start."""
    return Path(home) / "logs" / "spark-connect.log"


def read_record(folder: Path) -> EngineRecord | None:
    """The engine recorded in ``folder``, None when there is none (or it is unreadable)."""
    path = record_file(folder)
    try:
        return EngineRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_record(folder: Path, record: EngineRecord) -> None:
    """Record the engine atomically (readers see the old record or the new one)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = record_file(folder).with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2) + "\n")
    tmp.replace(record_file(folder))


def remove_record(folder: Path, pid: int) -> None:
    """Remove the record if process ``pid`` wrote it (a newer engine's is left alone)."""
    found = read_record(folder)
    if found is not None and found.pid == pid:
        with contextlib.suppress(FileNotFoundError):
            record_file(folder).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def live_engine(folder: Path) -> EngineRecord | None:
    """The engine recorded in ``folder`` if its server is up (its process lives and its
    port accepts connections), else None."""
    found = read_record(folder)
    if found is None or not _alive(found.server_pid) or not _listening(found.port):
        return None
    return found


def wait_for_engine(folder: Path, *, timeout: float = WAIT_SECONDS) -> EngineRecord:
    """The live engine of ``folder``, waiting up to ``timeout`` seconds while one restarts.

    Raises:
        EngineUnavailableError: none came up; names the record and the log.
    """
    deadline = time.monotonic() + timeout
    while True:
        found = live_engine(folder)
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL_SECONDS * 5)
    record = read_record(folder)
    where = (
        f"the engine recorded in {record_file(folder)} (server pid {record.server_pid}, "
        f"{record.url}) is not answering; its log is {record.log}"
        if record
        else f"no engine is recorded in {record_file(folder)}"
    )
    raise EngineUnavailableError(
        f"No Spark Connect engine is up for this home after {timeout:.0f} s: {where}. "
        "Nothing was written; the run can be retried.",
        fix="start one with `watermark engine` (or `watermark dev`), or run Spark in each "
        "run process with WATERMARK_ENGINE=process.",
    )


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_submit() -> str:
    """The installed PySpark's ``spark-submit``."""
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def server_settings(
    *, master: str, conf: Mapping[str, str], port: int
) -> tuple[str, dict[str, str]]:
    """The master and every setting of a local server: what a run's own session on
    ``master`` with ``conf`` would get (Delta's jars, extension and catalog, the driver
    memory and shuffle partitions of :func:`~watermark_dagster.runtime.spark.spark_defaults`,
    quiet logging), on the loopback ``port``."""
    from watermark_dagster.runtime import storage
    from watermark_dagster.runtime.spark import (
        cached_delta_jars,
        quiet_logging,
        session_settings,
    )

    settings = quiet_logging(session_settings(master=master, conf=conf))
    if not {"spark.jars", "spark.jars.packages"} & settings.keys():
        extra = storage.s3_packages() if storage.needs_s3_jars(settings) else []
        cached = cached_delta_jars(extra)
        if cached:
            settings["spark.jars"] = ",".join(cached)
        else:
            import importlib.metadata

            delta = importlib.metadata.version("delta-spark")
            settings["spark.jars.packages"] = ",".join(
                [f"io.delta:delta-spark_4.2_2.13:{delta}", *extra]
            )
    settings.update(
        {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.ui.enabled": settings.get("spark.ui.enabled", "false"),
        }
    )
    return master, settings


def server_argv(*, master: str, settings: Mapping[str, str]) -> list[str]:
    """The ``spark-submit`` command of a Connect server (the driver's memory is a launcher
    option: the JVM is started with it)."""
    options = dict(settings)
    memory = options.pop("spark.driver.memory", None)
    java_options = options.pop("spark.driver.extraJavaOptions", None)
    return [
        spark_submit(),
        "--class",
        SERVER_CLASS,
        "--master",
        master,
        *(["--driver-memory", memory] if memory else []),
        *(["--driver-java-options", java_options] if java_options else []),
        *[a for k, v in options.items() for a in ("--conf", f"{k}={v}")],
        "spark-internal",
    ]


@dataclass
class Server:
    """One started Connect server: its process group and its log."""

    process: subprocess.Popen
    port: int
    log: Path
    log_offset: int

    @property
    def url(self) -> str:
        """Its ``sc://`` address."""
        return f"sc://127.0.0.1:{self.port}"

    def output(self) -> str:
        """What this start wrote to the log."""
        with self.log.open("rb") as f:
            f.seek(self.log_offset)
            return f.read().decode(errors="replace")

    def alive(self) -> bool:
        """Whether the launcher still runs."""
        return self.process.poll() is None

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """SIGTERM the server, SIGKILL it after ``timeout``, and reap it.

        It stays in the process group of ``watermark engine``, so whatever stops that group
        (as ``watermark dev`` does) reaches the JVM too."""
        for signum in (signal.SIGTERM, signal.SIGKILL):
            if self.process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)


def start_server(
    *,
    master: str,
    conf: Mapping[str, str],
    log: Path,
    port: int | None = None,
    timeout: float = START_TIMEOUT_SECONDS,
    env: Mapping[str, str] | None = None,
) -> Server:
    """Start a Connect server and wait until it accepts clients. ``spark-submit`` execs
    the JVM, so the process started is the server itself; the kernel kills it when the
    thread calling this ends (:func:`~watermark_dagster.runtime.lifetime.die_with_parent`),
    so call it from the main thread or one that lives as long as the server.

    Raises:
        EngineUnavailableError: it exited or did not start within ``timeout``; carries the
            end of its log.
    """
    port = port or free_port()
    master, settings = server_settings(master=master, conf=conf, port=port)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        out.write(f"\n=== watermark engine: server start at {stamp} on port {port}\n".encode())
        out.flush()
        offset = out.tell()
        process = subprocess.Popen(
            server_argv(master=master, settings=settings),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **dict(env or {})},
            # Killed with the engine, even by SIGKILL: no server outlives its command.
            preexec_fn=die_with_parent,
        )
    server = Server(process, port, log, offset)
    deadline = time.monotonic() + timeout
    try:
        while not _listening(port):
            if not server.alive() or time.monotonic() > deadline:
                why = "exited" if not server.alive() else f"did not start in {timeout:.0f} s"
                raise EngineUnavailableError(
                    f"The Spark Connect server {why} (log {log}):\n{server.output()[-3000:]}",
                    fix="read the end of its log above.",
                )
            time.sleep(_POLL_SECONDS)
    except BaseException:
        server.stop()  # interrupted or failed: leave no process behind
        raise
    return server


@contextlib.contextmanager
def serving(
    home: Path,
    *,
    master: str,
    conf: Mapping[str, str],
    on_event: Callable[[str, EngineRecord], None] = lambda _what, _record: None,
    folder: Path | None = None,
    poll_seconds: float = 1.0,
) -> Iterator[Callable[[], None]]:
    """Start the home's engine and record it; yields ``watch()``, which blocks, restarting
    the server on its port whenever it dies, until interrupted. The server is stopped and
    the record removed on the way out.

    ``on_event("started" | "restarted", record)`` reports each start.

    Raises:
        EngineUnavailableError: another engine is up for the home, or the server failed to
            start.
    """
    folder = folder or engine_folder(home)
    running = live_engine(folder)
    if running is not None:
        raise EngineUnavailableError(
            f"An engine is already up for this home: {running.url} (pid {running.pid}, "
            f"recorded in {record_file(folder)}).",
            fix="use it (runs find it there), or stop it before starting another: kill "
            + (
                str(running.pid)
                if _alive(running.pid)
                else f"{running.server_pid} (its server, left by an engine that was killed)"
            )
            + ".",
        )
    log = log_file(home)
    server = start_server(master=master, conf=conf, log=log)
    try:
        record = EngineRecord(
            url=server.url,
            port=server.port,
            pid=os.getpid(),
            server_pid=server.process.pid,
            log=str(log),
            started=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        write_record(folder, record)
        on_event("started", record)
    except BaseException:
        remove_record(folder, os.getpid())
        server.stop()
        raise

    def watch() -> None:
        nonlocal server, record
        while True:
            time.sleep(poll_seconds)
            if server.alive() and _listening(server.port):
                continue
            server.stop(timeout=2.0)  # what is left of it (the JVM may be gone already)
            try:
                server = start_server(master=master, conf=conf, log=log, port=server.port)
            except EngineUnavailableError:
                # Its port may be held a moment longer: a new one (the record tells runs).
                server = start_server(master=master, conf=conf, log=log)
            record = EngineRecord(
                **{
                    **asdict(record),
                    "url": server.url,
                    "port": server.port,
                    "server_pid": server.process.pid,
                    "restarts": record.restarts + 1,
                }
            )
            write_record(folder, record)
            on_event("restarted", record)

    try:
        yield watch
    finally:
        remove_record(folder, os.getpid())
        server.stop()
