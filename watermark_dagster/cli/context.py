"""What every command needs: where things live, the code location, its store and registry.

Nothing here writes to the control tables. Loading a code location only builds it;
``store`` creates missing control tables on first use, as the sensors do, while
``read_store`` (for commands that only look) creates and writes nothing.
"""

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import shutil
import sys
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

# Exit codes, documented in `watermark --help` and docs/cli.md.
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


# The instance configuration the package ships (a link to the repository's dagster.yaml,
# whose content a wheel carries), copied into DAGSTER_HOME; and the file that remembers what
# was copied, so an unedited copy follows the shipped file and an edited one is left alone.
SHIPPED_DAGSTER_YAML = Path(__file__).with_name("dagster.yaml")
SYNC_STAMP = ".watermark-dagster-yaml.json"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sync_dagster_yaml(path: Path, shipped: Path = SHIPPED_DAGSTER_YAML) -> str | None:
    """Keep ``<path>/dagster.yaml`` in step with the shipped one.

    Missing: copied. An unedited copy of an older shipped file: replaced by the new one.
    Edited (or of unknown origin) while the shipped file changed: left as it is, and the
    user told once per shipped version.

    Returns:
        The line to tell the user, or None when there is nothing to say.
    """
    config = path / "dagster.yaml"
    stamp_file = path / SYNC_STAMP
    if not shipped.is_file():  # a broken install: keep Dagster's defaults, without telemetry
        if not config.exists():
            config.write_text("telemetry:\n  enabled: false\n")
        return None
    new = _digest(shipped)
    try:
        stamp = json.loads(stamp_file.read_text())
    except (OSError, ValueError):
        stamp = {}
    message = None
    if not config.exists():
        shutil.copy(shipped, config)
        copied = new
    elif (current := _digest(config)) == new:
        copied = new
    elif current == stamp.get("copied"):
        shutil.copy(shipped, config)
        copied = new
        message = f"updated {config} to the shipped {shipped} (it changed; your copy was unedited)"
    else:
        copied = stamp.get("copied")
        if stamp.get("shipped") != new:
            message = (
                f"{config} differs from the shipped {shipped}, which changed; yours is used "
                f"as it is. To take the shipped one: cp {shipped} {config}"
            )
    if stamp != {"copied": copied, "shipped": new}:
        # A DAGSTER_HOME the user cannot write (a shared instance) is read as it is.
        with contextlib.suppress(OSError):
            stamp_file.write_text(json.dumps({"copied": copied, "shipped": new}) + "\n")
    return message


def dagster_home(home: Path, console: Console | None = None) -> Path:
    """DAGSTER_HOME, defaulting to ``<WATERMARK_HOME>/dagster``, its dagster.yaml kept in
    step with the shipped one (:func:`sync_dagster_yaml`; what changed is told on
    ``console``)."""
    path = Path(os.environ.get("DAGSTER_HOME") or home / "dagster").resolve()
    path.mkdir(parents=True, exist_ok=True)
    message = sync_dagster_yaml(path)
    if message:
        (console or Console()).problem(message, style="warn")
    os.environ["DAGSTER_HOME"] = str(path)
    return path


def load_location(spec: str) -> "WatermarkLocation":
    """The code location at ``module:attribute`` (the module found on the import path or
    in the current folder): a location built by ``build_location``, or the ``Definitions``
    built by ``build_definitions``.

    Raises:
        UsageError: the module cannot be imported or has no such attribute.
        ConfigurationError: the attribute is not a watermark code location.
    """
    from watermark_dagster.dagster_defs.definitions import location_of

    module_name, _, attr = spec.partition(":")
    # The current folder is on the import path, as ``python -m`` and ``dagster -m`` put it:
    # ``--defs shop_location:defs`` finds ``./shop_location.py``.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
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
        # The file stderr goes to while a quiet command runs (None: stderr is the terminal).
        self.log: Path | None = None
        dagster_home(self.home, self.console)

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
