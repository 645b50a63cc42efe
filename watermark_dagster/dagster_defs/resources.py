"""Dagster resources: the Spark session and the watermark store."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from watermark_dagster.runtime.spark import build_spark_session
from watermark_dagster.store import WatermarkStore, shared_store

if TYPE_CHECKING:
    from watermark_dagster.runtime.engine import EngineAddress

# Sessions created by runs while a `held_spark_sessions()` scope is open; None when no scope
# is open. A list, not a flag: the scope stops exactly the sessions that runs created in it.
_held: list[SparkSession] | None = None


@contextmanager
def held_spark_sessions() -> Iterator[None]:
    """Keep the Spark sessions that runs create inside this scope open until it ends.

    A headless cycle executes several runs in one process: without this, each run would
    stop the session it created and the next run would build a new one. Inside the scope the
    first run that needs Spark creates the session, later runs reuse it, and the scope stops
    it at the end. A cycle whose runs all skip (or that has no run) starts no JVM at all.
    Nested scopes defer to the outermost one.

    Example:
        >>> with held_spark_sessions():
        ...     HeadlessRunner(defs, instance).run_until_idle()
    """
    global _held
    if _held is not None:
        yield
        return
    _held = []
    try:
        yield
    finally:
        sessions, _held = _held, None
        for session in sessions:
            session.stop()


def spark_was_started() -> bool:
    """Whether this process has launched a Spark JVM (py4j gateway) at any time; stays
    true after the session is stopped. Spark Connect clients start no local JVM."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


class SparkSessionResource(ConfigurableResource):
    """A Spark session with Delta Lake, created lazily once per run process.

    Steps that never touch Spark start no JVM. With the in-process executor a run is one
    process, so every pipeline asset of a run shares one session; it is stopped when the
    run ends unless it existed before (a test's or a notebook's session is left alone).

    Example:
        >>> SparkSessionResource(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"})
        >>> SparkSessionResource(remote="sc://spark-connect:15002")
    """

    master: str = Field(
        default="local[*]",
        description="Spark master: local[*], local[N], or spark://host:7077 for a cluster.",
    )
    remote: str | None = Field(
        default=None,
        description="Spark Connect URL (sc://host:port); takes precedence over master. "
        "The server must have Delta Lake's jars.",
    )
    app_name: str = Field(default="watermark-dagster", description="Spark application name.")
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Spark settings, applied after the defaults of "
        "watermark_dagster.runtime.spark.spark_defaults (local: driver memory a quarter of RAM "
        "between 1 and 4 GiB, 2 x cores shuffle partitions, adaptive execution), e.g. "
        "spark.driver.memory, spark.sql.shuffle.partitions, spark.jars for offline Delta jars.",
    )
    stop_on_teardown: bool = Field(
        default=True,
        description="Stop the session when the run ends (only if this resource created it).",
    )
    engine: Literal["process", "resident"] = Field(
        default="process",
        description="Where pipelines run: 'process' (a Spark session in each run process) or "
        "'resident' (the long-lived engine `watermark engine` started, with a warm JVM; a "
        "run falls back to its own session when no engine answers).",
    )
    engine_folder: str | None = Field(
        default=None,
        description="Folder of the resident engine's socket and key (default: "
        "$WATERMARK_HOME/engine).",
    )

    _session: SparkSession | None = PrivateAttr(default=None)
    _created: bool = PrivateAttr(default=False)

    def get_session(self) -> SparkSession:
        """The run's session, created on first use: a step that never calls this starts
        no JVM."""
        if self._session is None:
            existed = SparkSession.getActiveSession() is not None
            self._session = build_spark_session(
                master=self.master, remote=self.remote, app_name=self.app_name, conf=self.conf
            )
            self._created = not existed
        return self._session

    def engine_address(self) -> "EngineAddress | None":
        """The resident engine to send work to, or None for ``engine="process"``."""
        if self.engine != "resident":
            return None
        from watermark_dagster.config import env
        from watermark_dagster.runtime.engine import EngineAddress

        if self.engine_folder:
            return EngineAddress(Path(self.engine_folder))
        return EngineAddress.under(env.home())

    @contextmanager
    def yield_for_execution(self, context: InitResourceContext) -> Iterator["SparkSessionResource"]:
        """Hand the resource to the run, then stop the session it created when the run ends.

        Only a session this resource created is stopped, and only with ``stop_on_teardown``;
        inside :func:`held_spark_sessions` it is kept open until that scope ends instead.
        """
        try:
            yield self
        finally:
            if self._session is not None and self._created and self.stop_on_teardown:
                if _held is not None:
                    _held.append(self._session)  # stopped when the held scope ends
                else:
                    self._session.stop()
            self._session = None


class WatermarkStoreResource(ConfigurableResource):
    """The control tables (batches, committed watermarks, checkpoints, history).

    Example:
        >>> WatermarkStoreResource(control_root="/lake/_watermark")
    """

    control_root: str = Field(
        description="Folder or object-store URI holding the four control tables; created on "
        "first use."
    )
    storage_options: dict[str, str] | None = Field(
        default=None, description="delta-rs storage options for object stores."
    )

    def get_store(self) -> WatermarkStore:
        """A plain :class:`WatermarkStore` usable without Dagster: this thread's store of
        the control root, reused across ticks and steps (see :func:`shared_store`)."""
        return shared_store(self.control_root, storage_options=self.storage_options)
