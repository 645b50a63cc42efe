"""Embedded defaults of the demo code location, each overridable by an environment variable.

| variable | default | meaning |
| --- | --- | --- |
| ``WATERMARK_HOME`` | ``./.watermark`` | demo tables and control tables live under it |
| ``WATERMARK_SPARK_MASTER`` | ``local[*]`` | Spark master (``spark://...`` for a cluster) |
| ``WATERMARK_SPARK_REMOTE`` | unset | Spark Connect URL (``sc://host:port``) |
| ``WATERMARK_SPARK_CONF`` | ``{}`` | Spark settings (JSON); a credential as ``{"env": "VAR"}`` |
| ``WATERMARK_ENGINE`` | ``auto`` | ``auto``/``connect``/``process``: where a run's Spark runs |
| ``WATERMARK_MIN_BATCH_INTERVAL_SECONDS`` | ``0`` | minimum time between two batches |
| ``WATERMARK_SENSOR_INTERVAL_SECONDS`` | ``30`` | how often the sensors tick |
| ``WATERMARK_MAX_ATTEMPTS`` | ``3`` | failed runs of a batch before it is reported stuck |
| ``WATERMARK_MAX_DEATHS`` | ``10`` | runs of a batch that died (were killed) before it is stuck |
| ``WATERMARK_DEATH_BACKOFF_SECONDS`` | ``10`` | wait after a death, doubling per death (0: none) |
| ``WATERMARK_KEEP_BATCH_PARTITIONS`` | ``1000`` | batch partitions kept in Dagster (0: all) |
| ``WATERMARK_REGISTRY`` | unset | a YAML registry file to load instead of the demo registry |
| ``WATERMARK_LAG_MAX_VERSIONS`` | ``100`` | lag check: most versions behind (0: no bound) |
| ``WATERMARK_LAG_MAX_SECONDS`` | ``3600`` | lag check: oldest unconsumed commit's age |
| ``WATERMARK_OBSERVE_EVERY_SECONDS`` | ``60`` | each upstream is reported at least this often |
| ``WATERMARK_FRESHNESS_FAIL_AFTER_SECONDS`` | ``86400`` | pipelines' freshness window (0: none) |
| ``WATERMARK_RETENTION_CHECK_CRON`` | ``0 * * * *`` | when the retention_horizon checks run |
"""

import json
import os
from pathlib import Path
from typing import cast

from watermark_dagster.config.secrets import OptionValue, as_reference
from watermark_dagster.core.resuming import (
    DEFAULT_DEATH_BACKOFF_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_DEATHS,
)
from watermark_dagster.errors import ConfigurationError

# The one default of each batching setting: `WatermarkSettings` (a code location built with
# `build_definitions`) and the environment variables below both read these.
DEFAULT_MIN_BATCH_INTERVAL_SECONDS = 0.0
DEFAULT_SENSOR_INTERVAL_SECONDS = 30
DEFAULT_KEEP_BATCH_PARTITIONS = 1000
# The defaults of the health signals (`HealthSettings` in dagster_defs/health.py).
DEFAULT_LAG_MAX_VERSIONS = 100
DEFAULT_LAG_MAX_SECONDS = 3600.0
DEFAULT_OBSERVE_EVERY_SECONDS = 60.0
DEFAULT_FRESHNESS_FAIL_AFTER_SECONDS = 86400.0
DEFAULT_RETENTION_CHECK_CRON = "0 * * * *"


def _number(name: str, default: str, cast: type) -> float | int:
    raw = os.environ.get(name, default)
    try:
        value = cast(raw)
    except ValueError:
        raise ConfigurationError(
            f"Environment variable {name}={raw!r} is not a number.",
            fix=f"set {name} to a number such as {default}, or unset it.",
        ) from None
    if value < 0:
        raise ConfigurationError(
            f"Environment variable {name}={raw!r} is negative.", fix=f"set {name} to 0 or more."
        )
    return value


def home() -> Path:
    """``WATERMARK_HOME``, made absolute."""
    return Path(os.environ.get("WATERMARK_HOME", ".watermark")).expanduser().resolve()


def registry_file() -> Path | None:
    """``WATERMARK_REGISTRY``: the YAML registry file the default code location loads
    instead of the demo registry (None when unset or empty)."""
    raw = os.environ.get("WATERMARK_REGISTRY", "").strip()
    return Path(raw).expanduser().resolve() if raw else None


