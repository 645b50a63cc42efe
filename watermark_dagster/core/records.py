"""The control plane's records: batches, committed watermarks, pipeline checkpoints and
their statuses, as the store reads and writes them. Plain data, no I/O."""

import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import CursorPosition, encode_position


class BatchKind(StrEnum):
    """Why a batch exists."""

    SCHEDULED = "SCHEDULED"
    REPLAY = "REPLAY"
    MANUAL = "MANUAL"


class BatchStatus(StrEnum):
    """Lifecycle of a batch: PLANNED until finalized, then COMPLETED (or ABANDONED by hand)."""

    PLANNED = "PLANNED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"


class CheckpointStatus(StrEnum):
    """Outcome of one pipeline attempt on one batch."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"


class WatermarkHow(StrEnum):
    """How a committed watermark got its value."""

    AUTO = "AUTO"
    MANUAL_SET = "MANUAL_SET"
    RESET = "RESET"
    START_FROM = "START_FROM"


@dataclass(frozen=True)
class Batch:
    """A planned batch as recorded in the ``batches`` table."""

    batch_id: str
    seq: int
    kind: BatchKind
    plan_id: str
    status: BatchStatus
    pipelines: tuple[str, ...]
    inputs: Mapping[str, PlannedInput]
    advanced: frozenset[str]
    created_at: datetime
    actor: str | None
    full_load: tuple[str, ...] = ()
    reloads_owed: tuple[str, ...] = ()
    """Pipelines owed a reload (after a forced change abandoned an earlier batch) that this
    batch did not plan: their upstreams were blocked or unavailable. The next plans carry
    them until one reloads them (:func:`~watermark_dagster.core.reloads.reloads_due`)."""
    order_seq: int | None = None
    table_ids: Mapping[str, str | None] = field(default_factory=dict[str, str | None])
    schema_fingerprints: Mapping[str, str | None] = field(default_factory=dict[str, str | None])
    source_states: Mapping[str, str | None] = field(default_factory=dict[str, str | None])
    window_pending: Mapping[str, int | None] = field(default_factory=dict[str, int | None])
    locations: Mapping[str, str | None] = field(default_factory=dict[str, str | None])
    """Upstream -> where it was observed when the batch was planned (None: recorded before
    locations were); the run of an upstream named by catalog table refuses a name that now
    points elsewhere."""

    @property
    def ranged_upstreams(self) -> tuple[str, ...]:
        """Upstreams the batch reads something new from (not NOOP), sorted."""
        return tuple(sorted(u for u, i in self.inputs.items() if i.reads))

    @property
    def write_seq(self) -> int:
        """The position a pipeline's writes for this batch carry in its target.

        A scheduled batch writes its own sequence number; a replay writes the number of
        the scheduled batch it re-reads, so it can never overwrite what newer batches wrote.
        """
        return self.seq if self.order_seq is None else self.order_seq


@dataclass(frozen=True)
class Watermark:
    """One row of ``committed_watermarks``.

    A versioned upstream has ``committed_version``; a cursor upstream has
    ``committed_cursor`` (its cursor value and tie-break keys) and ``source_state`` (what
    its source looked like when that position was committed).
    """

    upstream: str
    committed_version: int | None
    batch_id: str | None
    how: WatermarkHow
    updated_at: datetime
    actor: str | None
    committed_cursor: CursorPosition | None = None
    table_id: str | None = None
    source_state: str | None = None
    pending_history: str | None = None

    @property
    def value_text(self) -> str | None:
        """The committed value as ``history`` records it: the encoded cursor position of a
        cursor upstream, else the version (None: nothing committed)."""
        if self.committed_cursor is not None:
            return encode_position(self.committed_cursor)
        return version_text(self.committed_version)


def start_point(
    upstream: str,
    version: int | None,
    cursor: CursorPosition | None,
    *,
    actor: str,
    at: datetime,
    table_id: str | None,
) -> Watermark:
    """The committed row of an upstream configured with ``start_from``: it begins at
    ``version`` (a versioned upstream) or ``cursor`` (a cursor upstream)."""
    return Watermark(
        upstream,
        version,
        None,
        WatermarkHow.START_FROM,
        at,
        actor,
        committed_cursor=cursor,
        table_id=table_id,
    )


@dataclass(frozen=True)
class WatermarkChange:
    """A manual move of one upstream's committed watermark (``watermark set`` / ``reset``).

    ``old`` and ``new`` are committed versions; None means nothing is committed, so the next
    batch loads the upstream as a snapshot. ``open_batch`` is the open batch that read the
    upstream when the change was decided; ``abandoned`` lists the batches the change
    abandoned. ``applied`` is False for a preview.
    """

    upstream: str
    old: int | None
    new: int | None
    how: WatermarkHow
    old_cursor: str | None = None
    open_batch: str | None = None
    abandoned: tuple[str, ...] = ()
    applied: bool = False

    @property
    def changed(self) -> bool:
        """True when the change moves the watermark (False: it is already there)."""
        return self.old != self.new or self.old_cursor is not None

    @property
    def old_text(self) -> str | None:
        """The value before, as ``history`` records it (a cursor upstream's position)."""
        return self.old_cursor if self.old is None and self.old_cursor else version_text(self.old)


@dataclass(frozen=True)
class Checkpoint:
    """One row of ``pipeline_checkpoints``: one attempt of one pipeline on one batch."""

    pipeline: str
    batch_id: str
    attempt: int
    status: CheckpointStatus
    rows_read: int | None
    rows_written: int | None
    run_id: str | None
    started_at: datetime
    finished_at: datetime | None
    error: str | None
    target_version: int | None = None
    target_position: int | None = None

    @property
    def mark(self) -> "TargetMark | None":
        """What the target held when this attempt began (None: an older release's row)."""
        if self.target_version is None:
            return None
        return TargetMark(self.target_version, self.target_position)


@dataclass(frozen=True)
class TargetMark:
    """What a pipeline's target held when an attempt of a batch began, before it could
    write: the target's Delta version (-1: no target yet) and the position of this control
    root's Delta transaction of the pipeline (None: none).

    Recorded with each attempt. A write of the batch is a commit after its first attempt's
    mark; a position the transaction already held at that mark was written by an earlier
    life of the root (restored from an older copy), never by this batch.
    """

    version: int
    position: int | None

    def holds(self, write_seq: int) -> bool:
        """Whether the transaction was at or past ``write_seq`` already at the mark."""
        return self.position is not None and self.position >= write_seq

    def before(self, version: int) -> bool:
        """Whether a commit at ``version`` of the target came before the mark."""
        return version <= self.version


def first_mark(attempts: Iterable[Checkpoint]) -> TargetMark | None:
    """The mark of the earliest attempt among ``attempts`` (one pipeline on one batch),
    or None when it has none (no attempt, or recorded by an older release)."""
    ordered = sorted(attempts, key=lambda c: c.attempt)
    return ordered[0].mark if ordered else None


def running_checkpoint(
    pipeline: str,
    batch_id: str,
    attempt: int,
    *,
    run_id: str | None,
    at: datetime,
    mark: TargetMark | None = None,
) -> Checkpoint:
    """A new RUNNING attempt of ``pipeline`` on ``batch_id``, started ``at`` with the
    target as ``mark`` found it."""
    return Checkpoint(
        pipeline,
        batch_id,
        attempt,
        CheckpointStatus.RUNNING,
        None,
        None,
        run_id,
        at,
        None,
        None,
        None if mark is None else mark.version,
        None if mark is None else mark.position,
    )


def version_text(version: int | None) -> str | None:
    """A committed version as ``history`` records it (None stays None)."""
    return None if version is None else str(version)


def batch_id_for(seq: int) -> str:
    """The batch id (and Dagster partition key) of sequence number ``seq``."""
    return f"b{seq:06d}"


def seq_of(batch_id: str) -> int:
    """The sequence number inside a batch id (inverse of :func:`batch_id_for`)."""
    return int(batch_id.lstrip("b"))


def default_actor() -> str:
    """``user@host`` of this process, recorded with manual changes.

    The user is the login name of the controlling terminal, else the operating system's
    account name of this process (cron, containers and services have no terminal and
    often no ``$USER``), else ``uid<N>`` for an id without an account entry.
    """
    try:
        user = os.getlogin()
    except OSError:
        try:
            import pwd

            user = pwd.getpwuid(os.getuid()).pw_name
        except (ImportError, KeyError):
            user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"
