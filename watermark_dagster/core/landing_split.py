"""Which file number a point in time means for a landing upstream, in plain Python.

A landing upstream's watermark is one number: files 1..N are applied. A time T means the
N that splits the log there: every file numbered up to N was modified at or before T, and
every file numbered after it was modified after T. The log numbers the files of one look
by modification time, so a log written by looks that each saw files as they landed always
splits; a file copied in later with an old modification time is numbered after newer
files, and a T between the two has no such N. Then no number is right: either a file
modified after T would count as applied (never loaded), or a file modified at or before T
would load. That is the operator's choice to make explicitly (``--version``), so it is
refused, naming both files.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Generic, Protocol, TypeVar

from watermark_dagster.errors import UsageError


class NumberedFile(Protocol):
    """A file as the file log numbers it."""

    @property
    def ordinal(self) -> int:
        """Its number (from 1)."""
        ...

    @property
    def path(self) -> str:
        """Its path relative to the landing folder."""
        ...

    @property
    def mtime_ns(self) -> int:
        """Its modification time, ns since the epoch."""
        ...


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def at_ns(when: datetime) -> int:
    """``when`` (timezone-aware) in ns since the epoch, exactly (no float rounding)."""
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


F = TypeVar("F", bound=NumberedFile)


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat()


def _named(f: NumberedFile) -> str:
    return f"{f.path!r} (file {f.ordinal}, modified {_iso(f.mtime_ns)})"


@dataclass(frozen=True)
class FileSplit(Generic[F]):
    """The files of a log on each side of a time: ``applied`` are files 1..N (modified at
    or before it), ``to_load`` the later ones (modified after it), each by number."""

    applied: tuple[F, ...]
    to_load: tuple[F, ...]

    @property
    def version(self) -> int:
        """N: the number of the last file applied (0: none)."""
        return len(self.applied)


def split_at(upstream: str, files: Iterable[F], when: datetime, *, text: str) -> FileSplit[F]:
    """Split the numbered ``files`` of ``upstream`` at ``when`` (``text``: as typed).

    A file modified exactly at ``when`` is applied.

    Raises:
        UsageError: the numbering is not split by ``when`` (a file modified after it is
            numbered before one modified at or before it): names both files, their
            times and the two explicit ``--version`` choices.
    """
    ordered = sorted(files, key=lambda f: f.ordinal)
    limit = at_ns(when)
    late = [f for f in ordered if f.mtime_ns > limit]
    early = [f for f in ordered if f.mtime_ns <= limit]
    if late and early and early[-1].ordinal > late[0].ordinal:
        first_late, last_early = late[0], early[-1]
        raise UsageError(
            f"--timestamp {text!r} ({when.isoformat()}) does not split the file log of "
            f"upstream {upstream!r}: {_named(first_late)} was modified after it, but "
            f"{_named(last_early)} was modified at or before it and numbered later (it was "
            "logged after, for instance copied in keeping an old modification time). The "
            "watermark is one number, so either the later-numbered old file loads or the "
            "earlier-numbered new one does not; nothing was changed. Choose explicitly: "
            f"`watermark set -t {upstream} --version {first_late.ordinal - 1}` (files from "
            f"{first_late.ordinal} on load, {last_early.path!r} too), or "
            f"`--version {last_early.ordinal}` (files up to {last_early.ordinal} count as "
            f"applied, {first_late.path!r} too, and never load). "
            f"`watermark get -t {upstream} --show-files` lists every file with its number."
        )
    return FileSplit(tuple(early), tuple(late))
