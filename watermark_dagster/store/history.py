"""The audit trail: rows appended to ``history``, written once per step, and read back.

History rows follow the change they describe, and none is lost to a process killed in
between: a watermark change (a manual move, a start point) commits its history row with
it (``pending_history``), recorded right after or by the next change; a pipeline
attempt's outcome commits its row with the checkpoint row that closes it (the
checkpoint's ``pending_history``), read from there until the batch's advance copies it
into ``history`` in the advance's own history commit; a plan's and an advance's rows are
written once per batch (a compare-and-swap on ``history``), and the next planner or
finalizer writes one a killed process left out. Only a batch's status changes and a
replay's plan are appended after their commit without such a guard: a kill in between
leaves them without their history row (the state itself stays consistent).
"""

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from deltalake import DeltaTable

from watermark_dagster.core.strategy import StrategyRun
from watermark_dagster.store import codec
from watermark_dagster.store.reads import StateReads
from watermark_dagster.store.schema import HISTORY as HISTORY_SCHEMA
from watermark_dagster.store.schema import NO_BATCH_BUCKET, bucket_of
from watermark_dagster.store.tables import CHECKPOINTS, HISTORY, WATERMARKS, where

# How many of history's newest buckets (each BUCKET_SIZE batches) `auto` reads its
# pipeline's measured runs from.
STRATEGY_BUCKETS = 2


