"""The environment a code location reads: ``WATERMARK_HOME``, the Spark variables, the
registry file, and each location setting's variable (``WatermarkSettings`` and
``HealthSettings`` declare them; docs/configuration.md lists every variable)."""

import json
import math
import os
from pathlib import Path
from typing import cast

from watermark_dagster.config.options import Kind, Option
from watermark_dagster.config.secrets import OptionValue, as_reference
from watermark_dagster.errors import ConfigurationError

# The one default of each batching setting, declared by `WatermarkSettings`: a variable left
# unset leaves it.
DEFAULT_MIN_BATCH_INTERVAL_SECONDS = 0.0
DEFAULT_SENSOR_INTERVAL_SECONDS = 30
DEFAULT_KEEP_BATCH_PARTITIONS = 1000
# The defaults of the health signals (`HealthSettings` in dagster_defs/health.py).
DEFAULT_LAG_MAX_VERSIONS = 100
DEFAULT_LAG_MAX_SECONDS = 3600.0
DEFAULT_OBSERVE_EVERY_SECONDS = 60.0
DEFAULT_FRESHNESS_FAIL_AFTER_SECONDS = 86400.0
DEFAULT_RETENTION_CHECK_CRON = "0 * * * *"


def _number(name: str, raw: str, default: str, cast: type) -> float | int:
    try:
        value = cast(raw)
    except ValueError:
        raise ConfigurationError(
            f"Environment variable {name}={raw!r} is not a number.",
            fix=f"set {name} to a number such as {default}, or unset it.",
        ) from None
    if not math.isfinite(value):  # "nan" and "inf" parse as floats
        raise ConfigurationError(
            f"Environment variable {name}={raw!r} is not a finite number.",
            fix=f"set {name} to a number such as {default}, or unset it.",
        )
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


def setting(option: Option) -> int | float | str | None:
    """A location setting's value from its environment variable (``option.env``), None
    when the variable is unset or empty; the settings class checks the value further.

    Raises:
        ConfigurationError: a number setting's variable holds no number, or a negative one.
    """
    raw = os.environ.get(option.env or "", "").strip()
    if not option.env or not raw:
        return None
    if option.kind in (Kind.WHOLE, Kind.SECONDS):
        default = option.default
        return _number(option.env, raw, str(default), int if option.kind is Kind.WHOLE else float)
    return raw


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
