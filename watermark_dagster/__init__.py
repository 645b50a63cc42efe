"""watermark-dagster: exactly-once, replayable incremental processing over Delta Lake tables.

The public API: declare upstreams and pipelines, build the code location's definitions.
"""

from watermark_dagster.config.pipeline import (
    BatchContext,
    PinnedInput,
    Pipeline,
    WriteMode,
    pipeline,
)
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream, Upstream
from watermark_dagster.dagster_defs.assets import WatermarkTranslator
from watermark_dagster.dagster_defs.definitions import build_definitions
from watermark_dagster.dagster_defs.resources import SparkSessionResource, WatermarkStoreResource
from watermark_dagster.dagster_defs.sensors import WatermarkSettings
from watermark_dagster.read.changes import recompute
from watermark_dagster.store import WatermarkStore

__all__ = [
    "BatchContext",
    "CursorUpstream",
    "DeltaUpstream",
    "PinnedInput",
    "Pipeline",
    "Registry",
    "SparkSessionResource",
    "Upstream",
    "WatermarkSettings",
    "WatermarkStore",
    "WatermarkStoreResource",
    "WatermarkTranslator",
    "WriteMode",
    "build_definitions",
    "pipeline",
    "recompute",
]
