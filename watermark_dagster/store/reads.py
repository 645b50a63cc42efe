"""What the control tables hold now, read without writing: the batches (open ones, one
by id, listings, the newest) and the committed watermarks.
"""

from datetime import datetime

from deltalake import DeltaTable

from watermark_dagster.core.records import Batch, BatchKind, BatchStatus, Watermark
from watermark_dagster.errors import BatchStateError
from watermark_dagster.store import codec
from watermark_dagster.store.schema import bucket_of
from watermark_dagster.store.tables import BATCHES, WATERMARKS, ControlTables, where


class StateReads(ControlTables):
    """Reads of ``batches`` and ``committed_watermarks``, one part of
    :class:`~watermark_dagster.store.store.WatermarkStore`."""

    def _open_batches(self, dt: DeltaTable) -> list[Batch]:
        return codec.batches(self._rows(dt, where(status=BatchStatus.PLANNED.value)))

    def open_batches(self) -> list[Batch]:
        """Every open batch (PLANNED, not yet finalized): scheduled and replays, oldest first."""
        return self._open_batches(self._load(BATCHES))

    def open_batch(self) -> Batch | None:
        """The open SCHEDULED batch (PLANNED, not yet finalized), if any."""
        opened = [b for b in self.open_batches() if b.kind is BatchKind.SCHEDULED]
        return opened[0] if opened else None

    def get_batch(self, batch_id: str) -> Batch:
        """One batch by id.

        Raises:
            BatchStateError: no batch has that id.
        """
        rows = self._rows(
            self._load(BATCHES), where(batch_id=batch_id), buckets=[bucket_of(batch_id)]
        )
        if not rows:
            raise BatchStateError(
                f"No batch '{batch_id}' in {self.uri(BATCHES)}.",
                batch_id=batch_id,
                fix="list batches with `watermark batches`.",
            )
        return codec.batches(rows)[0]

    def batches(
        self, *, limit: int | None = None, status: BatchStatus | None = None
    ) -> list[Batch]:
        """All batches (only those with ``status`` when given), newest first. ``limit``
        keeps the newest N and reads only the newest buckets that hold them."""
        dt = self._load(BATCHES)
        key = where(status=None if status is None else status.value)
        if limit is None:
            rows = self._rows(dt, key)
        else:
            rows = self._rows_newest_first(
                dt, key, enough=lambda found: len({r["batch_id"] for r in found}) >= limit
            )
        found = codec.batches(rows)
        found.reverse()
        return found[:limit] if limit is not None else found

    def newest_scheduled(self) -> Batch | None:
        """The SCHEDULED batch with the highest sequence (None before the first). Reads
        buckets from the newest until one holds one."""
        scheduled = where(kind=BatchKind.SCHEDULED.value)
        rows = self._rows_newest_first(self._load(BATCHES), scheduled, enough=bool)
        return max(codec.batches(rows), key=lambda b: b.seq, default=None)

    def sightings(self, upstream: str, before: datetime) -> list[tuple[datetime, str | None]]:
        """When each recent batch was planned and the state its look recorded for
        ``upstream`` (see :mod:`watermark_dagster.core.sightings`), newest first: every
        sighting after ``before`` and at least one at or before it when there is one. Reads
        buckets from the newest until one holds a batch planned at or before ``before``."""

        def enough(found: list[dict]) -> bool:
            return any(r["created_at"] <= before for r in found)

        rows = self._rows_newest_first(self._load(BATCHES), where(upstream=upstream), enough=enough)
        found = [(r["created_at"], r["source_state"]) for r in rows]
        return sorted(found, key=lambda s: s[0], reverse=True)

    def last_planned_at(self) -> datetime | None:
        """When the newest batch was planned (None before the first). Reads the newest
        bucket's ``created_at`` only."""
        dt = self._load(BATCHES)
        rows = self._rows_newest_first(dt, enough=bool)
        return max((r["created_at"] for r in rows), default=None)

    def committed(self) -> dict[str, Watermark]:
        """Every upstream's committed watermark row."""
        marks = map(codec.watermark, self._rows(self._load(WATERMARKS)))
        return {m.upstream: m for m in marks}

    def committed_versions(self) -> dict[str, int | None]:
        """Upstream -> committed version (None: reset, nothing committed)."""
        return {u: w.committed_version for u, w in self.committed().items()}


__all__ = ["StateReads"]
