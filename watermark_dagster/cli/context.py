"""What every command needs: where things live, the code location, its store and registry.

Nothing here writes to the control tables. Loading a code location only builds its
definitions; ``store`` creates missing control tables on first use, as the sensors do,
while ``read_store`` (for commands that only look) creates and writes nothing.
"""

import argparse
import importlib
import os
import shutil
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from watermark_dagster.cli.render import Console

if TYPE_CHECKING:
    from dagster import Definitions

    from watermark_dagster.config.registry import Registry
    from watermark_dagster.config.upstream import Upstream
    from watermark_dagster.store import WatermarkStore

DEFAULT_DEFS = "watermark_dagster.definitions:defs"

# Exit codes, documented in `watermark --help` and the README.
EXIT_OK = 0
EXIT_FAILED = 1  # a pipeline failed, a batch is stuck, a target differs from its recompute
EXIT_REFUSED = 2  # bad input or configuration, or a refused write: nothing was written


class Refusal(Exception):
    """A command refused its input or a write; nothing was written (exit 2).

    The message names the value at fault and ends with the fix.
    """


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


def load_defs(spec: str) -> "Definitions":
    """The ``Definitions`` at ``module:attribute``.

    Raises:
        Refusal: the module cannot be imported or has no such attribute.
    """
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise Refusal(
            f"cannot import code location module {module_name!r} ({e}); give --defs as "
            "module:attribute, e.g. my_project.definitions:defs."
        ) from e
    try:
        return getattr(module, attr or "defs")
    except AttributeError:
        raise Refusal(
            f"module {module_name!r} has no attribute {attr or 'defs'!r}; give --defs as "
            "module:attribute."
        ) from None


class Context:
    """One command's view of the code location, loaded on first use."""

    def __init__(self, args: argparse.Namespace, console: Console | None = None) -> None:
        self.args = args
        self.console = console or Console()
        self.home = watermark_home(args)
        dagster_home(self.home)

    @cached_property
    def defs(self) -> "Definitions":
        """The code location (``--defs``)."""
        return load_defs(getattr(self.args, "defs", None) or DEFAULT_DEFS)

    @cached_property
    def registry(self) -> "Registry":
        """Its upstreams and pipelines."""
        from watermark_dagster.dagster_defs.definitions import registry_of

        return registry_of(self.defs)

    @cached_property
    def store(self) -> "WatermarkStore":
        """Its control tables."""
        return self.defs.resources["watermark_store"].get_store()  # type: ignore[union-attr]

    @cached_property
    def read_store(self) -> "WatermarkStore":
        """The same control tables opened read-only: nothing is created (a missing control
        table reads as empty) and nothing can be written. For commands that only look."""
        from watermark_dagster.store import ReadOnlyWatermarkStore

        store = self.store
        return ReadOnlyWatermarkStore(store.root, storage_options=store.storage_options)

    def spark(self) -> Any:
        """The code location's Spark session, started once for the whole command."""
        return self.defs.resources["spark"].get_session()  # type: ignore[union-attr]

    def upstream(self, name: str) -> "Upstream":
        """An upstream by name.

        Raises:
            Refusal: no upstream has that name; the message lists the known ones.
        """
        found = self.registry.upstreams.get(name)
        if found is None:
            known = sorted(self.registry.upstreams)
            raise Refusal(
                f"unknown upstream {name!r}; the code location has {known}. Use `watermark list`."
            )
        return found

    def consumers(self, upstream: str) -> list[str]:
        """Pipelines that read ``upstream``, sorted."""
        return sorted(n for n, p in self.registry.pipelines.items() if upstream in p.upstreams)
