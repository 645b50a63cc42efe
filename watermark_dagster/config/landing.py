"""The landing-folder upstream: a folder where files (Parquet, CSV, JSON) appear.

Each file is loaded once. A file is numbered when it is first seen (settled, matching the
pattern) in the upstream's file log, a small Delta table of its own
(:mod:`watermark_dagster.observe.landing_log`); those numbers are the upstream's versions,
so a batch pins an inclusive range of file numbers exactly as it pins a range of Delta
versions, and the committed watermark is the number of the last file loaded.

Example:
    >>> drops = LandingUpstream(name="drops", path="/landing/drops", format="csv",
    ...                         file_schema="id BIGINT, amount DOUBLE",
    ...                         settle_seconds=60)
"""

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import ClassVar, Literal

from watermark_dagster.config.locations import absolute_location
from watermark_dagster.config.names import enum_value
from watermark_dagster.config.options import Kind, is_seconds, written_as
from watermark_dagster.config.upstream import Upstream, UpstreamMode
from watermark_dagster.errors import ConfigurationError


class LandingFormat(StrEnum):
    """The file formats a landing folder may hold (one per upstream)."""

    PARQUET = "parquet"
    CSV = "csv"
    JSON = "json"


LandingFormatValue = Literal["parquet", "csv", "json"]

# The file log's folder inside the landing folder when ``files_log`` is not given: a name
# starting with "_" is skipped by the listing (and by Spark's own file sources).
DEFAULT_LOG_FOLDER = "_watermark_files"


@dataclass(frozen=True, kw_only=True)
class LandingUpstream(Upstream):
    """A landing folder: each file that appears under ``path`` is loaded exactly once.

    Args:
        format: the files' format: ``parquet`` (default), ``csv`` or ``json``.
        file_schema: for ``csv`` and ``json``, the files' columns as a Spark DDL string
            (``"id BIGINT, name STRING"``); without it each read infers them, so two
            batches may type a column differently.
        read_options: Spark reader options of the format (``header: "true"`` for CSV
            files with a header line, ``multiLine: "true"`` for JSON documents, ...).
        pattern: which files are taken: a glob matched against each file's path relative
            to ``path``, segment by segment: ``*`` stops at ``/``, a ``**`` segment matches
            zero or more folders (``*.csv``: the top folder's CSV files; ``**/*.csv``: at
            any depth; ``2026/*/*.json``; default ``**``: every file). Files and folders
            whose names start with ``.`` or ``_`` are never taken.
        settle_seconds: a file is taken only once it was last modified at least this many
            seconds ago, so a file still being written is not loaded half-written
            (default 30).
        max_files_per_batch: cap on how many files one batch loads (None: no cap).
        files_log: where the upstream's file log (a Delta table) lives; default
            ``<path>/_watermark_files``. Give another location when the landing folder
            is read-only.

    The shared arguments (``name``, ``path``, ...) are those of :class:`Upstream`;
    ``start_from`` takes ``beginning``, ``latest`` (files seen at the first look are
    skipped) or a file number, not a timestamp.
    """

    is_cursor: ClassVar[bool] = False

    format: LandingFormatValue = field(default="parquet", metadata=written_as(Kind.CHOICE))
    file_schema: str | None = field(
        default=None, metadata=written_as(Kind.TEXT, shape="text (a Spark DDL schema)")
    )
    read_options: dict[str, str] | None = field(default=None, metadata=written_as(Kind.OPTIONS))
    pattern: str = field(default="**", metadata=written_as(Kind.TEXT, shape="text (a glob)"))
    settle_seconds: float = field(default=30.0, metadata=written_as(Kind.SECONDS))
    max_files_per_batch: int | None = field(
        default=None, metadata=written_as(Kind.WHOLE, shape="a whole number of files")
    )
    files_log: str | None = field(default=None, metadata=written_as(Kind.LOCATION))

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = self.owner
        if self.table is not None:
            raise ConfigurationError(
                f"{owner} is a landing folder; it cannot be named by catalog table {self.table!r}.",
                upstream=self.name,
                fix="give the folder's location as path=...",
            )
        if isinstance(self.files_log, str) and self.files_log.strip():
            object.__setattr__(self, "files_log", absolute_location(self.files_log))
        if isinstance(self.start_from, datetime):
            raise ConfigurationError(
                f"{owner}: start_from={self.start_from.isoformat()} is a timestamp; a landing "
                "folder's files are not ordered by time.",
                upstream=self.name,
                fix="use 'beginning', 'latest' (skip the files there now) or a file number.",
            )
        object.__setattr__(self, "format", enum_value(LandingFormat, self.format, "format", owner))
        if self.file_schema is not None and (
            not isinstance(self.file_schema, str) or not self.file_schema.strip()  # pyright: ignore[reportUnnecessaryIsInstance]
        ):
            raise ConfigurationError(
                f"{owner}: file_schema {self.file_schema!r} is not a Spark DDL schema.",
                upstream=self.name,
                fix="e.g. file_schema='id BIGINT, amount DOUBLE', or leave it out.",
            )
        if self.file_schema is not None and self.format is LandingFormat.PARQUET:
            raise ConfigurationError(
                f"{owner}: file_schema is for csv and json files; Parquet files carry their own.",
                upstream=self.name,
                fix="remove file_schema, or set format to 'csv' or 'json'.",
            )
        if not isinstance(self.pattern, str) or not self.pattern.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ConfigurationError(
                f"{owner}: pattern {self.pattern!r} is not a glob.",
                upstream=self.name,
                fix="e.g. pattern='*.csv', or leave it out to take every file.",
            )
        segments = self.pattern.split("/")
        if any(not p or p in (".", "..") or ("**" in p and p != "**") for p in segments):
            raise ConfigurationError(
                f"{owner}: pattern {self.pattern!r} matches no file: it is matched against "
                "each file's path relative to the folder, segment by segment, so it may not "
                "start or end with '/', hold '//', '.' or '..' segments, or '**' inside a "
                "segment ('**' is a whole segment: zero or more folders).",
                upstream=self.name,
                fix="e.g. pattern='*.csv' (top folder), '**/*.csv' (any depth) or '**' "
                "(every file).",
            )
        settle = self.settle_seconds
        if not is_seconds(settle):
            raise ConfigurationError(
                f"{owner}: settle_seconds must be a finite number >= 0, got {settle!r}.",
                upstream=self.name,
                fix="e.g. settle_seconds=60 (0 takes a file as soon as it is listed).",
            )
        cap = self.max_files_per_batch
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ConfigurationError(
                f"{owner}: max_files_per_batch must be a positive integer, got {cap!r}.",
                upstream=self.name,
                fix="set it to 1 or more, or leave it unset for no cap.",
            )
        if self.read_options is not None:
            object.__setattr__(
                self, "read_options", {str(k): str(v) for k, v in self.read_options.items()}
            )

    @property
    def mode(self) -> UpstreamMode:
        """Always ``append_only``: each file is an addition; a changed file is an error."""
        return UpstreamMode.APPEND_ONLY

    @property
    def max_versions_per_batch(self) -> int | None:
        """The file cap: a landing upstream's versions are its file numbers."""
        return self.max_files_per_batch

    @property
    def log_location(self) -> str:
        """Where the file log lives (``files_log``, else a folder inside ``path``)."""
        return self.files_log or f"{self.path.rstrip('/')}/{DEFAULT_LOG_FOLDER}"
