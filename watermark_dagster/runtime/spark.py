"""Building the Spark session: Delta configured, local by default, Spark Connect by config.

Delta's jars are resolved from the Maven repository by Ivy the first time
(``configure_spark_with_delta_pip``); the resolved jar list is then remembered in
``~/.cache/watermark-dagster`` (or ``WATERMARK_JARS_CACHE``) and later sessions pass those
files as ``spark.jars``, so they start without a resolver round-trip or its report.
``python -m watermark_dagster.runtime.spark`` does the resolution once, as an install step
(``--s3`` adds hadoop-aws, which a session with tables on S3 resolves the same way: see
:mod:`watermark_dagster.runtime.storage`).
The resolution is announced as one progress line on :data:`progress_stream`.

Unless ``WATERMARK_VERBOSE`` is set (``watermark -v``), a session whose driver JVM this
process launches logs errors only (``log4j2-quiet.properties``, shipped with the package):
Spark's start-up notices and per-query warnings are not printed. A log4j configuration
given in ``spark.driver.extraJavaOptions`` is kept.

Time is in one zone, UTC, everywhere a session reads or writes it (:func:`in_utc`): the
driver's and the executors' JVMs are started with ``-Duser.timezone=UTC`` and the session's
SQL zone is UTC, for a local session, a cluster's executors and the home's Spark Connect
server alike. A JDBC read of a ``timestamp without time zone`` column, and the filter pushed
to the database, are rendered in the JVM's default zone: a window pinned by one process
and read by another selects the same rows only if both JVMs agree. A session whose JVM this
process did not start (a Spark Connect server, a session that existed already) is checked
(:func:`require_utc`): one whose JVM's default zone is not UTC is refused before any batch
work.
"""

import importlib.metadata
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from watermark_dagster.errors import ConfigurationError
from watermark_dagster.runtime import jdbc, storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

# Defaults for every session; each can be overridden through ``conf``. Adaptive query
# execution (on by default since Spark 3.2) is named here so a user sees it is relied on:
# it coalesces the small shuffle partitions a small batch produces and splits skewed ones.
DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.adaptive.skewJoin.enabled": "true",
}

# Where the one line announcing Delta's jar resolution goes (None: stderr at the time).
# The command line points it at the terminal while stderr goes to its log file, which
# ``output_log`` names: the line tells where the resolver's report went.
progress_stream: TextIO | None = None
output_log: Path | None = None
# How many sessions this process has started (or tried to): a quiet command that started
# none has nothing from Spark in its log, and does not point at it.
sessions_started = 0

QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")
_LOG4J_OPTION = "log4j2.configurationFile"
_DRIVER_OPTIONS = "spark.driver.extraJavaOptions"


_EXECUTOR_OPTIONS = "spark.executor.extraJavaOptions"
SESSION_ZONE = "spark.sql.session.timeZone"
UTC_OPTION = "-Duser.timezone=UTC"
# Names Java and Spark give the zone of UTC (a session zone may also be an offset).
UTC_NAMES = frozenset(
    {"UTC", "Etc/UTC", "GMT", "Etc/GMT", "UCT", "Etc/UCT", "Z", "Zulu", "Etc/Zulu"}
    | {"Universal", "Etc/Universal", "GMT0", "Etc/GMT0", "Etc/GMT+0", "Etc/GMT-0", "+00:00"}
)
_ZONE_OPTION = re.compile(r"-Duser\.timezone=(\S*)")


