"""What one write committed to a target, read from exactly the commits it made.

A write labels its commits (Delta's ``commitInfo.userMetadata``) with a token of its own,
then reads the operation metrics of the commits after the version it started from that
carry the token. A write that commits nothing (an empty output, a MERGE that changed no
row, an append Delta skipped as already applied) therefore reports zeros, never the
figures of an older commit. The label also shows in the target's history which pipeline
and batch wrote each commit.

A commit that only prepares the write (creating the empty target, adding new columns before
a MERGE) is labelled apart (:func:`preparing`): the evidence that a batch's rows reached a
target (:func:`labelled_commit`, read by crash recovery and by a forced change) is only ever
the commit that carries them.
"""

import logging
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import SparkSession

from watermark_dagster.frames.delta import USER_METADATA_CONF, existing_target, session_setting
from watermark_dagster.observe.log import commit_history

if TYPE_CHECKING:
    from watermark_dagster.config.pipeline import Pipeline

log = logging.getLogger("watermark_dagster")

# Put before the label of a commit that prepares a write and carries none of its rows.
PREPARING = "watermark-preparing "
# The label of a forced change's fence: an empty commit that records a batch's Delta
# transaction in a target so that no late write of that batch can land (never evidence).
FENCE = "watermark-fence "
UNBOUND_ROOT = "unbound"
"""The control root id of writes made without a control root (direct calls of the write
functions: tests, benchmarks)."""


@dataclass(frozen=True)
class Fence:
    """What a forced change's fence of a target found or did
    (:func:`~watermark_dagster.write.fences.fence_target`, or a warehouse's
    :func:`~watermark_dagster.write.warehouse_fences.fence_warehouse`): ``fenced`` (the
    version or position holding the fence; ``new`` when this call made it), ``applied``
    (the batch's write landed first: its evidence), or neither (no target yet)."""

    fenced: int | None = None
    applied: str | None = None
    new: bool = False


@dataclass(frozen=True)
class WriteResult:
    """What one write did to the target, from the operation metrics of its own commits.

    Attributes:
        target_version: the target's version after the write (unchanged if nothing was
            committed).
        rows_inserted, rows_updated, rows_deleted: target rows the write changed.
        created: the write created the target.
        already_applied: Delta's transaction id shows this batch was written before (an
            append or overwrite retried after a crash); nothing was written again.
        committed: the write made at least one commit. False for an empty output, a
            MERGE whose changes were all older than the target's rows, and
            ``already_applied``.
        rows_copied: unchanged rows a MERGE or overwrite rewrote because they shared a
            file with a changed row (``numTargetRowsCopied``; 0 with deletion vectors).
        files_added, files_removed: data files the commits added and removed.
        files_touched: existing files the write changed: removed, or given a deletion
            vector.
        conflicts: commits of concurrent writers to the target this write lost to and was
            decided again after (Delta's concurrent-modification conflicts).
        drift: target keys a full batch changed that its own changes did not touch (the
            target had drifted from the full transform); None when not measured.
        drift_sample: up to two of those keys.
    """

    target_version: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    created: bool
    already_applied: bool = False
    committed: bool = False
    rows_copied: int = 0
    files_added: int = 0
    files_removed: int = 0
    files_touched: int = 0
    conflicts: int = 0
    drift: int | None = None
    drift_sample: tuple[dict[str, Any], ...] = ()

    @property
    def rows_written(self) -> int:
        """Rows inserted, updated or deleted."""
        return self.rows_inserted + self.rows_updated + self.rows_deleted

    @classmethod
    def nothing(cls, version: int, *, already_applied: bool = False) -> "WriteResult":
        """A write that committed nothing (the target stays at ``version``)."""
        return cls(version, 0, 0, 0, created=False, already_applied=already_applied)

    @classmethod
    def from_commits(
        cls, version: int, commits: Sequence[Mapping[str, Any]], *, created: bool
    ) -> "WriteResult":
        """Sum the operation metrics of a write's commits (a creation, then a WRITE or a
        MERGE)."""
        total: dict[str, int] = {}
        for commit in commits:
            metrics: Mapping[str, Any] = commit.get("operationMetrics") or {}
            for key, value in metrics.items():
                try:
                    total[key] = total.get(key, 0) + int(value)
                except (TypeError, ValueError):
                    continue
        merged = any(c.get("operation") == "MERGE" for c in commits)

        def m(name: str) -> int:
            return total.get(name, 0)

        if merged:
            return cls(
                target_version=version,
                rows_inserted=m("numTargetRowsInserted"),
                rows_updated=m("numTargetRowsUpdated"),
                rows_deleted=m("numTargetRowsDeleted"),
                created=created,
                committed=bool(commits),
                rows_copied=m("numTargetRowsCopied"),
                files_added=m("numTargetFilesAdded"),
                files_removed=m("numTargetFilesRemoved"),
                files_touched=m("numTargetFilesRemoved")
                + m("numTargetDeletionVectorsAdded")
                + m("numTargetDeletionVectorsUpdated"),
            )
        return cls(
            target_version=version,
            rows_inserted=m("numOutputRows"),
            rows_updated=0,
            rows_deleted=0,
            created=created,
            committed=bool(commits),
            rows_copied=m("numCopiedRows"),
            files_added=m("numFiles"),
            files_removed=m("numRemovedFiles"),
            files_touched=m("numRemovedFiles"),
        )


