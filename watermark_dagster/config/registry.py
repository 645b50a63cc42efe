"""Declaring upstreams and pipelines: a few lines each, validated when definitions load.

Example:
    >>> orders = Upstream("orders", path="/lake/orders")
    >>> @pipeline(upstreams=["orders"], target="/lake/orders_clean", keys=["order_id"])
    ... def orders_clean(batch):
    ...     return batch["orders"].net_changes(["order_id"])
    >>> registry = Registry(upstreams=[orders], pipelines=[orders_clean])
"""

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from watermark_dagster.core.columns import RESERVED_PREFIX
from watermark_dagster.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from watermark_dagster.operations.run_pipeline import BatchContext

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def validate_name(kind: str, value: str) -> str:
    """Check that ``value`` is a plain identifier (letters, digits, underscore).

    Names become asset keys, column references and file names; restricting them keeps
    quoting out of the picture entirely.
    """
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigurationError(
            f"Invalid {kind} {value!r}: use letters, digits and underscores, starting with a "
            "letter or underscore (at most 128 characters).",
            fix=f"rename the {kind}, e.g. {re.sub(r'[^A-Za-z0-9_]', '_', str(value))!r}.",
        )
    return value


class UpstreamMode(StrEnum):
    """How an upstream is read incrementally.

    * ``auto``: the change data feed when the table has it on, else only appended files.
    * ``cdf``: always the change data feed (a range without it fails loudly).
    * ``append_only``: only the files each commit added; a commit that updates or deletes
      fails the batch, or is read as a snapshot when ``on_data_change="snapshot"``.
    * ``snapshot``: the whole table each time it changes (its pipelines reload fully).
    * ``timestamp``: no versions; rows are read by a cursor column in windows.
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


def _enum(cls: type[StrEnum], value: Any, what: str, owner: str) -> Any:
    try:
        return cls(value.lower() if isinstance(value, str) else value)
    except ValueError:
        raise ConfigurationError(
            f"{owner}: {what} {value!r} is not one of {[m.value for m in cls]}.",
            fix=f"set {what} to one of {[m.value for m in cls]}.",
        ) from None


def _parse_start(value: Any, owner: str) -> "str | int | datetime":
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


@dataclass(frozen=True)
class Upstream:
    """A source table, read incrementally by version (Delta) or by a cursor column.

    Args:
        name: registry name; also the Dagster asset key.
        path: location of the table or folder (local path or object-store URI).
        storage_options: delta-rs / Spark storage options for object stores.
        max_versions_per_batch: cap on how many versions one batch reads (None: no cap).
        description: shown in the Dagster UI.
        mode: how ranges are read (:class:`UpstreamMode`, default ``auto``).
        on_data_change: for APPEND_ONLY reads, what a commit that updates or deletes
            does: ``fail`` the batch (default) or read the range as a ``snapshot``.
        start_from: where the first batch starts: ``beginning`` (default: each
            pipeline's first batch loads a snapshot of the latest version), ``latest``
            (skip history: only commits after the first plan), a version (read from it),
            or a timestamp (read the commits after it; for cursor upstreams, rows after it).
        schema_changes: which schema changes inside a range pass (default ``additive``).
        cursor: for ``mode="timestamp"``: the cursor column (a timestamp or an
            increasing number).
        cursor_fallback: a column used where ``cursor`` is NULL.
        tie_break: key columns that order rows sharing a cursor value.
        lag_seconds: for timestamp cursors, how far behind "now" a window ends, so rows
            committed late by slow writers are not skipped.
        format: Spark source format of a cursor upstream (``delta``, ``parquet``, ...).
        read_options: Spark reader options of a cursor upstream.
    """

    name: str
    path: str
    storage_options: Mapping[str, str] | None = None
    max_versions_per_batch: int | None = None
    description: str | None = None
    mode: UpstreamMode | str = UpstreamMode.AUTO
    on_data_change: OnDataChange | str = OnDataChange.FAIL
    start_from: str | int | datetime = "beginning"
    schema_changes: SchemaChanges | str = SchemaChanges.ADDITIVE
    cursor: str | None = None
    cursor_fallback: str | None = None
    tie_break: tuple[str, ...] = ()
    lag_seconds: float = 0.0
    format: str = "delta"
    read_options: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        validate_name("upstream name", self.name)
        owner = f"Upstream '{self.name}'"
        if not isinstance(self.path, str) or not self.path.strip():
            raise ConfigurationError(
                f"{owner} has no path.",
                upstream=self.name,
                fix="give the Delta table's location as path=...",
            )
        if self.max_versions_per_batch is not None and (
            not isinstance(self.max_versions_per_batch, int) or self.max_versions_per_batch < 1
        ):
            raise ConfigurationError(
                f"{owner}: max_versions_per_batch must be a positive integer, "
                f"got {self.max_versions_per_batch!r}.",
                upstream=self.name,
                fix="set it to 1 or more, or leave it unset for no cap.",
            )
        set_ = object.__setattr__
        set_(self, "mode", _enum(UpstreamMode, self.mode, "mode", owner))
        set_(
            self,
            "on_data_change",
            _enum(OnDataChange, self.on_data_change, "on_data_change", owner),
        )
        set_(
            self,
            "schema_changes",
            _enum(SchemaChanges, self.schema_changes, "schema_changes", owner),
        )
        set_(self, "start_from", _parse_start(self.start_from, owner))
        set_(self, "tie_break", tuple(self.tie_break))
        if self.mode is UpstreamMode.TIMESTAMP:
            if not self.cursor:
                raise ConfigurationError(
                    f"{owner} is read by timestamp but names no cursor column.",
                    upstream=self.name,
                    fix="give cursor='updated_at' (a timestamp or increasing id column).",
                )
            if isinstance(self.start_from, int) and self.start_from != 0:
                raise ConfigurationError(
                    f"{owner} has no versions (mode='timestamp'); start_from="
                    f"{self.start_from!r} cannot apply.",
                    upstream=self.name,
                    fix="use 'beginning', 'latest' or a timestamp.",
                )
        elif self.cursor or self.cursor_fallback or self.tie_break:
            raise ConfigurationError(
                f"{owner}: cursor, cursor_fallback and tie_break only apply to mode='timestamp'.",
                upstream=self.name,
                fix="set mode='timestamp' or drop the cursor settings.",
            )
        for column in (self.cursor, self.cursor_fallback, *self.tie_break):
            if column is not None:
                validate_name("cursor column", column)
        if not isinstance(self.lag_seconds, int | float) or self.lag_seconds < 0:
            raise ConfigurationError(
                f"{owner}: lag_seconds must be a number >= 0, got {self.lag_seconds!r}.",
                upstream=self.name,
            )
        validate_name("format", self.format)

    @property
    def is_cursor(self) -> bool:
        """True when the upstream has no versions and is read through a cursor column."""
        return self.mode is UpstreamMode.TIMESTAMP


class WriteMode(StrEnum):
    """How a pipeline writes its target.

    * ``merge``: upsert and delete by key; only newer changes are taken.
    * ``append``: append rows; a retried batch is not appended twice (Delta transaction ids).
    * ``overwrite``: replace the target with the transform's output of a full reload.
    """

    MERGE = "merge"
    APPEND = "append"
    OVERWRITE = "overwrite"


Transform = Callable[["BatchContext"], "DataFrame"]


@dataclass(frozen=True)
class Pipeline:
    """A transform from one or more upstreams into one target table, run once per batch.

    The transform returns the changes to apply to the target: target columns plus an
    optional ``_change_type`` (``"delete"`` deletes the key; anything else upserts) and an
    optional ``_commit_version`` that orders several changes of one key (the latest wins).

    Args:
        name: registry name; also the Dagster asset key.
        upstreams: names of the upstreams the transform reads.
        target: location of the target Delta table.
        keys: key columns the target is merged on (required for ``write="merge"``).
        transform: the function, ``transform(batch) -> DataFrame``.
        description: shown in the Dagster UI (defaults to the function's docstring).
        write: ``merge`` (default), ``append`` or ``overwrite`` (:class:`WriteMode`).
        partition_by: partition columns the target is created with.
        cluster_by: liquid clustering columns the target is created with.
        storage_options: storage options for the target on an object store.
    """

    name: str
    upstreams: tuple[str, ...]
    target: str
    keys: tuple[str, ...]
    transform: Transform = field(compare=False)
    description: str | None = None
    write: WriteMode | str = WriteMode.MERGE
    partition_by: tuple[str, ...] = ()
    cluster_by: tuple[str, ...] = ()
    storage_options: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        validate_name("pipeline name", self.name)
        if not self.upstreams:
            raise ConfigurationError(
                f"Pipeline '{self.name}' reads no upstream.",
                pipeline=self.name,
                fix="name at least one upstream in upstreams=[...].",
            )
        for u in self.upstreams:
            validate_name("upstream name", u)
        if len(set(self.upstreams)) != len(self.upstreams):
            raise ConfigurationError(
                f"Pipeline '{self.name}' lists an upstream twice: {list(self.upstreams)}.",
                pipeline=self.name,
            )
        owner = f"Pipeline '{self.name}'"
        object.__setattr__(self, "write", _enum(WriteMode, self.write, "write", owner))
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        object.__setattr__(self, "cluster_by", tuple(self.cluster_by))
        if not self.keys and self.write is WriteMode.MERGE:
            raise ConfigurationError(
                f"Pipeline '{self.name}' merges into its target but has no key columns.",
                pipeline=self.name,
                fix="give the target's key columns as keys=[...], or write='append'.",
            )
        if self.partition_by and self.cluster_by:
            raise ConfigurationError(
                f"{owner}: a Delta table is either partitioned or clustered, not both.",
                pipeline=self.name,
                fix="keep partition_by or cluster_by.",
            )
        for k in (*self.partition_by, *self.cluster_by):
            validate_name("target column", k)
        for k in self.keys:
            validate_name("key column", k)
            if k.startswith(RESERVED_PREFIX):
                raise ConfigurationError(
                    f"Pipeline '{self.name}': key column {k!r} uses the reserved prefix "
                    f"{RESERVED_PREFIX!r}.",
                    pipeline=self.name,
                )
        if not isinstance(self.target, str) or not self.target.strip():
            raise ConfigurationError(
                f"Pipeline '{self.name}' has no target.",
                pipeline=self.name,
                fix="give the target Delta table's location as target=...",
            )
        if not callable(self.transform):
            raise ConfigurationError(
                f"Pipeline '{self.name}': transform is not callable.", pipeline=self.name
            )


def pipeline(
    *,
    upstreams: Sequence[str],
    target: str,
    keys: Sequence[str] = (),
    name: str | None = None,
    description: str | None = None,
    write: WriteMode | str = WriteMode.MERGE,
    partition_by: Sequence[str] = (),
    cluster_by: Sequence[str] = (),
    storage_options: Mapping[str, str] | None = None,
) -> Callable[[Transform], Pipeline]:
    """Declare a pipeline with a decorated transform function.

    Example:
        >>> @pipeline(upstreams=["orders", "customers"], target="/lake/enriched",
        ...           keys=["order_id"])
        ... def orders_enriched(batch):
        ...     ...
    """

    def wrap(fn: Transform) -> Pipeline:
        return Pipeline(
            name=name or fn.__name__,
            upstreams=tuple(upstreams),
            target=target,
            keys=tuple(keys),
            transform=fn,
            description=description or (fn.__doc__ or "").strip() or None,
            write=write,
            partition_by=tuple(partition_by),
            cluster_by=tuple(cluster_by),
            storage_options=storage_options,
        )

    return wrap


def _location(path: str) -> str:
    """A table location in one spelling, so ``/a/b/``, ``/a//b`` and ``file:///a/b`` compare
    equal."""
    text = path.strip()
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "://" in text:
        return text.rstrip("/")
    return os.path.abspath(os.path.expanduser(text))


class Registry:
    """The upstreams and pipelines of one code location, checked for consistency."""

    def __init__(self, *, upstreams: Iterable[Upstream], pipelines: Iterable[Pipeline]) -> None:
        self.upstreams: dict[str, Upstream] = {}
        for u in upstreams:
            if u.name in self.upstreams:
                raise ConfigurationError(
                    f"Upstream '{u.name}' is declared twice.",
                    upstream=u.name,
                    fix="give each upstream one entry.",
                )
            self.upstreams[u.name] = u
        self.pipelines: dict[str, Pipeline] = {}
        for p in pipelines:
            if p.name in self.pipelines or p.name in self.upstreams:
                raise ConfigurationError(
                    f"Name '{p.name}' is used twice (pipelines and upstreams share one "
                    "namespace: they are all Dagster assets).",
                    pipeline=p.name,
                    fix="rename one of them.",
                )
            unknown = [u for u in p.upstreams if u not in self.upstreams]
            if unknown:
                raise ConfigurationError(
                    f"Pipeline '{p.name}' reads unknown upstream(s) {unknown}; declared "
                    f"upstreams are {sorted(self.upstreams)}.",
                    pipeline=p.name,
                    fix="declare the upstream or fix the name.",
                )
            self.pipelines[p.name] = p
        targets: dict[str, str] = {}
        for p in self.pipelines.values():
            if p.target in targets:
                raise ConfigurationError(
                    f"Pipelines '{targets[p.target]}' and '{p.name}' write the same target "
                    f"{p.target!r}.",
                    pipeline=p.name,
                    fix="give each pipeline its own target table.",
                )
            targets[p.target] = p.name
        self._refuse_cycles()

    def _refuse_cycles(self) -> None:
        """Refuse pipelines that read their own output: a target that is the path of an
        upstream feeding, directly or through other pipelines, the pipeline writing it.
        Every batch would then read what the previous one wrote, without end."""
        upstreams_at: dict[str, list[str]] = {}
        for u in self.upstreams.values():
            upstreams_at.setdefault(_location(u.path), []).append(u.name)
        # pipeline -> [(upstream its target is, a pipeline reading that upstream)]
        feeds = {
            p.name: [
                (u, q.name)
                for u in upstreams_at.get(_location(p.target), ())
                for q in self.pipelines.values()
                if u in q.upstreams
            ]
            for p in self.pipelines.values()
        }
        state: dict[str, bool] = {}  # False: on the current path; True: explored

        def visit(name: str, trail: list[tuple[str, str, str]]) -> None:
            state[name] = False
            for upstream, reader in feeds[name]:
                step = [*trail, (name, upstream, reader)]
                if state.get(reader) is False:
                    cycle = step[next(i for i, s in enumerate(step) if s[0] == reader) :]
                    chain = "; ".join(
                        f"'{p}' writes {self.pipelines[p].target!r} = upstream '{u}', read by '{r}'"
                        for p, u, r in cycle
                    )
                    raise ConfigurationError(
                        f"Pipeline '{reader}' reads its own output through a cycle: {chain}.",
                        pipeline=reader,
                        upstream=cycle[-1][1],
                        fix="give the target a path that no upstream of the cycle has, or "
                        "remove that upstream from the pipeline's upstreams.",
                    )
                if reader not in state:
                    visit(reader, step)
            state[name] = True

        for name in self.pipelines:
            if name not in state:
                visit(name, [])

    def pipeline_inputs(self) -> dict[str, tuple[str, ...]]:
        """pipeline -> the upstreams it reads."""
        return {name: p.upstreams for name, p in self.pipelines.items()}

    def consumers(self, upstream: str) -> tuple[str, ...]:
        """The pipelines that read ``upstream``, sorted: the one definition of its consumers
        (the finalizer advances an upstream once they all applied a batch; a manual change
        and a replay name them)."""
        return tuple(sorted(n for n, p in self.pipelines.items() if upstream in p.upstreams))

    def consumed_upstreams(self) -> list[Upstream]:
        """Upstreams read by at least one pipeline."""
        used = {u for p in self.pipelines.values() for u in p.upstreams}
        return [u for name, u in self.upstreams.items() if name in used]

    def describe(self) -> dict[str, Any]:
        """A plain summary, for logs and ``--json``."""
        return {
            "upstreams": {n: u.path for n, u in self.upstreams.items()},
            "pipelines": {n: list(p.upstreams) for n, p in self.pipelines.items()},
        }