class History(StateReads):
    """Writes and reads of ``history``, one part of
    :class:`~watermark_dagster.store.store.WatermarkStore`."""

    def ensure_tables(self) -> None:
        """Create or upgrade the control tables (see :meth:`ControlTables.ensure_tables`);
        a table rewritten into the current layout is recorded in ``history``."""
        if self._ensured:
            return
        super().ensure_tables()
        for table, rows in sorted(self.migrated.items()):
            if rows:
                self.record(
                    "CONTROL_TABLE_UPGRADED",
                    actor=None,
                    detail={"table": table, "rows": rows, "layout": "partitioned by bucket"},
                )

    # ---------------------------------------------------------------- history

    def record(self, event: str, *, actor: str | None, **fields: Any) -> None:
        """Append one audit row to ``history``."""
        self.ensure_tables()
        self._append(HISTORY, [codec.history_row(event, actor, **fields)])

    def record_once(
        self,
        event: str,
        *,
        actor: str | None,
        batch_id: str,
        upstream: str | None = None,
        **fields: Any,
    ) -> bool:
        """Append the audit row of ``event`` for ``(batch_id, upstream)`` unless it is there.

        A compare-and-swap on ``history``: two processes recording the same step (a
        finalizer and its twin, or a recovery writing a row a killed process lost) write
        it once. Returns True when this call wrote it.
        """
        row = codec.history_row(event, actor, batch_id=batch_id, upstream=upstream, **fields)
        return bool(self._record_all_once([row]))

    def _record_all_once(self, rows: Sequence[dict[str, Any]]) -> int:
        """Append those of ``rows`` (one batch's steps) not in ``history`` yet (by
        ``(event, batch_id, upstream)``, or the change id of a row that carries one), in one
        compare-and-swap commit that reads only the batch's bucket. Returns how many this
        call wrote."""
        if not rows:
            return 0
        self.ensure_tables()
        buckets = {bucket_of(r["batch_id"]) for r in rows}

        def decide(dt: DeltaTable) -> int:
            ids = sorted({r["batch_id"] for r in rows})
            there = {_once_key(r) for r in self._rows(dt, {"batch_id": ids}, buckets=buckets)}
            todo = [r for r in rows if _once_key(r) not in there]
            if todo:
                self._insert(dt, HISTORY, todo)
            return len(todo)

        return self._cas(HISTORY, decide)

    def _append_once(
        self, row: dict[str, Any], key: dict[str, Any], also: Callable[[dict[str, Any]], bool]
    ) -> bool:
        """Append ``row`` (of no batch) unless a row matching ``key`` and ``also`` is in
        its bucket."""
        self.ensure_tables()

        def decide(dt: DeltaTable) -> bool:
            if self._rows(dt, key, buckets=[NO_BATCH_BUCKET], also=also):
                return False
            self._insert(dt, HISTORY, [row])
            return True

        return self._cas(HISTORY, decide)

    def flush_pending_history(self, upstreams: Iterable[str] | None = None) -> int:
        """Record the history rows of watermark changes whose process died before it
        recorded them (a kill between the watermark commit and the history append), then
        clear them from the watermark rows. Each row is written once, even when two
        processes flush at the same time. Returns how many rows this call wrote."""
        wanted = None if upstreams is None else set(upstreams)
        written = 0
        for mark in self.committed().values():
            if mark.pending_history is None or (wanted is not None and mark.upstream not in wanted):
                continue
            written += self._flush_one(mark.upstream, mark.pending_history)
        return written

    def _flush_one(self, upstream: str, pending: str) -> int:
        row, change_id = codec.pending_row(pending)
        key = {"event": row["event"], "upstream": upstream}

        def same_change(found: dict[str, Any]) -> bool:
            return change_id in (found["detail"] or "")

        wrote = self._append_once(row, key, same_change)
        self._cas(
            WATERMARKS,
            lambda dt: self._clear(
                dt,
                WATERMARKS,
                {"upstream": upstream, "pending_history": pending},
                "pending_history",
            ),
        )
        return int(wrote)

    def history(
        self,
        *,
        upstream: str | None = None,
        batch_id: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Audit rows, oldest first, optionally for one upstream or batch.

        ``limit`` keeps the newest N rows and reads only the newest buckets it needs (and
        the bucket of rows of no batch), so its cost does not grow with history. One
        batch's rows read its bucket only.
        """
        dt = self._load(HISTORY)
        key = where(upstream=upstream, batch_id=batch_id)
        # Attempts' rows name no upstream: none when reading one upstream's.
        runs = upstream is None
        if batch_id is not None:
            bucket = [bucket_of(batch_id)]
            rows = self._rows(dt, key, buckets=bucket)
            if runs:
                rows = _with_runs(rows, self.run_rows(bucket, batch_id=batch_id))
        elif limit is not None:
            rows = self._rows(dt, key, buckets=[NO_BATCH_BUCKET])
            found: list[dict[str, Any]] = []
            for bucket in self._batch_buckets(dt):
                there = self._rows(dt, key, buckets=[bucket])
                found += _with_runs(there, self.run_rows([bucket])) if runs else there
                if len(found) >= limit:
                    break
            rows += found
        else:
            rows = self._rows(dt, key)
            if runs:
                rows = _with_runs(rows, self.run_rows(None))
        rows.sort(key=lambda r: r["at"])
        return rows[-limit:] if limit is not None else rows

    def run_rows(
        self, buckets: Sequence[int] | None, *, batch_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The history rows of pipeline attempts' outcomes that ``pipeline_checkpoints``
        holds (each closing row's ``pending_history``), in ``buckets`` (every bucket when
        None), optionally of one batch; they may be in ``history`` too, once the batch
        advanced."""
        held = self._rows(
            self._load(CHECKPOINTS),
            where(batch_id=batch_id),
            buckets=buckets,
            also=lambda r: r.get("pending_history") is not None,
        )
        blank = dict.fromkeys(HISTORY_SCHEMA.names)
        found = [{**blank, **codec.pending_row(r["pending_history"])[0]} for r in held]
        return [{**row, "bucket": bucket_of(row["batch_id"])} for row in found]

    def _batch_buckets(self, dt: DeltaTable) -> list[int]:
        """The buckets of batches' rows in ``history`` or ``pipeline_checkpoints``, newest
        first (from the logs, no data read)."""
        found = set(self._buckets(dt)) | set(self._buckets(self._load(CHECKPOINTS)))
        return sorted(found - {NO_BATCH_BUCKET}, reverse=True)

    def strategy_runs(self, pipeline: str) -> list[StrategyRun]:
        """The measured runs of ``pipeline``'s strategies that ``history`` holds in its
        newest ``STRATEGY_BUCKETS`` buckets, oldest first: what ``auto`` weighs.

        Reads those buckets only, so the cost does not grow with history; runs older than
        them are forgotten, so a strategy ``auto`` stopped choosing is in time measured
        again by the size rule.
        """
        dt = self._load(HISTORY)
        match = where(event="PIPELINE_SUCCEEDED", pipeline=pipeline)
        newest = self._batch_buckets(dt)[:STRATEGY_BUCKETS]
        rows = self._rows(dt, match, buckets=newest) if newest else []
        held = self.run_rows(newest) if newest else []
        mine = [r for r in held if r["event"] == match["event"] and r.get("pipeline") == pipeline]
        rows = _with_runs(rows, mine)
        rows.sort(key=lambda r: r["at"])
        return [run for run in map(codec.strategy_run, rows) if run is not None]


def _change_id(row: dict[str, Any]) -> str | None:
    """The change id a row's ``detail`` carries (rows first committed elsewhere, in a
    ``pending_history``), else None."""
    text = row.get("detail")
    if not text or "change_id" not in text:
        return None
    detail = json.loads(text)
    found = detail.get("change_id") if isinstance(detail, dict) else None
    return str(found) if found is not None else None


def _once_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What makes a batch's history row the same step as another: its change id, else its
    event, batch and upstream."""
    change = _change_id(row)
    if change is not None:
        return ("change", change)
    return (row["event"], row["batch_id"], row.get("upstream"))


def _with_runs(rows: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` read from ``history`` and the attempts' rows of ``runs`` not among them."""
    there = {_change_id(r) for r in rows} - {None}
    return rows + [r for r in runs if _change_id(r) not in there]


__all__ = ["STRATEGY_BUCKETS", "History"]