def in_utc(settings: Mapping[str, str], *, jvm: bool = True) -> dict[str, str]:
    """``settings`` with the session's SQL zone UTC and, with ``jvm`` (this process or
    ``watermark engine`` starts the JVMs), ``-Duser.timezone=UTC`` added to the driver's and
    the executors' ``extraJavaOptions`` (whatever options they hold are kept).

    Raises:
        ConfigurationError: the settings name another zone, for the session or a JVM.
    """
    result = dict(settings)
    zone = result.setdefault(SESSION_ZONE, "UTC")
    if zone not in UTC_NAMES:
        raise ConfigurationError(
            f"The Spark settings set {SESSION_ZONE} to {zone!r}: windows of database "
            "upstreams are pinned and read in UTC, and a session in another zone would read "
            "other rows than the batch pinned.",
            fix=f"remove {SESSION_ZONE} from the Spark settings (WATERMARK_SPARK_CONF, the "
            "registry's spark_config or the Spark resource), or set it to UTC.",
        )
    if not jvm:
        return result
    for key in (_DRIVER_OPTIONS, _EXECUTOR_OPTIONS):
        options = result.get(key, "")
        other = [z for z in _ZONE_OPTION.findall(options) if z not in UTC_NAMES]
        if other:
            raise ConfigurationError(
                f"The Spark settings start the JVM with -Duser.timezone={other[0]} ({key}): "
                "a database upstream's timestamp without time zone is read, and its window "
                "filtered, in the JVM's default zone, so every JVM must run in UTC.",
                fix=f"remove -Duser.timezone from {key}; the runtime sets {UTC_OPTION}.",
            )
        if not _ZONE_OPTION.search(options):
            result[key] = f"{options} {UTC_OPTION}".strip()
    return result


_ZONE_ID = re.compile(r'id="([^"]*)",offset=(-?\d+),.*transitions=(\d+),lastRule=(\w+)')


def _utc_rules(description: str) -> bool:
    """Whether a ``java.util.TimeZone``'s text (``sun.util.calendar.ZoneInfo[id="UTC",
    offset=0,...]``) is UTC: named so, or offset 0 with no transition and no rule."""
    found = _ZONE_ID.search(description)
    if found is None:
        return False
    name, offset, transitions, rule = found.groups()
    return name in UTC_NAMES or (offset == "0" and transitions == "0" and rule == "null")


def jvm_zones(session: "SparkSession") -> set[str]:
    """The default zones of the session's JVMs, as ``java.util.TimeZone`` describes them:
    the driver's and, over a few tasks, the executors' (on a Spark Connect server as on a
    session of this process)."""
    from pyspark.sql import functions as F

    found: set[str] = set()
    jvm = getattr(session, "_jvm", None)
    if jvm is not None:  # a classic session: the driver's own zone
        found.add(str(jvm.java.util.TimeZone.getDefault().toString()))
        if (session.sparkContext.master or "").startswith("local"):
            return found  # its executors are the driver's JVM
    probe = F.expr("reflect('java.util.TimeZone', 'getDefault')")
    rows = session.range(0, 8, 1, 4).select(probe.alias("zone")).distinct().collect()
    return found | {str(r["zone"]) for r in rows}


def require_utc(session: "SparkSession", where: str) -> None:
    """Refuse a session whose JVMs' default zone is not UTC (see :func:`in_utc`), before
    any batch work.

    Raises:
        ConfigurationError: names the zone found and the fix.
    """
    other = sorted(z for z in jvm_zones(session) if not _utc_rules(z))
    if not other:
        return
    found = _ZONE_ID.search(other[0])
    zone = found.group(1) if found else other[0]
    raise ConfigurationError(
        f"The Spark JVM of {where} runs in the time zone {zone!r}, not UTC: a database "
        "upstream's timestamp without time zone would be read, and its window filtered, "
        "in that zone, skipping or repeating rows of windows pinned elsewhere. Nothing "
        "was read or written.",
        fix=f"start it with {UTC_OPTION} in spark.driver.extraJavaOptions and "
        f"spark.executor.extraJavaOptions (`watermark engine` and the run processes do).",
    )


def verbose() -> bool:
    """``WATERMARK_VERBOSE`` set (to anything but ``""`` or ``0``): keep Spark's logging."""
    return os.environ.get("WATERMARK_VERBOSE", "").strip() not in ("", "0")


