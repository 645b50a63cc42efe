"""Upstreams: the tables pipelines read, by Delta version or by a cursor column.

Two kinds, two types, each with only the settings that apply to it:

* :class:`DeltaUpstream`: a Delta table read by version range (change data feed, appended
  files or snapshot).
* :class:`CursorUpstream`: a table or folder without usable versions, read in windows of a
  cursor column (a timestamp or an increasing number).

Both are :class:`Upstream`, which holds what they share. Every argument is a keyword.

Example:
    >>> orders = DeltaUpstream(name="orders", path="/lake/orders")
    >>> clicks = CursorUpstream(name="clicks", path="/landing/clicks", cursor="event_time",
    ...                         format="parquet")
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import ClassVar, Literal

from watermark_dagster.config.locations import absolute_location
from watermark_dagster.config.names import (
    check_table_declaration,
    enum_value,
    table_name_parts,
    validate_name,
)
from watermark_dagster.config.options import Kind, is_seconds, written_as
from watermark_dagster.config.secrets import StorageOptions, checked_options
from watermark_dagster.errors import ConfigurationError


class UpstreamMode(StrEnum):
    """How an upstream is read incrementally.

    * ``auto``: the change data feed when the table has it on, else only appended files.
    * ``cdf``: always the change data feed (a range without it fails loudly).
    * ``append_only``: only the files each commit added; a commit that updates or deletes
      fails the batch, or is read as a snapshot when ``on_data_change="snapshot"``.
    * ``snapshot``: the whole table each time it changes (its pipelines reload fully).
    * ``timestamp``: no versions; rows are read by a cursor column in windows (every
      :class:`CursorUpstream`).
    """

    AUTO = "auto"
    CDF = "cdf"
    APPEND_ONLY = "append_only"
    SNAPSHOT = "snapshot"
    TIMESTAMP = "timestamp"


class OnDataChange(StrEnum):
    """What an APPEND_ONLY read does with a commit that updates or deletes rows."""

    FAIL = "fail"
    SNAPSHOT = "snapshot"


class SchemaChanges(StrEnum):
    """Which schema changes inside a batch's range pass.

    * ``additive``: new nullable columns pass; dropped, renamed or retyped columns fail.
    * ``strict``: any change fails.
    """

    ADDITIVE = "additive"
    STRICT = "strict"


# The values a declaration may give; each is stored as the matching member of the enum
# above, which is a `str` equal to it.
DeltaMode = Literal["auto", "cdf", "append_only", "snapshot"]
OnDataChangeValue = Literal["fail", "snapshot"]
SchemaChangesValue = Literal["additive", "strict"]
StartFrom = Literal["beginning", "latest"] | int | datetime | str


def _parse_start(value: object, owner: str) -> str | int | datetime:
    """``start_from``: "beginning", "latest", a version (int) or a timestamp."""
    if isinstance(value, bool):
        value = str(value)
    if isinstance(value, int):
        if value < 0:
            raise ConfigurationError(
                f"{owner}: start_from version {value} is negative.",
                fix="give a version >= 0, 'beginning', 'latest' or a timestamp.",
            )
        return value
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("beginning", "latest"):
            return text
        if text.isdigit():
            return int(text)
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    raise ConfigurationError(
        f"{owner}: start_from {value!r} is not 'beginning', 'latest', a version or an ISO 8601 "
        "timestamp.",
        fix="e.g. start_from='latest', start_from=42 or start_from='2026-01-31T00:00:00Z'.",
    )


@dataclass(frozen=True, kw_only=True)
class Upstream:
    """What every upstream has. Declare a :class:`DeltaUpstream` or a
    :class:`CursorUpstream`; code that handles either takes an ``Upstream``.

    Args:
        name: registry name; also the Dagster asset key.
        path: location of the table or folder (local path or object-store URI).
        table: instead of ``path``, the name of a table in the Spark catalog
            (``schema.table`` or ``catalog.schema.table``; parts in backticks for other
            characters). It is resolved to its location when the code location loads,
            and each run checks that the name still points there.
        storage_options: delta-rs / Spark storage options for object stores; a credential
            is given as ``EnvRef("VARIABLE")`` (``{env: VARIABLE}`` in YAML) or left to the
            environment, never as text (see :mod:`watermark_dagster.config.secrets`).
        description: shown in the Dagster UI.
        start_from: where the first batch starts: ``beginning`` (default: a snapshot of
            the latest version), ``latest`` (only what arrives after the first plan), a
            version (Delta upstreams), or a timestamp (the commits after it; for cursor
            upstreams, the rows after it).
    """

    is_cursor: ClassVar[bool]
    """True when the upstream has no versions and is read through a cursor column."""

    name: str
    path: str = field(default="", metadata=written_as(Kind.LOCATION))
    table: str | None = field(default=None, metadata=written_as(Kind.TABLE))
    storage_options: StorageOptions | None = field(
        default=None, metadata=written_as(Kind.STORAGE_OPTIONS)
    )
    description: str | None = field(default=None, metadata=written_as(Kind.TEXT))
    start_from: StartFrom = field(default="beginning", metadata=written_as(Kind.START))

    def __post_init__(self) -> None:
        if type(self) is Upstream:
            raise TypeError(
                "Upstream is the common base: declare DeltaUpstream(name=..., path=...) or "
                "CursorUpstream(name=..., path=..., cursor=...)."
            )
        validate_name("upstream name", self.name)
        if self.table is not None:
            check_table_declaration(self.owner, self.path, self.table, upstream=self.name)
        # Declarations come from plain Python and YAML: the annotations are not enforced.
        elif not isinstance(self.path, str) or not self.path.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ConfigurationError(
                f"{self.owner} has no path.",
                upstream=self.name,
                fix="give the table's location as path=..., or its catalog name as table=...",
            )
        else:
            object.__setattr__(self, "path", absolute_location(self.path))
        object.__setattr__(self, "start_from", _parse_start(self.start_from, self.owner))
        object.__setattr__(
            self, "storage_options", checked_options(self.owner, self.storage_options)
        )

    @property
    def owner(self) -> str:
        """How errors name this upstream."""
        return f"Upstream '{self.name}'"

    @property
    def table_parts(self) -> tuple[str, ...] | None:
        """The parts of ``table`` without backticks (None: the upstream is named by path)."""
        return None if self.table is None else table_name_parts(self.table, self.owner)

    @property
    def mode(self) -> UpstreamMode:
        """How the upstream is read (:class:`UpstreamMode`)."""
        raise NotImplementedError

    @property
    def max_versions_per_batch(self) -> int | None:
        """The cap on the versions one batch reads (None: no cap; cursor upstreams have no
        versions)."""
        return None


@dataclass(frozen=True, kw_only=True)
class DeltaUpstream(Upstream):
    """A Delta table read by version range.

    Args:
        mode: ``auto`` (default: the change data feed when the table has it on, else
            appended files), ``cdf``, ``append_only`` or ``snapshot`` (:class:`UpstreamMode`).
        on_data_change: for ``append_only`` reads, what a commit that updates or deletes
            does: ``fail`` the batch (default) or read the range as a ``snapshot``.
        schema_changes: which schema changes inside a range pass: ``additive`` (default)
            or ``strict``.
        max_versions_per_batch: cap on how many versions one batch reads (None: no cap).

    The shared arguments (``name``, ``path``, ...) are those of :class:`Upstream`. The
    enumerated settings are stored as members of their enums (each a ``str`` equal to the
    value given).
    """

    is_cursor: ClassVar[bool] = False

    # Dataclass fields implementing the base's read-only properties.
    mode: DeltaMode = field(default="auto", metadata=written_as(Kind.CHOICE))  # pyright: ignore[reportIncompatibleMethodOverride]
    on_data_change: OnDataChangeValue = field(default="fail", metadata=written_as(Kind.CHOICE))
    schema_changes: SchemaChangesValue = field(default="additive", metadata=written_as(Kind.CHOICE))
    max_versions_per_batch: int | None = field(  # pyright: ignore[reportIncompatibleMethodOverride]
        default=None, metadata=written_as(Kind.WHOLE, shape="a whole number of versions")
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = self.owner
        mode = enum_value(UpstreamMode, self.mode, "mode", owner)
        if mode is UpstreamMode.TIMESTAMP:
            raise ConfigurationError(
                f"{owner}: mode 'timestamp' reads by a cursor column, not by version.",
                upstream=self.name,
                fix="declare it as CursorUpstream(name=..., path=..., cursor='updated_at'), "
                "or choose mode 'auto', 'cdf', 'append_only' or 'snapshot'.",
            )
        cap = self.max_versions_per_batch
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ConfigurationError(
                f"{owner}: max_versions_per_batch must be a positive integer, got {cap!r}.",
                upstream=self.name,
                fix="set it to 1 or more, or leave it unset for no cap.",
            )
        set_ = object.__setattr__
        set_(self, "mode", mode)
        set_(
            self,
            "on_data_change",
            enum_value(OnDataChange, self.on_data_change, "on_data_change", owner),
        )
        set_(
            self,
            "schema_changes",
            enum_value(SchemaChanges, self.schema_changes, "schema_changes", owner),
        )


@dataclass(frozen=True, kw_only=True)
class CursorUpstream(Upstream):
    """A table or folder without usable versions, read in windows of a cursor column.

    Args:
        cursor: the cursor column: a timestamp or an increasing number.
        cursor_fallback: a column used where ``cursor`` is NULL.
        tie_break: key columns that order rows sharing a cursor value.
        lag_seconds: for timestamp cursors, how far behind "now" a window ends, so rows
            committed late by slow writers are not skipped.
        format: Spark source format (``delta``, ``parquet``, ...; default ``delta``).
        read_options: Spark reader options.

    The shared arguments (``name``, ``path``, ...) are those of :class:`Upstream`; a version
    is not a valid ``start_from`` (there are none).
    """

    is_cursor: ClassVar[bool] = True

    cursor: str = field(metadata=written_as(Kind.COLUMN))
    cursor_fallback: str | None = field(default=None, metadata=written_as(Kind.COLUMN))
    tie_break: Sequence[str] = field(default=(), metadata=written_as(Kind.NAMES))
    lag_seconds: float = field(default=0.0, metadata=written_as(Kind.SECONDS))
    format: str = field(
        default="delta", metadata=written_as(Kind.TEXT, shape="text (a Spark source format)")
    )
    read_options: Mapping[str, str] | None = field(default=None, metadata=written_as(Kind.OPTIONS))

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = self.owner
        if isinstance(self.start_from, int) and self.start_from != 0:
            raise ConfigurationError(
                f"{owner} has no versions (it is read by cursor); start_from="
                f"{self.start_from!r} cannot apply.",
                upstream=self.name,
                fix="use 'beginning', 'latest' or a timestamp.",
            )
        if not self.cursor:
            raise ConfigurationError(
                f"{owner} is read by cursor but names no cursor column.",
                upstream=self.name,
                fix="give cursor='updated_at' (a timestamp or increasing id column).",
            )
        object.__setattr__(self, "tie_break", tuple(self.tie_break))
        for column in (self.cursor, self.cursor_fallback, *self.tie_break):
            if column is not None:
                validate_name("cursor column", column)
        if not is_seconds(self.lag_seconds):
            raise ConfigurationError(
                f"{owner}: lag_seconds must be a finite number >= 0, got {self.lag_seconds!r}.",
                upstream=self.name,
            )
        validate_name("format", self.format)

    @property
    def mode(self) -> UpstreamMode:
        """Always ``timestamp``: rows are read in windows of the cursor column."""
        return UpstreamMode.TIMESTAMP
