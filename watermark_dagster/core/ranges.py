"""The records for what a batch reads: a version range, or a cursor window.

Boundary semantics are stated once, here.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class ReadMode(StrEnum):
    """How a pipeline reads one upstream for one batch (recorded in the plan).

    * ``CDF``: the change data feed of the range.
    * ``APPEND_ONLY``: only the files the range's commits added (no change data feed).
    * ``SNAPSHOT``: the whole table as of the range's end (first loads, snapshot-only
      upstreams, pipelines that overwrite their target).
    * ``TIMESTAMP``: rows whose cursor falls in a window ``(start, end]``.
    * ``NOOP``: nothing new; nothing read.
    """

    CDF = "CDF"
    APPEND_ONLY = "APPEND_ONLY"
    SNAPSHOT = "SNAPSHOT"
    TIMESTAMP = "TIMESTAMP"
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


# A cursor position: the cursor value followed by the tie-break key values, compared as a
# tuple. Timestamps are kept as ISO 8601 strings in UTC, so positions are plain JSON.
CursorPosition = tuple[Any, ...]


def encode_position(position: Sequence[Any] | None) -> str | None:
    """A cursor position as stored in the control tables (JSON), None stays None."""
    return None if position is None else json.dumps(list(position), default=str)


def decode_position(text: str | None) -> CursorPosition | None:
    """Inverse of :func:`encode_position`."""
    return None if text is None else tuple(json.loads(text))


@dataclass(frozen=True)
class CursorWindow:
    """A half-open window of cursor positions: ``(start, end]``.

    ``start`` None means from the beginning. ``end`` None means not pinned yet: it is
    pinned from the data at the batch's first read and reused by every retry. Rows are
    compared on ``(cursor, *tie_break_keys)``, so rows sharing a cursor value at a
    boundary are split by their keys: none is read twice, none is skipped.
    """

    start: CursorPosition | None
    end: CursorPosition | None = None

    @property
    def pinned(self) -> bool:
        """True once the end is fixed."""
        return self.end is not None

    def __str__(self) -> str:
        start = "-inf" if self.start is None else ", ".join(map(str, self.start))
        end = "?" if self.end is None else ", ".join(map(str, self.end))
        return f"({start} .. {end}]"
