"""watermark-dagster: exactly-once, replayable incremental processing over Delta Lake tables.

The public API: declare upstreams and pipelines, build the code location's definitions
(in Python, or in ``defs.yaml`` through :class:`WatermarkComponent`).
Each name is imported from its module on first use, so ``import watermark_dagster`` (and
the ``watermark`` command before it loads a code location) costs no Dagster, Spark or
delta-rs import.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from watermark_dagster.config.batch_context import BatchContext, PinnedInput
    from watermark_dagster.config.database import DatabaseUpstream
    from watermark_dagster.config.landing import LandingUpstream
    from watermark_dagster.config.pipeline import (
        Pipeline,
        WriteMode,
        declared_pipeline,
        pipeline,
        sql_pipeline,
    )
    from watermark_dagster.config.registry import Registry
    from watermark_dagster.config.secrets import EnvRef
    from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream, Upstream
    from watermark_dagster.config.warehouse import PostgresTarget
    from watermark_dagster.dagster_defs.component import WatermarkComponent
    from watermark_dagster.dagster_defs.definitions import (
        WatermarkLocation,
        build_definitions,
        build_location,
    )
    from watermark_dagster.dagster_defs.resources import (
        SparkSessionResource,
        WatermarkStoreResource,
    )
    from watermark_dagster.dagster_defs.settings import WatermarkSettings
    from watermark_dagster.dagster_defs.translator import WatermarkTranslator
    from watermark_dagster.read.changes import matching_keys, recompute
    from watermark_dagster.read.extraction import extraction_stage
    from watermark_dagster.store import WatermarkStore

# Public name -> the module that defines it.
_API = {
    "BatchContext": "watermark_dagster.config.batch_context",
    "PinnedInput": "watermark_dagster.config.batch_context",
    "Pipeline": "watermark_dagster.config.pipeline",
    "WriteMode": "watermark_dagster.config.pipeline",
    "pipeline": "watermark_dagster.config.pipeline",
    "declared_pipeline": "watermark_dagster.config.pipeline",
    "sql_pipeline": "watermark_dagster.config.pipeline",
    "Registry": "watermark_dagster.config.registry",
    "EnvRef": "watermark_dagster.config.secrets",
    "CursorUpstream": "watermark_dagster.config.upstream",
    "DatabaseUpstream": "watermark_dagster.config.database",
    "PostgresTarget": "watermark_dagster.config.warehouse",
    "LandingUpstream": "watermark_dagster.config.landing",
    "extraction_stage": "watermark_dagster.read.extraction",
    "DeltaUpstream": "watermark_dagster.config.upstream",
    "Upstream": "watermark_dagster.config.upstream",
    "WatermarkTranslator": "watermark_dagster.dagster_defs.translator",
    "WatermarkComponent": "watermark_dagster.dagster_defs.component",
    "build_definitions": "watermark_dagster.dagster_defs.definitions",
    "build_location": "watermark_dagster.dagster_defs.definitions",
    "WatermarkLocation": "watermark_dagster.dagster_defs.definitions",
    "SparkSessionResource": "watermark_dagster.dagster_defs.resources",
    "WatermarkStoreResource": "watermark_dagster.dagster_defs.resources",
    "WatermarkSettings": "watermark_dagster.dagster_defs.sensors",
    "matching_keys": "watermark_dagster.read.changes",
    "recompute": "watermark_dagster.read.changes",
    "WatermarkStore": "watermark_dagster.store",
}

__all__ = [
    "BatchContext",
    "CursorUpstream",
    "DatabaseUpstream",
    "PostgresTarget",
    "DeltaUpstream",
    "EnvRef",
    "LandingUpstream",
    "PinnedInput",
    "Pipeline",
    "Registry",
    "SparkSessionResource",
    "Upstream",
    "WatermarkComponent",
    "WatermarkLocation",
    "WatermarkSettings",
    "WatermarkStore",
    "WatermarkStoreResource",
    "WatermarkTranslator",
    "WriteMode",
    "build_definitions",
    "build_location",
    "declared_pipeline",
    "extraction_stage",
    "matching_keys",
    "pipeline",
    "recompute",
    "sql_pipeline",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'watermark_dagster' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
