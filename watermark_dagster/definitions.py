"""The code location ``workspace.yaml`` loads: the demo registry on embedded defaults, or
the YAML registry file ``WATERMARK_REGISTRY`` names.

Replace ``build_demo_registry`` with your own registry to point it at your tables; every
setting is read from the environment by :mod:`watermark_dagster.config.env`.

``location`` is the code location (registry, control tables, Spark resource); ``defs`` its
``Definitions``, which ``workspace.yaml`` loads. The ``watermark`` command line accepts
either with ``--defs``.
"""

import os
from pathlib import Path

from dagster import Definitions

from watermark_dagster.config import env
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.secrets import StorageOptions
from watermark_dagster.config.yaml_file import load_registry_file
from watermark_dagster.dagster_defs.component import (
    settings_from_environment,
    spark_from_environment,
)
from watermark_dagster.dagster_defs.definitions import WatermarkLocation, build_location
from watermark_dagster.demo import DemoPaths, build_demo_registry


def build_demo_location(home: Path | None = None, **overrides: object) -> WatermarkLocation:
    """The demo code location rooted at ``home`` (default: ``WATERMARK_HOME``).

    ``overrides`` replace fields of :class:`WatermarkSettings` (tests use this).
    """
    paths = DemoPaths(home or env.home())
    return _location(build_demo_registry(paths), paths.control_root, None, overrides)


def build_demo_definitions(home: Path | None = None, **overrides: object) -> Definitions:
    """The ``Definitions`` of :func:`build_demo_location`."""
    return build_demo_location(home, **overrides).definitions


def build_file_location(
    path: str | os.PathLike[str], home: Path | None = None, **overrides: object
) -> WatermarkLocation:
    """The code location a YAML registry file declares (see
    :mod:`watermark_dagster.config.yaml_file`); its control tables are at the file's
    ``control_root:``, else under ``home`` (default: ``WATERMARK_HOME``) as for the demo.

    Raises:
        ConfigurationError: the file or one of its entries is wrong (nothing is written).
    """
    loaded = load_registry_file(path)
    control_root = loaded.control_root or DemoPaths(home or env.home()).control_root
    return _location(loaded.registry, control_root, loaded.control_storage_options, overrides)


def build_file_definitions(
    path: str | os.PathLike[str], home: Path | None = None, **overrides: object
) -> Definitions:
    """The ``Definitions`` of :func:`build_file_location`.

    Raises:
        ConfigurationError: the file or one of its entries is wrong (nothing is written).
    """
    return build_file_location(path, home, **overrides).definitions


def _location(
    registry: Registry,
    control_root: str,
    storage_options: StorageOptions | None,
    overrides: dict[str, object],
) -> WatermarkLocation:
    # Every setting from WATERMARK_... variables, as a component's left-out settings are.
    watermark_settings = settings_from_environment()
    if overrides:
        from dataclasses import replace

        watermark_settings = replace(watermark_settings, **overrides)  # type: ignore[arg-type]
    return build_location(
        registry,
        control_root=control_root,
        storage_options=storage_options,
        spark=spark_from_environment(),
        settings=watermark_settings,
    )


def build_default_location() -> WatermarkLocation:
    """The registry file ``WATERMARK_REGISTRY`` names if it is set, else the demo."""
    path = env.registry_file()
    return build_file_location(path) if path else build_demo_location()


def build_default_definitions() -> Definitions:
    """The ``Definitions`` of :func:`build_default_location`."""
    return build_default_location().definitions


location = build_default_location()
defs = location.definitions
