"""A resident engine: one long-lived process whose warm Spark session runs the pipelines of
every run, so a run pays neither a JVM start nor a cold JIT.

``watermark engine`` starts it for a code location; runs use it when the code location's
:class:`~watermark_dagster.dagster_defs.resources.SparkSessionResource` has
``engine="resident"`` (``WATERMARK_ENGINE=resident`` for the default code location). A run
process decides from the control tables whether it has work (no Spark), then sends the work
— pipeline, batch, run id — to the engine over a local socket. The engine decides again and
runs it exactly as a run process would (same read, transform, write and checkpoint code),
one request at a time, and sends back the outcome. When no engine answers, the run uses a
Spark session of its own, and says so in its log.

The socket and its key live in ``<WATERMARK_HOME>/engine`` (the folder is private to the
user: the key authenticates every request).
"""

import logging
import os
import secrets
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from watermark_dagster.config.registry import Registry
from watermark_dagster.errors import TerminalError, WatermarkError
from watermark_dagster.operations.run_pipeline import PipelineOutcome, decide_pipeline, run_pipeline
from watermark_dagster.store import WatermarkStore

log = logging.getLogger("watermark_dagster")


class EngineUnavailableError(Exception):
    """No engine answered at the address; nothing was sent (the caller may run locally)."""


class EngineLostError(WatermarkError):
    """The engine died or hung up while it held the request; it may have written. The run
    fails and is retried like any run whose worker died (writes are idempotent)."""


class EngineRunError(TerminalError):
    """The pipeline failed on the engine with a terminal error (its message and fix)."""


class EngineRetryableRunError(WatermarkError):
    """The pipeline failed on the engine with an error a retry may fix."""


@dataclass(frozen=True)
class EngineAddress:
    """Where an engine listens: a Unix socket and the key that authenticates requests."""

    folder: Path

    @classmethod
    def under(cls, home: Path) -> "EngineAddress":
        """The address of the engine of the code location whose home is ``home``."""
        return cls(Path(home) / "engine")

    @property
    def socket(self) -> Path:
        """The Unix socket."""
        return self.folder / "engine.sock"

    @property
    def key_file(self) -> Path:
        """The authentication key (mode 0600)."""
        return self.folder / "authkey"


def run_on_engine(
    address: EngineAddress,
    *,
    pipeline: str,
    batch_id: str,
    run_id: str | None,
    control_root: str,
) -> tuple[PipelineOutcome, int]:
    """Have the engine at ``address`` run ``pipeline`` on ``batch_id``.

    Returns:
        The outcome and the engine's process id.

    Raises:
        EngineUnavailableError: no engine answered; nothing was sent.
        EngineLostError: the engine went away with the request.
        EngineRunError, EngineRetryableRunError: the pipeline failed there.
    """
    try:
        key = address.key_file.read_bytes()
        conn = Client(str(address.socket), family="AF_UNIX", authkey=key)
    except (OSError, EOFError) as e:
        raise EngineUnavailableError(f"no engine at {address.socket} ({e})") from None
    request = {
        "pipeline": pipeline,
        "batch_id": batch_id,
        "run_id": run_id,
        "control_root": control_root,
    }
    try:
        with conn:
            conn.send(request)
            reply = conn.recv()
    except (OSError, EOFError) as e:
        raise EngineLostError(
            f"The engine at {address.socket} went away while running pipeline '{pipeline}' "
            f"on batch {batch_id} ({type(e).__name__}).",
            pipeline=pipeline,
            batch_id=batch_id,
            fix="restart it with `watermark engine`; the batch is retried (writes are idempotent).",
        ) from None
    if "error" in reply:
        error = reply["error"]
        cls = EngineRunError if error["terminal"] else EngineRetryableRunError
        raise cls(
            f"{error['type']} on the engine (pid {reply['engine_pid']}): {error['message']}",
            pipeline=pipeline,
            batch_id=batch_id,
        )
    return reply["outcome"], reply["engine_pid"]


def _error_reply(exc: BaseException) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "terminal": isinstance(exc, TerminalError),
        "message": str(exc),
        "traceback": traceback.format_exc()[-4000:],
    }


def handle(
    request: dict[str, Any], *, spark: SparkSession, store: WatermarkStore, registry: Registry
) -> dict[str, Any]:
    """Run one request (what a run process would do after deciding) and build the reply."""
    reply: dict[str, Any] = {"engine_pid": os.getpid()}
    try:
        if request.get("control_root") != store.root:
            raise EngineRunError(
                f"This engine serves the control tables at {store.root}, not "
                f"{request.get('control_root')}.",
                fix="start one engine per code location, with the same WATERMARK_HOME and "
                "registry as its runs.",
            )
        pipeline = request["pipeline"]
        if pipeline not in registry.pipelines:
            raise EngineRunError(
                f"This engine's registry has no pipeline '{pipeline}' (it has "
                f"{sorted(registry.pipelines)}).",
                pipeline=pipeline,
                fix="restart `watermark engine` after changing the registry.",
            )
        decision = decide_pipeline(
            store=store, registry=registry, pipeline_name=pipeline, batch_id=request["batch_id"]
        )
        reply["outcome"] = run_pipeline(
            spark=spark,
            store=store,
            registry=registry,
            decision=decision,
            run_id=request.get("run_id"),
        )
    except Exception as e:  # every failure goes back to the run that asked
        log.exception("engine: request %s failed", request)
        reply["error"] = _error_reply(e)
    return reply


@contextmanager
def listening(address: EngineAddress) -> Iterator[Listener]:
    """A listener at ``address`` with a fresh key; the socket is removed when it closes.

    Raises:
        RuntimeError: another engine already answers there.
    """
    address.folder.mkdir(parents=True, exist_ok=True)
    address.folder.chmod(0o700)
    if address.socket.exists():
        try:
            Client(str(address.socket), family="AF_UNIX", authkey=address.key_file.read_bytes())
        except (OSError, EOFError):
            address.socket.unlink()  # left by an engine that died
        else:
            raise RuntimeError(f"an engine already runs at {address.socket}")
    key = secrets.token_bytes(32)
    fd = os.open(address.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    listener = Listener(str(address.socket), family="AF_UNIX", authkey=key)
    try:
        yield listener
    finally:
        listener.close()
        address.socket.unlink(missing_ok=True)


def serve(
    listener: Listener,
    *,
    spark: SparkSession,
    store: WatermarkStore,
    registry: Registry,
    on_request: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
) -> None:
    """Answer requests one at a time until the process is stopped."""
    while True:
        try:
            conn: Connection = listener.accept()
        except (OSError, EOFError) as e:  # a client that failed authentication, or hung up
            log.warning("engine: connection refused: %s", e)
            continue
        with conn:
            try:
                request = conn.recv()
            except (OSError, EOFError):
                continue
            reply = handle(request, spark=spark, store=store, registry=registry)
            try:
                conn.send(reply)
            except (OSError, EOFError):
                log.warning("engine: the run that sent %s went away before the reply", request)
            if on_request is not None:
                on_request(request, reply)
