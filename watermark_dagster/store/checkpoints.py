"""Pipeline checkpoints: one row per attempt of a pipeline on a batch, opened RUNNING
and closed with its outcome, and the newest batch each pipeline succeeded on.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from deltalake import DeltaTable

from watermark_dagster.core.records import (
    Batch,
    BatchKind,
    Checkpoint,
    CheckpointStatus,
    TargetMark,
    first_mark,
    running_checkpoint,
    seq_of,
)
from watermark_dagster.errors import BatchStateError
from watermark_dagster.store import codec
from watermark_dagster.store.schema import bucket_of
from watermark_dagster.store.tables import BATCHES, CHECKPOINTS, ControlTables, where

# The history event of an attempt's outcome, committed with the checkpoint row that closes it.
RUN_EVENTS = {
    CheckpointStatus.SUCCESS: "PIPELINE_SUCCEEDED",
    CheckpointStatus.FAILED: "PIPELINE_FAILED",
}


class Checkpoints(ControlTables):
    """Writes and reads of ``pipeline_checkpoints``, one part of
    :class:`~watermark_dagster.store.store.WatermarkStore`."""

    def begin_checkpoint(
        self,
        pipeline: str,
        batch_id: str,
        *,
        run_id: str | None,
        mark: TargetMark | None = None,
    ) -> int:
        """Record a RUNNING attempt of ``pipeline`` on ``batch_id``, with what its target
        held before it (``mark``: see :class:`~watermark_dagster.core.records.TargetMark`);
        returns the attempt number."""

        def decide(dt: DeltaTable) -> int:
            rows = self._rows(
                dt, where(pipeline=pipeline, batch_id=batch_id), buckets=[bucket_of(batch_id)]
            )
            attempt = 1 + max((r["attempt"] for r in rows), default=0)
            running = running_checkpoint(
                pipeline, batch_id, attempt, run_id=run_id, at=codec.now(), mark=mark
            )
            self._insert(dt, CHECKPOINTS, [codec.checkpoint_row(running)])
            return attempt

        return self._cas(CHECKPOINTS, decide)

    def first_mark(self, pipeline: str, batch_id: str) -> TargetMark | None:
        """What ``pipeline``'s target held when its first attempt on ``batch_id`` began
        (None: never attempted, or recorded by an older release)."""
        return first_mark(self.checkpoints(batch_id=batch_id, pipeline=pipeline))

    def finish_checkpoint(
        self,
        pipeline: str,
        batch_id: str,
        attempt: int,
        status: CheckpointStatus,
        *,
        rows_read: int | None = None,
        rows_written: int | None = None,
        error: str | None = None,
        actor: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """Close one attempt with its outcome, counts and error, in one commit.

        With ``detail``, the attempt's history row (``PIPELINE_SUCCEEDED`` or
        ``PIPELINE_FAILED``, by ``actor``) is committed with it, in the row's
        ``pending_history``: :meth:`~watermark_dagster.store.history.History.history` reads
        it from there, and the batch's advance copies it into ``history``
        (:meth:`~watermark_dagster.store.history.History.run_rows`). A run therefore closes
        with one control-table commit, and no kill can leave it without its history row.
        """
        pending = (
            None
            if detail is None
            else codec.pending_history(
                RUN_EVENTS[status], actor, batch_id=batch_id, pipeline=pipeline, detail=detail
            )
        )

        def decide(dt: DeltaTable) -> None:
            rows = self._rows(
                dt,
                where(pipeline=pipeline, batch_id=batch_id, attempt=attempt),
                buckets=[bucket_of(batch_id)],
            )
            if not rows:
                raise BatchStateError(
                    f"No checkpoint for pipeline '{pipeline}', batch {batch_id}, "
                    f"attempt {attempt}.",
                    pipeline=pipeline,
                    batch_id=batch_id,
                )
            finished = dataclasses.replace(
                codec.checkpoint(rows[0]),
                status=status,
                rows_read=rows_read,
                rows_written=rows_written,
                finished_at=codec.now(),
                error=error,
            )
            key = ("pipeline", "batch_id", "attempt")
            row = {**codec.checkpoint_row(finished), "pending_history": pending}
            self._merge(dt, CHECKPOINTS, [row], on=key)

        self._cas(CHECKPOINTS, decide)

    def checkpoints(
        self, *, batch_id: str | None = None, pipeline: str | None = None
    ) -> list[Checkpoint]:
        """Checkpoint rows, optionally for one batch and/or one pipeline, oldest first (one
        batch's rows read its bucket only)."""
        buckets = None if batch_id is None else [bucket_of(batch_id)]
        key = where(batch_id=batch_id, pipeline=pipeline)
        rows = self._rows(self._load(CHECKPOINTS), key, buckets=buckets)
        found = map(codec.checkpoint, rows)
        return sorted(found, key=lambda c: (c.batch_id, c.pipeline, c.attempt))

    def newest_success(self, pipeline: str) -> str | None:
        """Id of the newest batch ``pipeline`` succeeded on (None before its first).
        Reads buckets from the newest until one holds a success."""
        succeeded = where(pipeline=pipeline, status=CheckpointStatus.SUCCESS.value)
        dt = self._load(CHECKPOINTS)
        rows = self._rows_newest_first(dt, succeeded, enough=bool)
        return max((r["batch_id"] for r in rows), key=seq_of, default=None)

    def newest_applied(self, pipeline: str) -> Batch | None:
        """The SCHEDULED batch with the highest sequence ``pipeline`` succeeded on: what its
        target is known to hold (replays write at older positions and do not count).
        Reads buckets from the newest until one holds such a batch."""
        succeeded = where(pipeline=pipeline, status=CheckpointStatus.SUCCESS.value)
        checkpoints, batches = self._load(CHECKPOINTS), self._load(BATCHES)
        for bucket in self._buckets(checkpoints):
            found_rows = self._rows(checkpoints, succeeded, buckets=[bucket])
            ids = sorted({r["batch_id"] for r in found_rows})
            if not ids:
                continue
            scheduled = {"batch_id": ids, "kind": BatchKind.SCHEDULED.value}
            found = codec.batches(self._rows(batches, scheduled, buckets=[bucket]))
            if found:
                return found[-1]
        return None


__all__ = ["RUN_EVENTS", "Checkpoints"]
