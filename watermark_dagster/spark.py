"""Building the Spark session: Delta configured, local by default, Spark Connect by config.

Delta's jars are resolved from the Maven repository by Ivy the first time
(``configure_spark_with_delta_pip``); the resolved jar list is then remembered in
``~/.cache/watermark-dagster`` (or ``WATERMARK_JARS_CACHE``) and later sessions pass those
files as ``spark.jars``, so they start without a resolver round-trip or its report.
``python -m watermark_dagster.spark`` does the resolution once, as an install step.
"""

import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

# Small-machine defaults; every one can be overridden through ``conf``.
DEFAULT_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.databricks.delta.snapshotPartitions": "2",
}


def build_spark_session(
    *,
    master: str = "local[*]",
    remote: str | None = None,
    app_name: str = "watermark-dagster",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
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

    Example:
        >>> spark = build_spark_session(
        ...     master="local[2]", conf={"spark.sql.shuffle.partitions": "2"}
        ... )
    """
    local = not remote and master.startswith("local")
    loopback = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    settings = {**DELTA_CONF, **DEFAULT_CONF, **(loopback if local else {}), **dict(conf or {})}
    if local:
        # A local session talks to itself only: keep the driver off external interfaces.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    builder = builder.remote(remote) if remote else builder.master(master)
    resolve = not remote and not ({"spark.jars", "spark.jars.packages"} & settings.keys())
    cached = cached_delta_jars() if resolve else None
    if cached:
        settings["spark.jars"] = ",".join(cached)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if resolve and not cached:
        from delta import configure_spark_with_delta_pip

        builder = configure_spark_with_delta_pip(builder)
    session = builder.getOrCreate()
    if resolve and not cached:
        _remember_delta_jars(session.conf.get("spark.jars", None))
    return session


def _jars_cache_file() -> Path:
    root = Path(os.environ.get("WATERMARK_JARS_CACHE", "~/.cache/watermark-dagster")).expanduser()
    spark_version = importlib.metadata.version("pyspark")
    delta_version = importlib.metadata.version("delta-spark")
    return root / f"delta-spark-{delta_version}-spark-{spark_version}.jars"


def cached_delta_jars() -> list[str] | None:
    """The remembered Delta jar files, if every one of them is still on disk."""
    path = _jars_cache_file()
    if not path.exists():
        return None
    jars = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    local = [j.removeprefix("file://") for j in jars]
    if not jars or not all(Path(j).exists() for j in local):
        return None
    return jars


def _remember_delta_jars(spark_jars: str | None) -> None:
    if not spark_jars:
        return
    jars = [j for j in spark_jars.split(",") if j]
    if not any("delta-spark" in j for j in jars):
        return
    path = _jars_cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(jars) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    # Install step: resolve Delta's jars once and remember them.
    build_spark_session(master="local[1]").stop()
    print(
        f"Delta jars ready: {len(cached_delta_jars() or [])} files listed in {_jars_cache_file()}"
    )
