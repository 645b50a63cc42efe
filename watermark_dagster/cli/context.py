"""What every command needs: where things live, the code location, its store and registry.

Nothing here writes to the control tables. Loading a code location only builds it;
``store`` creates missing control tables on first use, as the sensors do, while
``read_store`` (for commands that only look) creates and writes nothing.
"""

import argparse
import importlib
import os
import shutil
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from watermark_dagster.cli.render import Console
from watermark_dagster.errors import UsageError

if TYPE_CHECKING:
    from dagster import Definitions
    from pyspark.sql import SparkSession

    from watermark_dagster.config.registry import Registry
    from watermark_dagster.config.upstream import Upstream
    from watermark_dagster.dagster_defs.definitions import WatermarkLocation
    from watermark_dagster.store import WatermarkStore

DEFAULT_DEFS = "watermark_dagster.definitions:defs"

# Exit codes, documented in `watermark --help` and the README.
EXIT_OK = 0
EXIT_FAILED = 1  # a pipeline failed, a batch is stuck, a target differs from its recompute
EXIT_REFUSED = 2  # bad input or configuration, or a refused write: nothing was written


def watermark_home(args: argparse.Namespace) -> Path:
    """``--home``, else ``WATERMARK_HOME``, else ``./.watermark``; exported to the code
    location."""
    raw = getattr(args, "home", None) or os.environ.get("WATERMARK_HOME", ".watermark")
    home = Path(raw).expanduser().resolve()
    os.environ["WATERMARK_HOME"] = str(home)
    return home


def dagster_home(home: Path) -> Path:
    """DAGSTER_HOME, defaulting to ``<WATERMARK_HOME>/dagster`` with the repo's dagster.yaml."""
    path = Path(os.environ.get("DAGSTER_HOME") or home / "dagster").resolve()
    path.mkdir(parents=True, exist_ok=True)
    config = path / "dagster.yaml"
    if not config.exists():
        shipped = Path.cwd() / "dagster.yaml"
        if shipped.exists():
            shutil.copy(shipped, config)
        else:
            config.write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(path)
    return path


def load_location(spec: str) -> "WatermarkLocation":
    """The code location at ``module:attribute``: a location built by ``build_location``,
    or the ``Definitions`` built by ``build_definitions``.

    Raises:
        UsageError: the module cannot be imported or has no such attribute.
        ConfigurationError: the attribute is not a watermark code location.
    """
    from watermark_dagster.dagster_defs.definitions import location_of

    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(
            f"cannot import code location module {module_name!r} ({e}); give --defs as "
            "module:attribute, e.g. my_project.definitions:defs."
        ) from e
    try:
        found = getattr(module, attr or "defs")
    except AttributeError:
        raise UsageError(
            f"module {module_name!r} has no attribute {attr or 'defs'!r}; give --defs as "
            "module:attribute."
        ) from None
    return location_of(found)


class Context:
    """One command's view of the code location, loaded on first use."""

    def __init__(self, args: argparse.Namespace, console: Console | None = None) -> None:
        self.args = args
        self.console = console or Console()
        self.home = watermark_home(args)
        dagster_home(self.home)

    @cached_property
    def location(self) -> "WatermarkLocation":
        """The code location (``--defs``)."""
        return load_location(getattr(self.args, "defs", None) or DEFAULT_DEFS)

    @property
    def defs(self) -> "Definitions":
        """Its Dagster definitions."""
        return self.location.definitions

    @property
    def registry(self) -> "Registry":
        """Its upstreams and pipelines."""
        return self.location.registry

    @cached_property
    def store(self) -> "WatermarkStore":
        """Its control tables."""
        return self.location.store()

    @cached_property
    def read_store(self) -> "WatermarkStore":
        """The same control tables opened read-only: nothing is created (a missing control
        table reads as empty) and nothing can be written. For commands that only look."""
        return self.location.read_only_store()

    def spark(self) -> "SparkSession":
        """The code location's Spark session, started once for the whole command."""
        return self.location.spark_session()

    def upstream(self, name: str) -> "Upstream":
        """An upstream by name.

        Raises:
            UsageError: no upstream has that name; the message lists the known ones.
        """
        found = self.registry.upstreams.get(name)
        if found is None:
            known = sorted(self.registry.upstreams)
            raise UsageError(
                f"unknown upstream {name!r}; the code location has {known}. Use `watermark list`."
            )
        return found
