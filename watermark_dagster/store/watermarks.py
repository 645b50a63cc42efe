"""Moves of committed watermarks: start points, the advance of a finalized batch's
ranges, and manual sets and resets (which abandon a batch that reads the upstream).
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from deltalake import DeltaTable

from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.finalizing import (
    AdvanceDecision,
    AdvanceStep,
    advanced_watermark,
    decide_advance_step,
    require_open,
)
from watermark_dagster.core.manual_changes import (
    batch_reading,
    check_unmoved,
    manual_change,
    manual_event,
    manual_watermark,
    manual_why,
    refuse_open_batch,
    stale_after_manual_change,
)
from watermark_dagster.core.ranges import CursorPosition
from watermark_dagster.core.records import (
    Batch,
    BatchStatus,
    Watermark,
    WatermarkChange,
    WatermarkHow,
    start_point,
    version_text,
)
from watermark_dagster.errors import BatchStateError
from watermark_dagster.store import codec
from watermark_dagster.store.batch_changes import BatchChanges
from watermark_dagster.store.schema import bucket_of
from watermark_dagster.store.tables import BATCHES, WATERMARKS, where


class WatermarkMoves(BatchChanges):
    """Changes to ``committed_watermarks``, one part of
    :class:`~watermark_dagster.store.store.WatermarkStore`."""

    def advance(self, batch: Batch, upstream: str, *, actor: str) -> AdvanceDecision:
        """Move ``upstream``'s committed watermark to the end of its range in ``batch``
        (see :meth:`advance_many`)."""
        return self.advance_many(batch, [upstream], actor=actor)[upstream]

    def advance_many(
        self, batch: Batch, upstreams: Sequence[str], *, actor: str
    ) -> dict[str, AdvanceDecision]:
        """Move each of ``upstreams``' committed watermarks to the end of its range in
        ``batch``: one commit to ``committed_watermarks`` for all of them, then their
        history rows in one commit, then the batch's rows marked advanced in one commit.

        Safe to repeat: finding a watermark already at the range's end (an earlier
        finalizer died after advancing) only records what is missing after it.

        Raises:
            WatermarkGapError, WatermarkRegressionError: a move would break I1 or I2
                (nothing is committed then).
            BatchStateError: the batch reads nothing from an upstream, or it ended.
        """
        if not upstreams:
            return {}
        if any(batch.inputs[u].window is not None for u in upstreams):
            # A window's end is pinned at the first read: take it from the table.
            batch = self.get_batch(batch.batch_id)
        planned = {u: batch.inputs[u] for u in upstreams}

        def decide(dt: DeltaTable) -> dict[str, AdvanceStep]:
            marks = {m.upstream: m for m in map(codec.watermark, self._rows(dt))}
            steps = {
                u: decide_advance_step(batch.batch_id, planned[u], marks.get(u)) for u in upstreams
            }
            moving = [u for u, step in steps.items() if step.decision is AdvanceDecision.ADVANCE]
            if moving:
                current = self.get_batch(batch.batch_id)
                for u in moving:
                    require_open(current, u)
                rows = [
                    codec.watermark_row(
                        advanced_watermark(
                            batch,
                            planned[u],
                            recheck_at=batch.window_pending.get(u),
                            actor=actor,
                            now=codec.now(),
                        )
                    )
                    for u in moving
                ]
                columns = [c for c in rows[0] if c not in ("upstream", "pending_history")]
                self._merge(dt, WATERMARKS, rows, on=("upstream",), columns=columns, insert=True)
            return steps

        steps = self._cas(WATERMARKS, decide)
        if any(step.decision is AdvanceDecision.ADVANCE for step in steps.values()):
            fault_point("after_watermark_commit")
        rows = []
        for u, step in steps.items():
            if not step.records_history:
                continue
            detail: dict[str, Any] = {"read": planned[u].describe()}
            if step.recorded_after_restart:
                # An earlier finalizer advanced and died before its history row.
                detail["recorded_after_restart"] = True
            rows.append(
                codec.history_row(
                    "WATERMARK_ADVANCED",
                    actor,
                    batch_id=batch.batch_id,
                    upstream=u,
                    old_value=step.old_value,
                    new_value=step.new_value,
                    detail=detail,
                )
            )
        if rows:
            # The batch's attempts' rows, held by their checkpoints, join the advance's commit.
            bucket = [bucket_of(batch.batch_id)]
            rows += self.run_rows(bucket, batch_id=batch.batch_id)
        self._record_all_once(rows)
        self._cas(BATCHES, lambda dt: self._mark_advanced(dt, batch.batch_id, upstreams))
        return {u: step.decision for u, step in steps.items()}

    def _mark_advanced(self, dt: DeltaTable, batch_id: str, upstreams: Sequence[str]) -> None:
        rows = self._rows(dt, where(batch_id=batch_id), buckets=[bucket_of(batch_id)])
        todo = [r["upstream"] for r in rows if r["upstream"] in upstreams and not r["advanced_at"]]
        if not todo:
            return
        at = codec.now()
        changes = [codec.batch_key(batch_id, u, advanced_at=at, updated_at=at) for u in todo]
        self._merge(dt, BATCHES, changes, on=("batch_id", "upstream"))

    def _put_watermark(self, dt: DeltaTable, mark: Watermark) -> None:
        """Insert or replace one upstream's watermark row. A ``pending_history`` already on
        the row is kept unless this change brings its own (see flush_pending_history)."""
        row = codec.watermark_row(mark)
        columns = [
            c
            for c in row
            if c != "upstream" and (c != "pending_history" or mark.pending_history is not None)
        ]
        self._merge(dt, WATERMARKS, [row], on=("upstream",), columns=columns, insert=True)

    def initialize_watermarks(
        self,
        points: Mapping[str, tuple[int | None, CursorPosition | None, str]],
        *,
        actor: str,
        table_ids: Mapping[str, str | None] | None = None,
    ) -> list[str]:
        """Record where upstreams configured with ``start_from`` begin, for those that
        have no committed watermark row yet (an existing row, even a reset one, wins).

        Returns:
            the upstreams initialized by this call.
        """
        table_ids = table_ids or {}

        def decide(dt: DeltaTable) -> list[str]:
            have = {r["upstream"] for r in self._rows(dt)}
            todo = sorted(u for u in points if u not in have)
            if not todo:
                return []
            now = codec.now()
            marks = []
            for u in todo:
                version, cursor, why = points[u]
                mark = start_point(
                    u, version, cursor, actor=actor, at=now, table_id=table_ids.get(u)
                )
                pending = codec.pending_history(
                    "WATERMARK_STARTED",
                    actor,
                    upstream=u,
                    new_value=mark.value_text,
                    detail={"why": why},
                )
                marks.append(dataclasses.replace(mark, pending_history=pending))
            self._insert(dt, WATERMARKS, [codec.watermark_row(m) for m in marks])
            return todo

        done = self._cas(WATERMARKS, decide)
        if done:
            self.flush_pending_history(done)
        return done

    def _batch_reading(self, upstream: str) -> Batch | None:
        """The open scheduled batch, if it reads ``upstream`` (a range, not NOOP)."""
        return batch_reading(self.open_batch(), upstream)

    def preview_watermark(
        self, upstream: str, version: int | None, *, how: WatermarkHow
    ) -> WatermarkChange:
        """What :meth:`set_watermark` would change now; writes nothing."""
        current = self.committed().get(upstream)
        reading = self._batch_reading(upstream)
        open_batch = reading.batch_id if reading else None
        return manual_change(upstream, version, how, current, open_batch=open_batch)

    def set_watermark(
        self,
        upstream: str,
        version: int | None,
        *,
        how: WatermarkHow,
        actor: str,
        reason: str | None = None,
        force: bool = False,
        expected: WatermarkChange | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> WatermarkChange:
        """Move ``upstream``'s committed watermark by hand, audited in ``history``.

        ``how`` is MANUAL_SET (to ``version``: the next batch starts at ``version + 1``) or
        RESET (``version`` None: nothing committed, the next batch loads a snapshot). This
        is the one way a watermark may decrease (I2). An open batch that reads the upstream
        is a conflict: refused, or with ``force`` abandoned first so the next plan starts
        from the new value. A batch a coordinator planned from the old value while this
        change committed is abandoned as well. Nothing is written when the watermark is
        already at ``version``.

        Args:
            upstream: the upstream whose watermark moves.
            version: the new committed version (MANUAL_SET), or None (RESET).
            how: MANUAL_SET or RESET.
            actor: who is recorded in history as making the change.
            reason: why, recorded in history.
            force: abandon an open batch that reads the upstream instead of refusing.
            expected: the preview the operator confirmed; refused if the committed value or
                the open batch moved since.
            detail: extra facts for the history row (e.g. how a timestamp was resolved).

        Raises:
            BatchStateError: an open batch reads the upstream and ``force`` is False.
            TerminalError: the state moved since ``expected`` was previewed.
        """
        self.flush_pending_history()  # a change whose process died before recording it
        preview = self.preview_watermark(upstream, version, how=how)
        check_unmoved(expected, preview)
        if not preview.changed:
            return preview
        reading = self.get_batch(preview.open_batch) if preview.open_batch else None
        refuse_open_batch(preview, reading, force=force)
        why = manual_why(preview, reason)
        abandoned = self._abandon(reading, actor=actor, error=f"abandoned by {why}")
        if reading is not None:
            fault_point("after_abandon")
        details = {"reason": reason, "how": how.value, "abandoned": abandoned, **(detail or {})}

        def decide(dt: DeltaTable) -> tuple[WatermarkChange, str]:
            current = codec.watermark_or_none(self._rows(dt, where(upstream=upstream)))
            moved = manual_change(upstream, version, how, current)
            # The history row is committed with the watermark and recorded just after.
            pending = codec.pending_history(
                manual_event(how),
                actor,
                upstream=upstream,
                old_value=moved.old_text,
                new_value=version_text(version),
                detail=details,
            )
            mark = manual_watermark(
                current, preview, actor=actor, now=codec.now(), pending_history=pending
            )
            self._put_watermark(dt, mark)
            return moved, pending

        moved, pending = self._cas(WATERMARKS, decide)
        fault_point("after_manual_watermark_commit")
        self._flush_one(upstream, pending)
        stale = self._batch_reading(upstream)
        if stale_after_manual_change(stale, upstream, version):
            error = f"planned from the watermark before the {why}"
            abandoned += self._abandon(stale, actor=actor, error=error, ended_ok=False)
        return dataclasses.replace(
            moved, open_batch=preview.open_batch, abandoned=tuple(abandoned), applied=True
        )

    def _abandon(
        self, batch: Batch | None, *, actor: str, error: str, ended_ok: bool = True
    ) -> list[str]:
        """Abandon ``batch`` and return its id in a list; an empty list when there is none,
        or when ``ended_ok`` and it ended meanwhile (a finalizer completed it)."""
        if batch is None:
            return []
        try:
            self.set_batch_status(batch.batch_id, BatchStatus.ABANDONED, actor=actor, error=error)
        except BatchStateError:
            if not ended_ok:
                raise
            return []
        return [batch.batch_id]


__all__ = ["WatermarkMoves"]