def spark_conf() -> dict[str, OptionValue]:
    """``WATERMARK_SPARK_CONF`` parsed as a JSON object of strings; a value may be
    ``{"env": "VARIABLE"}`` (credentials must be: Dagster records the Spark settings)."""
    raw = os.environ.get("WATERMARK_SPARK_CONF", "{}")
    try:
        conf = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigurationError(
            f"WATERMARK_SPARK_CONF is not valid JSON ({e}): {raw!r}.",
            fix='use an object like {"spark.sql.shuffle.partitions": "2"}.',
        ) from None
    if not isinstance(conf, dict):
        raise ConfigurationError(f"WATERMARK_SPARK_CONF must be a JSON object, got {raw!r}.")
    settings: dict[str, OptionValue] = {}
    for key, value in cast("dict[object, object]", conf).items():
        reference = as_reference(value)
        if reference is None and isinstance(value, dict | list):
            raise ConfigurationError(
                f"WATERMARK_SPARK_CONF sets {key} to {json.dumps(value)}, which is neither "
                "a value nor an environment reference.",
                fix='give a string, or {"env": "VARIABLE"} to read it from the environment.',
            )
        settings[str(key)] = reference or str(value)
    return settings


def min_batch_interval_seconds() -> float:
    """``WATERMARK_MIN_BATCH_INTERVAL_SECONDS``."""
    return float(
        _number(
            "WATERMARK_MIN_BATCH_INTERVAL_SECONDS", str(DEFAULT_MIN_BATCH_INTERVAL_SECONDS), float
        )
    )


def sensor_interval_seconds() -> int:
    """``WATERMARK_SENSOR_INTERVAL_SECONDS``."""
    return int(
        _number("WATERMARK_SENSOR_INTERVAL_SECONDS", str(DEFAULT_SENSOR_INTERVAL_SECONDS), int)
    )


def max_attempts() -> int:
    """``WATERMARK_MAX_ATTEMPTS``."""
    return max(1, int(_number("WATERMARK_MAX_ATTEMPTS", str(DEFAULT_MAX_ATTEMPTS), int)))


def max_deaths() -> int:
    """``WATERMARK_MAX_DEATHS``."""
    return max(1, int(_number("WATERMARK_MAX_DEATHS", str(DEFAULT_MAX_DEATHS), int)))


def death_backoff_seconds() -> float:
    """``WATERMARK_DEATH_BACKOFF_SECONDS``."""
    return float(
        _number("WATERMARK_DEATH_BACKOFF_SECONDS", str(DEFAULT_DEATH_BACKOFF_SECONDS), float)
    )


def keep_batch_partitions() -> int:
    """``WATERMARK_KEEP_BATCH_PARTITIONS``."""
    return int(_number("WATERMARK_KEEP_BATCH_PARTITIONS", str(DEFAULT_KEEP_BATCH_PARTITIONS), int))


def lag_max_versions() -> int:
    """``WATERMARK_LAG_MAX_VERSIONS``."""
    return int(_number("WATERMARK_LAG_MAX_VERSIONS", str(DEFAULT_LAG_MAX_VERSIONS), int))


def lag_max_seconds() -> float:
    """``WATERMARK_LAG_MAX_SECONDS``."""
    return float(_number("WATERMARK_LAG_MAX_SECONDS", f"{DEFAULT_LAG_MAX_SECONDS:g}", float))


def observe_every_seconds() -> float:
    """``WATERMARK_OBSERVE_EVERY_SECONDS``."""
    return float(
        _number("WATERMARK_OBSERVE_EVERY_SECONDS", f"{DEFAULT_OBSERVE_EVERY_SECONDS:g}", float)
    )


def freshness_fail_after_seconds() -> float:
    """``WATERMARK_FRESHNESS_FAIL_AFTER_SECONDS``."""
    return float(
        _number(
            "WATERMARK_FRESHNESS_FAIL_AFTER_SECONDS",
            f"{DEFAULT_FRESHNESS_FAIL_AFTER_SECONDS:g}",
            float,
        )
    )


def retention_check_cron() -> str:
    """``WATERMARK_RETENTION_CHECK_CRON`` (checked by ``HealthSettings``)."""
    return os.environ.get("WATERMARK_RETENTION_CHECK_CRON", "").strip() or (
        DEFAULT_RETENTION_CHECK_CRON
    )


ENGINES = ("auto", "connect", "process")


def engine() -> str:
    """``WATERMARK_ENGINE``: ``auto`` (the home's engine when one is up, else a Spark session
    in the run process), ``connect`` (the engine only) or ``process``.

    Raises:
        ConfigurationError: any other value.
    """
    raw = os.environ.get("WATERMARK_ENGINE", "").strip() or "auto"
    if raw not in ENGINES:
        raise ConfigurationError(
            f"WATERMARK_ENGINE={raw!r} is not an engine.",
            fix="set it to 'auto' (the home's engine when one is up), 'connect' (the engine "
            "only) or 'process' (a Spark session in each run), or unset it.",
        )
    return raw
