"""The code location ``workspace.yaml`` loads: the demo registry on embedded defaults.

Replace ``build_demo_registry`` with your own registry to point it at your tables; every
setting is read from the environment by :mod:`watermark_dagster.settings`.
"""

import os
from pathlib import Path

from dagster import Definitions

from watermark_dagster import settings
from watermark_dagster.dagster_defs.definitions import build_definitions
from watermark_dagster.dagster_defs.resources import SparkSessionResource
from watermark_dagster.dagster_defs.sensors import WatermarkSettings
from watermark_dagster.demo import DemoPaths, build_demo_registry


def build_demo_definitions(home: Path | None = None, **overrides: object) -> Definitions:
    """The demo code location rooted at ``home`` (default: ``WATERMARK_HOME``).

    ``overrides`` replace fields of :class:`WatermarkSettings` (tests use this).
    """
    paths = DemoPaths(home or settings.home())
    watermark_settings = WatermarkSettings(
        min_batch_interval_seconds=settings.min_batch_interval_seconds(),
        sensor_interval_seconds=settings.sensor_interval_seconds(),
        max_attempts=settings.max_attempts(),
    )
    if overrides:
        from dataclasses import replace

        watermark_settings = replace(watermark_settings, **overrides)  # type: ignore[arg-type]
    return build_definitions(
        build_demo_registry(paths),
        control_root=paths.control_root,
        spark=SparkSessionResource(
            master=os.environ.get("WATERMARK_SPARK_MASTER", "local[*]"),
            remote=os.environ.get("WATERMARK_SPARK_REMOTE") or None,
            conf=settings.spark_conf(),
        ),
        settings=watermark_settings,
    )


defs = build_demo_definitions()