def quiet_logging(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` with the quiet log4j configuration added to the driver's JVM options,
    unless verbose or they already name a log4j configuration."""
    options = settings.get(_DRIVER_OPTIONS, "")
    if verbose() or _LOG4J_OPTION in options or not QUIET_LOG4J.is_file():
        return dict(settings)
    quiet = f"-D{_LOG4J_OPTION}={QUIET_LOG4J.as_uri()}"
    return {**settings, _DRIVER_OPTIONS: f"{options} {quiet}".strip()}


def _progress(text: str, *, end: str = "\n") -> None:
    stream = progress_stream or sys.stderr
    print(text, end=end, file=stream, flush=True)


_MIB = 1024 * 1024
# The driver heap of a local session: a quarter of the machine's memory, at least 1 GiB
# (Spark's own default, which a 2M-row first load exhausts) and at most 4 GiB (enough for
# first loads of several million rows while leaving room for other processes).
DRIVER_MEMORY_FRACTION = 0.25
DRIVER_MEMORY_MIN_MIB = 1024
DRIVER_MEMORY_MAX_MIB = 4096


def machine_memory_bytes() -> int | None:
    """Physical memory, or the cgroup's memory limit when that is lower (containers)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    for limit_file in (
        "/sys/fs/cgroup/memory.max",  # cgroup v2
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",  # cgroup v1
    ):
        try:
            raw = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and 0 < int(raw) < total:
            total = int(raw)
    return total


def default_driver_memory(memory_bytes: int | None = None) -> str:
    """``spark.driver.memory`` for a local session on this machine (e.g. ``"4096m"``)."""
    total = machine_memory_bytes() if memory_bytes is None else memory_bytes
    if not total:
        return f"{DRIVER_MEMORY_MIN_MIB * 2}m"
    mib = int(total * DRIVER_MEMORY_FRACTION) // _MIB
    return f"{max(DRIVER_MEMORY_MIN_MIB, min(DRIVER_MEMORY_MAX_MIB, mib))}m"


def local_cores(master: str) -> int:
    """Cores a ``local``, ``local[N]`` or ``local[*]`` master uses."""
    inner = master.removeprefix("local").strip("[]").split(",")[0]
    if not inner:
        return 1  # plain "local" runs one thread
    if inner.isdigit():
        return max(1, int(inner))
    return max(1, os.cpu_count() or 1)


def spark_defaults(*, master: str = "local[*]", remote: str | None = None) -> dict[str, str]:
    """The settings a session gets unless ``conf`` overrides them.

    A local session (the JVM is launched by this process, so heap settings still apply)
    also gets a driver heap sized for the machine (:func:`default_driver_memory`) and
    ``2 x cores`` shuffle partitions (at least 4), which adaptive execution coalesces when
    a batch is small. A cluster keeps Spark's own shuffle default; a Spark Connect server
    is configured where it runs.
    """
    if remote:
        # Only session-level SQL settings can be set from a Connect client.
        return {"spark.sql.session.timeZone": DEFAULT_CONF["spark.sql.session.timeZone"]}
    settings = dict(DEFAULT_CONF)
    if master.startswith("local"):
        settings["spark.driver.memory"] = default_driver_memory()
        settings["spark.sql.shuffle.partitions"] = str(max(4, 2 * local_cores(master)))
    return settings


def session_settings(
    *, master: str = "local[*]", remote: str | None = None, conf: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Every setting a session is built with: Delta's, :func:`spark_defaults`, loopback
    addresses for a local driver, then ``conf`` (which overrides any of them), in UTC
    (:func:`in_utc`). A Spark Connect client sends only the session-level defaults and
    ``conf``.

    Raises:
        ConfigurationError: ``conf`` names a time zone other than UTC.
    """
    if remote:
        # Delta's extension and catalog are static settings of the server; a client that
        # sends them only gets warnings. Its JVM's zone is checked once connected.
        return in_utc({**spark_defaults(remote=remote), **dict(conf or {})}, jvm=False)
    local = master.startswith("local")
    loopback = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    return in_utc(
        {
            **DELTA_CONF,
            **spark_defaults(master=master, remote=remote),
            **(loopback if local else {}),
            **dict(conf or {}),
        }
    )


def build_spark_session(
    *,
    master: str = "local[*]",
    remote: str | None = None,
    app_name: str = "watermark-dagster",
    conf: Mapping[str, str] | None = None,
    new_session: bool = False,
) -> "SparkSession":
    """Get or create a Spark session with Delta Lake configured.

    With ``remote`` (``sc://host:port``) the session is a Spark Connect client and the Delta
    jars must be on the server. Otherwise Delta's jars are added through
    ``spark.jars.packages`` (resolved once and cached by Ivy) unless ``conf`` already names
    ``spark.jars`` or ``spark.jars.packages``.

    Args:
        master: ``local[*]``, ``local[2]``, ``spark://host:7077``...
        remote: Spark Connect URL; takes precedence over ``master``.
        app_name: the Spark application name.
        conf: extra Spark settings, applied last.
        new_session: with ``remote``, always a new Connect session (its own temporary
            views, settings and cache on the server), never this process's current one.

    Raises:
        ConfigurationError: ``conf`` names a time zone other than UTC, or the session's JVM
            (a Spark Connect server's, or a session that existed already) does not run in
            UTC (:func:`require_utc`); a Connect server without Delta.

    Example:
        >>> spark = build_spark_session(
        ...     master="local[2]", conf={"spark.sql.shuffle.partitions": "2"}
        ... )
    """
    global sessions_started
    sessions_started += 1
    local = not remote and master.startswith("local")
    settings = session_settings(master=master, remote=remote, conf=conf)
    if not remote:
        # This process launches the driver JVM: its logging is set by the JVM's options.
        settings = quiet_logging(settings)
    if local:
        # A local session talks to itself only: keep the driver off external interfaces.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    existed = not remote and SparkSession.getActiveSession() is not None
    builder = SparkSession.builder.appName(app_name)
    builder = builder.remote(remote) if remote else builder.master(master)
    resolve = not remote and not ({"spark.jars", "spark.jars.packages"} & settings.keys())
    extra = storage.s3_packages() if resolve and storage.needs_s3_jars(settings) else []
    extra += jdbc.jdbc_packages() if resolve and jdbc.needs_jdbc_jars(settings) else []
    cached = cached_delta_jars(extra) if resolve else None
    if cached:
        settings["spark.jars"] = ",".join(cached)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if resolve and not cached:
        from delta import configure_spark_with_delta_pip

        builder = configure_spark_with_delta_pip(builder, extra_packages=extra)
        session = _resolving(builder)
    else:
        session = builder.create() if remote and new_session else builder.getOrCreate()
    if remote:
        require_delta_connect(session, remote)
    if remote or existed:
        # A JVM this process did not start with the settings above.
        require_utc(session, f"the Spark Connect server at {remote}" if remote else "the session")
    if resolve and not cached:
        _remember_delta_jars(session.conf.get("spark.jars", None), extra)
    return session


def _resolving(builder: "SparkSession.Builder") -> "SparkSession":
    """``builder.getOrCreate()`` while Ivy resolves Delta's jars, announced as one progress
    line unless verbose (then Ivy's own report is the progress)."""
    if verbose():
        return builder.getOrCreate()
    where = f"; its report goes to {output_log}" if output_log else ""
    _progress(f"resolving Delta jars (first run only{where})... ", end="")
    began = time.monotonic()
    try:
        session = builder.getOrCreate()
    except BaseException:
        _progress("failed")
        raise
    _progress(f"done in {time.monotonic() - began:.0f} s")
    return session


# What a Spark Connect server needs for the pipelines: Delta's SQL extension and catalog
# (static settings of the server), with Delta's jars on its class path. Delta's Connect
# plugin is not needed: targets are written through Spark's own MERGE and SQL plans.
DELTA_CONNECT_SERVER_CONF = dict(DELTA_CONF)


def require_delta_connect(session: "SparkSession", remote: str) -> None:
    """Refuse a Spark Connect server without Delta, before any batch work.

    Every read and write of the pipelines runs through plain DataFrame reads, Spark's own
    ``MERGE`` plan (``DataFrame.mergeInto``) and SQL statements, so a server with Delta's
    jars and its SQL extension runs them all; one without the extension would fail on the
    first ``delta`` read, after the batch was planned. Reading the server's setting tells.

    Raises:
        ConfigurationError: the server does not load Delta's SQL extension.
    """
    extensions = session.conf.get("spark.sql.extensions", None) or ""
    if DELTA_CONF["spark.sql.extensions"] in extensions:
        return
    raise ConfigurationError(
        f"The Spark Connect server at {remote} does not load Delta Lake "
        f"(its spark.sql.extensions is {extensions or 'unset'!r}), so pipelines cannot read "
        "or write Delta tables there.",
        fix="start the server with Delta's jars (io.delta:delta-spark for the server's Spark "
        "version, e.g. --packages) and "
        + " ".join(f"--conf {k}={v}" for k, v in DELTA_CONNECT_SERVER_CONF.items())
        + "; or unset the remote (WATERMARK_SPARK_REMOTE) to run Spark in each run process.",
    )


def _jars_cache_file(extra: Sequence[str] = ()) -> Path:
    root = Path(os.environ.get("WATERMARK_JARS_CACHE", "~/.cache/watermark-dagster")).expanduser()
    spark_version = importlib.metadata.version("pyspark")
    delta_version = importlib.metadata.version("delta-spark")
    # Each set of extra packages (hadoop-aws for S3) has its own list: a location without
    # S3 keeps using, and resolving, Delta's jars alone.
    tail = "".join(f"+{p.split(':')[1]}-{p.split(':')[-1]}" for p in extra)
    return root / f"delta-spark-{delta_version}-spark-{spark_version}{tail}.jars"


def cached_delta_jars(extra: Sequence[str] = ()) -> list[str] | None:
    """The remembered jar files of Delta (and of the ``extra`` Maven packages), if every
    one of them is still on disk."""
    path = _jars_cache_file(extra)
    if not path.exists():
        return None
    jars = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    local = [j.removeprefix("file://") for j in jars]
    if not jars or not all(Path(j).exists() for j in local):
        return None
    return jars


def _remember_delta_jars(spark_jars: str | None, extra: Sequence[str] = ()) -> None:
    if not spark_jars:
        return
    jars = [j for j in spark_jars.split(",") if j]
    wanted = ["delta-spark", *(p.split(":")[1] for p in extra)]
    if not all(any(name in j for j in jars) for name in wanted):
        return
    path = _jars_cache_file(extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(jars) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m watermark_dagster.runtime.spark",
        description="Install step: resolve Delta's Spark jars once and remember them, so "
        "later sessions start without resolving.",
    )
    parser.add_argument(
        "--jdbc",
        action="store_true",
        help="also the PostgreSQL and MariaDB JDBC drivers, for database upstreams",
    )
    parser.add_argument(
        "--s3",
        action="store_true",
        help="also hadoop-aws and the AWS SDK bundle it declares (several hundred MB), "
        "for tables on S3",
    )
    arguments = parser.parse_args()
    settings = storage.spark_s3_settings([("--s3", "s3://bucket/", None)], environ={})
    conf = {k: v for k, v in settings.items() if isinstance(v, str)} if arguments.s3 else {}
    conf.update(jdbc.spark_jdbc_settings(["--jdbc"] if arguments.jdbc else []))
    build_spark_session(master="local[1]", conf=conf).stop()
    extra = storage.s3_packages() if arguments.s3 else []
    extra += jdbc.jdbc_packages() if arguments.jdbc else []
    listed = cached_delta_jars(extra) or []
    print(f"Delta jars ready: {len(listed)} files listed in {_jars_cache_file(extra)}")
