"""Where the demo keeps its tables (no Spark: the code location loads it)."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DemoPaths:
    """Where the demo keeps its tables under one home folder."""

    home: Path

    def upstream(self, name: str) -> str:
        """Path of a demo upstream table."""
        return str(self.home / "demo" / "upstreams" / name)

    def target(self, name: str) -> str:
        """Path of a demo pipeline's target table."""
        return str(self.home / "demo" / "targets" / name)

    @property
    def control_root(self) -> str:
        """Path of the control tables."""
        return str(self.home / "control")