RECENT_COMMITS = 100
"""How many of a target's newest commits a search for a labelled commit reads: a commit
older than that is found by the pipeline's Delta transaction instead (see
:func:`~watermark_dagster.write.fences.evidence_in`)."""


def target_exists(pipeline: "Pipeline") -> bool:
    """Whether ``pipeline``'s target exists: its Delta table, or its warehouse table."""
    if pipeline.warehouse is not None:
        from watermark_dagster.observe.warehouse_state import table_exists

        return table_exists(pipeline.warehouse, pipeline.name)
    from watermark_dagster.config.secrets import resolved_options

    return existing_target(pipeline.target, resolved_options(pipeline.storage_options)) is not None


def labelled_commit(table: RsDeltaTable, prefix: str, *, newest: int | None = None) -> int | None:
    """The version of the newest of the target's last ``newest`` commits (default
    :data:`RECENT_COMMITS`) whose label starts with ``prefix`` (see :func:`new_label`), or
    None."""
    for commit in commit_history(table, newest or RECENT_COMMITS):
        if str(commit.get("userMetadata") or "").startswith(prefix):
            return int(commit.get("version", -1))
    return None


def newest_written_seq(table: RsDeltaTable, *, newest: int = 20) -> int | None:
    """The position (``seq``) recorded by the newest of the target's last ``newest`` commits
    that one of our writes labelled (see :func:`new_label`), or None."""
    for commit in commit_history(table, newest):
        found = _LABEL_SEQ.match(str(commit.get("userMetadata") or ""))
        if found:
            return int(found.group(1))
    return None


def fence_label(pipeline: str, batch_id: str, write_seq: int, root: str) -> str:
    """The label of the fence a forced change of control root ``root`` commits for
    ``pipeline``'s write of ``batch_id`` (see
    :func:`~watermark_dagster.write.fences.fence_target`)."""
    return f"{FENCE}{root_prefix(pipeline, batch_id, root)}seq={write_seq}"


def fenced(
    table: RsDeltaTable, pipeline: str, batch_id: str, root: str, *, newest: int | None = None
) -> int | None:
    """The version of the fence a forced change of control root ``root`` committed against
    ``pipeline``'s write of ``batch_id`` among the target's last ``newest`` commits (default
    :data:`RECENT_COMMITS`), or None. A fence an older release committed (its label names
    no root) counts too: the batch it fenced is abandoned either way."""
    mine = FENCE + root_prefix(pipeline, batch_id, root)
    legacy = FENCE + label_prefix(pipeline, batch_id) + "seq="
    for commit in commit_history(table, newest or RECENT_COMMITS):
        label = str(commit.get("userMetadata") or "")
        if label.startswith(mine) or label.startswith(legacy):
            return int(commit.get("version", -1))
    return None


def label_prefix(pipeline: str, batch_id: str) -> str:
    """The start of every label of ``pipeline``'s writes for ``batch_id``, whichever control
    root wrote them (see :func:`root_prefix`)."""
    return f"watermark pipeline={pipeline} batch={batch_id} "


def root_prefix(pipeline: str, batch_id: str, root: str) -> str:
    """The start of every label of ``pipeline``'s writes for ``batch_id`` scheduled by the
    control root whose id is ``root``: batch ids restart in a new root, so only this says
    which root's batch a commit carries. Labels written by older releases name no root
    (``watermark pipeline=P batch=B seq=N ...``)."""
    return f"{label_prefix(pipeline, batch_id)}root={root} "


