"""Changes to a planned batch after its plan: its status (completed, failed, abandoned)
and the end of a cursor window, pinned by its first reader.
"""

from deltalake import DeltaTable

from watermark_dagster.core.batch_ending import decide_status_change
from watermark_dagster.core.ranges import CursorPosition, CursorWindow
from watermark_dagster.core.records import BatchStatus
from watermark_dagster.errors import BatchStateError
from watermark_dagster.store import codec
from watermark_dagster.store.history import History
from watermark_dagster.store.schema import bucket_of
from watermark_dagster.store.tables import BATCHES, where


class BatchChanges(History):
    """Status changes and window pins of ``batches`` rows, one part of
    :class:`~watermark_dagster.store.store.WatermarkStore`."""

    def pin_window(
        self,
        batch_id: str,
        upstream: str,
        end: CursorPosition | None,
        *,
        recheck_at: int | None = None,
    ) -> CursorWindow:
        """Fix the end of a cursor window the first time a pipeline reads it.

        The first reader wins: a concurrent or later reader (a retry, another pipeline of
        the batch) gets the end already recorded, so every read of the batch sees the same
        rows (I3). ``end`` None (no row yet) pins the empty window at its start.

        Args:
            batch_id: the batch whose window is pinned.
            upstream: the cursor upstream read.
            end: the newest position the reader saw, or None when the source has no row.
            recheck_at: when rows held back by the lag pass it (µs since the epoch);
                recorded so a plan reads again then, even if the source does not change.
        """

        def decide(dt: DeltaTable) -> CursorWindow:
            rows = self._rows(
                dt, where(batch_id=batch_id, upstream=upstream), buckets=[bucket_of(batch_id)]
            )
            if not rows:
                raise BatchStateError(
                    f"Batch {batch_id} has no row for upstream '{upstream}'.",
                    batch_id=batch_id,
                    upstream=upstream,
                )
            window = codec.planned_input(rows[0]).window
            assert window is not None  # a row without versions is a cursor row
            if window.end is not None:
                return window
            # No row at all: the window is empty; () is the position before every row.
            final = end if end is not None else (window.start if window.start is not None else ())
            change = codec.window_end(batch_id, upstream, final, recheck_at=recheck_at)
            self._merge(dt, BATCHES, [change], on=("batch_id", "upstream"))
            return CursorWindow(window.start, final)

        return self._cas(BATCHES, decide)

    def set_batch_status(
        self, batch_id: str, status: BatchStatus, *, actor: str, error: str | None = None
    ) -> bool:
        """Give every row of a batch ``status``; returns False when it already had it.

        Completing requires every ranged upstream to have been advanced.
        """

        def decide(dt: DeltaTable) -> bool:
            rows = self._rows(dt, where(batch_id=batch_id), buckets=[bucket_of(batch_id)])
            if not rows:
                raise BatchStateError(f"No batch '{batch_id}' to mark {status}.", batch_id=batch_id)
            batch = codec.batches(rows)[0]
            if not decide_status_change(batch, codec.row_statuses(rows), status):
                return False
            change = codec.batch_key(batch_id, status=status.value, error=error)
            self._merge(dt, BATCHES, [change], on=("batch_id",))
            return True

        changed = self._cas(BATCHES, decide)
        if changed:
            self.record(
                f"BATCH_{status.value}",
                actor=actor,
                batch_id=batch_id,
                detail={"error": error} if error else None,
            )
        return changed


__all__ = ["BatchChanges"]
