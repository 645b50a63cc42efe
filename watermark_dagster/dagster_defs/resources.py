"""Dagster resources: the Spark session and the watermark store."""

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from pydantic import Field, PrivateAttr, model_validator

from watermark_dagster.config.secrets import as_reference, resolved_options
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.runtime.spark import build_spark_session
from watermark_dagster.store import WatermarkStore, shared_store

log = logging.getLogger("watermark_dagster")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from watermark_dagster.runtime.connect import EngineRecord

# Sessions created by runs while a `held_spark_sessions()` scope is open; None when no scope
# is open. A list, not a flag: the scope stops exactly the sessions that runs created in it.
_held: "list[SparkSession] | None" = None


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
            try:
                session.stop()
            except Exception as e:  # a session an interrupted run left unusable
                log.warning("stopping a Spark session failed (%s: %s)", type(e).__name__, e)


def spark_was_started() -> bool:
    """Whether this process has launched a Spark JVM (py4j gateway) at any time; stays
    true after the session is stopped. Spark Connect clients start no local JVM."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


# Keys of ``spark_config`` that name the session rather than configure it: a
# dagster-pyspark configuration sets the master and application name this way.
MASTER_KEY = "spark.master"
REMOTE_KEY = "spark.remote"
APP_NAME_KEY = "spark.app.name"
DEFAULT_MASTER = "local[*]"
DEFAULT_APP_NAME = "watermark-dagster"
_S = TypeVar("_S", str, str | None)


def flatten_spark_config(config: Mapping[str, Any]) -> dict[str, str]:
    """Spark settings as dagster-pyspark reads them: nested dicts joined with dots
    (``{"spark": {"executor": {"memory": "2g"}}}`` is ``spark.executor.memory``) and
    values as text (booleans as ``true``/``false``, as PySpark's builder writes them)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        reference = as_reference(value)
        if reference is not None:  # resolved when the session is built
            flat[key] = EnvVar(reference.name)
        elif isinstance(value, Mapping):
            nested = flatten_spark_config(cast("Mapping[str, Any]", value))
            flat.update({f"{key}.{k}": v for k, v in nested.items()})
        elif isinstance(value, bool):
            flat[key] = "true" if value else "false"
        else:
            flat[key] = str(value)
    return flat


@dataclass(frozen=True)
class SparkSettings:
    """What a session is built from once the resource's fields are merged."""

    master: str
    remote: str | None
    app_name: str
    conf: dict[str, str]


class SparkSessionResource(ConfigurableResource):
    """A Spark session with Delta Lake, created lazily once per run process.

    Configured like dagster-pyspark's ``PySparkResource``/``LazyPySparkResource``: Spark
    settings go in ``spark_config`` (flat or nested keys), ``spark.master`` and
    ``spark.app.name`` included. On top of that it adds Delta's jars and extensions, the
    defaults of :func:`~watermark_dagster.runtime.spark.spark_defaults`, Spark Connect
    (``remote``) and the home's engine, and stopping the session it created. docs/configuration.md,
    "Why not dagster-pyspark's PySparkResource", says why it is not built on that class.

    Steps that never touch Spark start no JVM. With the in-process executor a run is one
    process, so every pipeline asset of a run shares one session; it is stopped when the
    run ends unless it existed before (a test's or a notebook's session is left alone).

    Example:
        >>> SparkSessionResource(spark_config={"spark.master": "local[2]",
        ...                                    "spark.sql.shuffle.partitions": "2"})
        >>> SparkSessionResource(spark_config={"spark": {"driver": {"memory": "6g"}}})
        >>> SparkSessionResource(remote="sc://spark-connect:15002")
    """

    master: str = Field(
        default=DEFAULT_MASTER,
        description="Spark master: local[*], local[N], or spark://host:7077 for a cluster "
        "(also settable as spark.master in spark_config).",
    )
    remote: str | None = Field(
        default=None,
        description="Spark Connect URL (sc://host:port); takes precedence over master. "
        "The server must have Delta Lake's jars (also settable as spark.remote in "
        "spark_config).",
    )
    app_name: str = Field(
        default=DEFAULT_APP_NAME,
        description="Spark application name (also settable as spark.app.name in spark_config).",
    )
    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Spark settings, as dagster-pyspark's PySparkResource takes them: flat "
        '({"spark.executor.memory": "2g"}) or nested ({"spark": {"executor": {"memory": '
        '"2g"}}}) keys, values turned to text. Applied after the defaults of '
        "watermark_dagster.runtime.spark.spark_defaults (local: driver memory a quarter of "
        "RAM between 1 and 4 GiB, 2 x cores shuffle partitions, adaptive execution), e.g. "
        "spark.driver.memory, spark.sql.shuffle.partitions, spark.jars for offline Delta jars.",
    )
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="The former name of spark_config (flat keys only), still read; a key "
        "set in both must have the same value.",
    )
    stop_on_teardown: bool = Field(
        default=True,
        description="Stop the session when the run ends (only if this resource created it).",
    )
    engine: Literal["auto", "connect", "process"] = Field(
        default="auto",
        description="Where a run's Spark runs when no remote is set: 'auto' (the home's "
        "Spark Connect engine that `watermark engine` or `watermark dev` started, when one is "
        "up; else a Spark session in the run process), 'connect' (that engine only: a run "
        "waits for it while it restarts, then fails as retryable) or 'process' (a Spark "
        "session in each run process).",
    )
    engine_folder: str | None = Field(
        default=None,
        description="Folder of the engine's record (default: $WATERMARK_HOME/engine).",
    )

    @model_validator(mode="after")
    def _settings_agree(self) -> "SparkSessionResource":
        # Refuse contradictions when the resource is built (definitions load), not when a
        # run first asks for Spark.
        self.settings()
        return self

    def settings(self) -> SparkSettings:
        """The master, Connect URL, application name and Spark settings the session is
        built with: ``conf`` and ``spark_config`` merged, with ``spark.master``,
        ``spark.remote`` and ``spark.app.name`` taken out as the session's own.

        Raises:
            ConfigurationError: ``conf`` and ``spark_config`` give one key two values, or a
                field and its ``spark_config`` key disagree.
        """
        config = flatten_spark_config(self.spark_config)
        for key in sorted(config.keys() & self.conf.keys()):
            if config[key] != self.conf[key]:
                raise ConfigurationError(
                    f"SparkSessionResource sets {key} twice: {self.conf[key]!r} in conf and "
                    f"{config[key]!r} in spark_config.",
                    fix="keep it in spark_config only (conf is its former name).",
                )
        merged = {**self.conf, **config}
        master = self._named(merged.pop(MASTER_KEY, None), "master", self.master, DEFAULT_MASTER)
        remote = self._named(merged.pop(REMOTE_KEY, None), "remote", self.remote, None)
        app_name = self._named(
            merged.pop(APP_NAME_KEY, None), "app_name", self.app_name, DEFAULT_APP_NAME
        )
        return SparkSettings(master=master, remote=remote, app_name=app_name, conf=merged)

    @staticmethod
    def _named(from_config: str | None, field: str, value: _S, default: _S) -> _S | str:
        """A session property given as a field and perhaps as a spark_config key: the key
        wins over the field's default, and may not contradict a field set otherwise."""
        if from_config is None:
            return value
        if value != default and value != from_config:
            raise ConfigurationError(
                f"SparkSessionResource has {field}={value!r} but spark_config sets it to "
                f"{from_config!r}.",
                fix=f"set it in one place: the {field} field or spark_config.",
            )
        return from_config

    _session: "SparkSession | None" = PrivateAttr(default=None)
    _created: bool = PrivateAttr(default=False)
    _engine: "EngineRecord | None" = PrivateAttr(default=None)

    def get_session(self) -> "SparkSession":
        """The run's session, created on first use: a step that never calls this starts
        no JVM. Without a remote, the home's engine is used as :attr:`engine` says (a
        Connect session of the run's own), else a session in this process.

        Raises:
            EngineUnavailableError: ``engine="connect"`` and no engine came up in time.
        """
        if self._session is None:
            from pyspark.sql import SparkSession

            existed = SparkSession.getActiveSession() is not None
            settings = self.settings()
            remote, conf = settings.remote, settings.conf
            self._engine = self.find_engine() if remote is None else None
            if self._engine is not None:
                # The server has the location's settings already; its sessions take SQL
                # settings only, and this run sets its own as it goes.
                remote, conf = self._engine.url, {}
            self._session = build_spark_session(
                master=settings.master,
                remote=remote,
                app_name=settings.app_name,
                conf=resolved_options(conf, "The Spark resource") or {},
                new_session=self._engine is not None,
            )
            self._created = not existed or self._engine is not None
        return self._session

    def find_engine(self) -> "EngineRecord | None":
        """The home's engine this resource uses: None with ``engine="process"`` or (with
        ``"auto"``) when none is up.

        Raises:
            EngineUnavailableError: ``engine="connect"`` and none came up in time.
        """
        if self.engine == "process":
            return None
        from watermark_dagster.runtime.connect import live_engine, wait_for_engine

        folder = self.engine_record_folder()
        return wait_for_engine(folder) if self.engine == "connect" else live_engine(folder)

    def engine_record_folder(self) -> Path:
        """Where the home's engine is recorded."""
        from watermark_dagster.config import env
        from watermark_dagster.runtime.connect import engine_folder

        return Path(self.engine_folder) if self.engine_folder else engine_folder(env.home())

    def used_engine(self) -> "EngineRecord | None":
        """The home's engine this run's session is on (as recorded when it was created),
        None when the session is not on it (or not created yet)."""
        return self._engine

    def engine_label(self) -> str:
        """Where this run's session runs, for the run's ``watermark/engine`` tag:
        ``connect:<url>`` (the home's engine), ``remote:<url>`` or ``process``."""
        if self._engine is not None:
            return f"connect:{self._engine.url}"
        remote = self.settings().remote
        return f"remote:{remote}" if remote else "process"

    @contextmanager
    def yield_for_execution(self, context: InitResourceContext) -> Iterator["SparkSessionResource"]:
        """Hand the resource to the run, then stop the session it created when the run ends.

        Only a session this resource created is stopped, and only with ``stop_on_teardown``;
        inside :func:`held_spark_sessions` it is kept open until that scope ends instead.
        A session on the home's engine is always released when the run ends: each run has
        its own, so no temporary view, setting or cached frame outlives it on the server.
        """
        try:
            yield self
        finally:
            if self._session is not None and self._created:
                if self._engine is not None:
                    self._session.stop()  # releases the server's session; no JVM to keep
                elif self.stop_on_teardown and _held is not None:
                    _held.append(self._session)  # stopped when the held scope ends
                elif self.stop_on_teardown:
                    self._session.stop()
            self._session = None
            self._engine = None