_LABEL = re.compile(
    r"(?:watermark-\S+ )?watermark pipeline=(\S+) batch=(\S+) (?:root=(\S+) )?seq=(\d+)"
)
_LABEL_SEQ = re.compile(r"watermark pipeline=\S+ batch=\S+ (?:root=\S+ )?seq=(\d+) ")


@dataclass(frozen=True)
class LabelledWrite:
    """What a commit's label says of the write that made it: the target's ``version``, the
    ``pipeline``, the ``batch_id``, the control ``root`` (None: an older release's label,
    which names none) and the position ``seq``; ``kind`` is ``write``, ``preparing`` or
    ``fence``."""

    version: int
    pipeline: str
    batch_id: str
    root: str | None
    seq: int
    kind: str


def parse_label(commit: Mapping[str, Any]) -> LabelledWrite | None:
    """The write a commit's label describes (see :func:`new_label`), or None."""
    label = str(commit.get("userMetadata") or "")
    found = _LABEL.match(label)
    if not found:
        return None
    kind = "fence" if label.startswith(FENCE) else "write"
    if label.startswith(PREPARING):
        kind = "preparing"
    return LabelledWrite(
        version=int(commit.get("version", -1)),
        pipeline=found.group(1),
        batch_id=found.group(2),
        root=found.group(3),
        seq=int(found.group(4)),
        kind=kind,
    )


def newest_labelled_write(
    table: RsDeltaTable, pipeline: str | None, *, newest: int | None = None
) -> LabelledWrite | None:
    """The newest of the target's last ``newest`` commits (default :data:`RECENT_COMMITS`)
    that a write, preparation or fence of ``pipeline`` (None: of any pipeline) labelled,
    whichever root made it."""
    for commit in commit_history(table, newest or RECENT_COMMITS):
        write = parse_label(commit)
        if write is not None and pipeline in (None, write.pipeline):
            return write
    return None


def new_label(pipeline: str, batch_id: str, write_seq: int, root: str) -> str:
    """A label unique to one write: pipeline, batch, control root, position and a nonce."""
    return f"{root_prefix(pipeline, batch_id, root)}seq={write_seq} {uuid.uuid4().hex[:12]}"


TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"


@contextmanager
def idempotent_dml(spark: SparkSession, transaction: tuple[str, int] | None) -> Iterator[None]:
    """The Delta command run in this block (a MERGE: it takes no per-call option) records
    ``transaction`` (application id, version) in its commit, and is skipped by Delta when
    the table records that application at that version or later. Only the data commit
    runs inside: a preparatory commit that recorded it would make Delta skip the data."""
    if transaction is None:
        yield
        return
    app_id, version = transaction
    with (
        session_setting(spark, TXN_APP_ID_CONF, app_id),
        session_setting(spark, TXN_VERSION_CONF, str(version)),
    ):
        yield


def labelled_commits(spark: SparkSession, label: str) -> AbstractContextManager[None]:
    """Every Delta commit made in this block records ``label`` as its user metadata (a
    session setting, because MERGE and the table builder take no per-call option)."""
    return session_setting(spark, USER_METADATA_CONF, label)


def preparing(spark: SparkSession) -> AbstractContextManager[None]:
    """Inside a :func:`labelled_commits` block: the commits made in this one prepare the
    write (create the target, evolve its schema) and carry none of the batch's rows, so
    they are labelled ``watermark-preparing <label>``, which no evidence of a write takes
    for the write itself."""
    label = spark.conf.get(USER_METADATA_CONF, None) or ""
    return session_setting(spark, USER_METADATA_CONF, PREPARING + label)


def commits_since(
    target: str,
    storage_options: Mapping[str, str] | None,
    before: int | None,
    label: str,
    *,
    table: RsDeltaTable | None = None,
) -> tuple[int, list[dict]]:
    """The target's version now, and the commits after ``before`` that carry ``label``
    (oldest first). ``table``, the target's log opened before the write, is brought up
    to date from where it was instead of being read again."""
    if table is not None:
        dt = table
    else:
        options = dict(storage_options) if storage_options else None
        dt = RsDeltaTable(target, storage_options=options)
    # Every commit after ``before`` (the table's whole history when it did not exist).
    made = commit_history(dt, after=-1 if before is None else before)
    version = dt.version()
    # The write's commits: those that prepared it (creating the target, say) and the one
    # carrying its rows.
    ours = [c for c in made if c.get("userMetadata") in (label, PREPARING + label)]
    if len(ours) < len(made):
        others = len(made) - len(ours)
        log.info("target=%s: %d commit(s) by other writers during this write", target, others)
    return version, sorted(ours, key=lambda c: int(c.get("version", 0)))
