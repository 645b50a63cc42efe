"""The one record for a version range, with its boundary semantics stated once."""

from dataclasses import dataclass
from enum import StrEnum


class ReadMode(StrEnum):
    """How a pipeline reads one upstream for one batch (recorded in the plan)."""

    CDF = "CDF"
    NOOP = "NOOP"


@dataclass(frozen=True, order=True)
class VersionRange:
    """An inclusive range of Delta versions: ``[start, end]``.

    Both ends are included: a batch that read ``VersionRange(3, 5)`` applied the commits
    of versions 3, 4 and 5, and the committed watermark may then move from 2 to 5.
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0:
            raise ValueError(f"a version range cannot start below 0, got start={self.start}")
        if self.end < self.start:
            raise ValueError(
                f"a version range must not end before it starts, got [{self.start}, {self.end}]"
            )

    @property
    def size(self) -> int:
        """How many versions the range covers."""
        return self.end - self.start + 1

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}]"