def spark_from_variables() -> SparkSessionResource:
    """The Spark resource of a location given none: ``WATERMARK_SPARK_MASTER`` (default
    ``local[*]``), ``WATERMARK_SPARK_REMOTE``, ``WATERMARK_SPARK_CONF`` and
    ``WATERMARK_ENGINE``, as a registry file's location reads them.

    Raises:
        ConfigurationError: a variable holds no valid value.
    """
    from watermark_dagster.config import env

    return SparkSessionResource(
        master=os.environ.get("WATERMARK_SPARK_MASTER", "").strip() or DEFAULT_MASTER,
        remote=os.environ.get("WATERMARK_SPARK_REMOTE", "").strip() or None,
        conf=dagster_values(env.spark_conf()) or {},
        engine=env.engine(),  # type: ignore[arg-type]
    )


def dagster_values(options: Mapping[str, object] | None) -> dict[str, str] | None:
    """``options`` as a resource's configuration: each environment reference
    (:class:`~watermark_dagster.config.secrets.EnvRef`) as Dagster's ``EnvVar``, which Dagster
    records by name only and resolves when it builds the resource for a run."""
    if not options:
        return None
    values: dict[str, str] = {}
    for key, value in options.items():
        reference = as_reference(value)
        values[key] = EnvVar(reference.name) if reference is not None else str(value)
    return values


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
        default=None,
        description="delta-rs storage options for object stores; credentials as EnvVar (or "
        "left to the environment), so Dagster stores only their variable's name.",
    )

    def get_store(self) -> WatermarkStore:
        """A plain :class:`WatermarkStore` usable without Dagster: this thread's store of
        the control root, reused across ticks and steps (see :func:`shared_store`)."""
        return shared_store(self.control_root, storage_options=self.storage_options)
