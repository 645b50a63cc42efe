"""The watermark store: the control plane, kept in four Delta tables written with delta-rs.

No JVM is involved. One method per state transition: each reads the state inside a
compare-and-swap on one table (:mod:`watermark_dagster.store.tables`), asks the pure rules
of :mod:`watermark_dagster.core` what to change, and commits it as the next version or
decides again. This is what makes two coordinators ticking at once plan one batch, and
two finalizers advance a watermark once. Rows are built and parsed by
:mod:`watermark_dagster.store.codec` only.

History rows follow the change they describe, and none is lost to a process killed in
between: a watermark change (a manual move, a start point) commits its history row with
it (``pending_history``), recorded right after or by the next change; a plan's and an
advance's rows are written once per batch (a compare-and-swap on ``history``), and the
next planner or finalizer writes one a killed process left out. Only a batch's status
changes and a replay's plan are appended after their commit without such a guard: a kill
in between leaves them without their history row (the state itself stays consistent).
"""

import dataclasses
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from deltalake import DeltaTable

from watermark_dagster.config.pipeline import StrategyRun
from watermark_dagster.core.batch_ending import decide_status_change
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
from watermark_dagster.core.planning import UpstreamPosition, plan_batch, with_committed
from watermark_dagster.core.ranges import (
    CursorPosition,
    CursorWindow,
    ReadMode,
    VersionRange,
)
from watermark_dagster.core.records import (
    Batch,
    BatchKind,
    BatchStatus,
    Checkpoint,
    CheckpointStatus,
    Watermark,
    WatermarkChange,
    WatermarkHow,
    running_checkpoint,
    seq_of,
    start_point,
    version_text,
)
from watermark_dagster.core.replay import check_replay_range, plan_batch_replay, plan_replay
from watermark_dagster.errors import BatchStateError
from watermark_dagster.store import codec
from watermark_dagster.store.schema import NO_BATCH_BUCKET, bucket_of
from watermark_dagster.store.tables import ControlTables

_BATCHES = "batches"
_WATERMARKS = "committed_watermarks"
_CHECKPOINTS = "pipeline_checkpoints"
_HISTORY = "history"
# How many of history's newest buckets (each BUCKET_SIZE batches) `auto` reads its
# pipeline's measured runs from.
STRATEGY_BUCKETS = 2


def _where(**values: Any) -> dict[str, Any]:
    """Rows whose columns equal ``values`` (None values are left out)."""
    return {column: value for column, value in values.items() if value is not None}


class WatermarkStore(ControlTables):
    """The control tables under one root folder (a local path or an object-store URI).

    Args:
        root: folder that holds ``batches``, ``committed_watermarks``,
            ``pipeline_checkpoints`` and ``history``; created on first use.
        storage_options: delta-rs storage options for object stores.
        max_commit_attempts: how many times a conflicting commit is decided again.

    Example:
        >>> store = WatermarkStore("/tmp/control")
        >>> store.committed()  # {} on a new root
    """

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
        self._append(_HISTORY, [codec.history_row(event, actor, **fields)])

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
        """Append those of ``rows`` (one batch's steps) whose ``(event, batch_id,
        upstream)`` is not in ``history`` yet, in one compare-and-swap commit that reads
        only the batch's bucket. Returns how many this call wrote."""
        if not rows:
            return 0
        self.ensure_tables()
        buckets = {bucket_of(r["batch_id"]) for r in rows}

        def decide(dt: DeltaTable) -> int:
            ids = sorted({r["batch_id"] for r in rows})
            there = {
                (r["event"], r["batch_id"], r["upstream"])
                for r in self._rows(dt, {"batch_id": ids}, buckets=buckets)
            }
            todo = [r for r in rows if (r["event"], r["batch_id"], r.get("upstream")) not in there]
            if todo:
                self._insert(dt, _HISTORY, todo)
            return len(todo)

        return self._cas(_HISTORY, decide)

    def _append_once(
        self, row: dict[str, Any], key: dict[str, Any], also: Callable[[dict[str, Any]], bool]
    ) -> bool:
        """Append ``row`` (of no batch) unless a row matching ``key`` and ``also`` is in
        its bucket."""
        self.ensure_tables()

        def decide(dt: DeltaTable) -> bool:
            if self._rows(dt, key, buckets=[NO_BATCH_BUCKET], also=also):
                return False
            self._insert(dt, _HISTORY, [row])
            return True

        return self._cas(_HISTORY, decide)

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
            _WATERMARKS,
            lambda dt: self._clear(
                dt,
                _WATERMARKS,
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
        dt = self._load(_HISTORY)
        key = _where(upstream=upstream, batch_id=batch_id)
        if batch_id is not None:
            rows = self._rows(dt, key, buckets=[bucket_of(batch_id)])
        elif limit is not None:
            rows = self._rows(dt, key, buckets=[NO_BATCH_BUCKET])
            rows += self._rows_newest_first(dt, key, enough=lambda found: len(found) >= limit)
        else:
            rows = self._rows(dt, key)
        rows.sort(key=lambda r: r["at"])
        return rows[-limit:] if limit is not None else rows

    def strategy_runs(self, pipeline: str) -> list[StrategyRun]:
        """The measured runs of ``pipeline``'s strategies that ``history`` holds in its
        newest ``STRATEGY_BUCKETS`` buckets, oldest first: what ``auto`` weighs.

        Reads those buckets only, so the cost does not grow with history; runs older than
        them are forgotten, so a strategy ``auto`` stopped choosing is in time measured
        again by the size rule.
        """
        dt = self._load(_HISTORY)
        match = _where(event="PIPELINE_SUCCEEDED", pipeline=pipeline)
        newest = [b for b in self._buckets(dt) if b != NO_BATCH_BUCKET][:STRATEGY_BUCKETS]
        rows = self._rows(dt, match, buckets=newest) if newest else []
        rows.sort(key=lambda r: r["at"])
        return [run for run in map(codec.strategy_run, rows) if run is not None]

    # ---------------------------------------------------------------- batches: reads

    def _open_batches(self, dt: DeltaTable) -> list[Batch]:
        return codec.batches(self._rows(dt, _where(status=BatchStatus.PLANNED.value)))

    def open_batches(self) -> list[Batch]:
        """Every open batch (PLANNED, not yet finalized): scheduled and replays, oldest first."""
        return self._open_batches(self._load(_BATCHES))

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
            self._load(_BATCHES), _where(batch_id=batch_id), buckets=[bucket_of(batch_id)]
        )
        if not rows:
            raise BatchStateError(
                f"No batch '{batch_id}' in {self.uri(_BATCHES)}.",
                batch_id=batch_id,
                fix="list batches with `watermark batches`.",
            )
        return codec.batches(rows)[0]

    def batches(
        self, *, limit: int | None = None, status: BatchStatus | None = None
    ) -> list[Batch]:
        """All batches (only those with ``status`` when given), newest first. ``limit``
        keeps the newest N and reads only the newest buckets that hold them."""
        dt = self._load(_BATCHES)
        key = _where(status=None if status is None else status.value)
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
        scheduled = _where(kind=BatchKind.SCHEDULED.value)
        rows = self._rows_newest_first(self._load(_BATCHES), scheduled, enough=bool)
        return max(codec.batches(rows), key=lambda b: b.seq, default=None)

    def last_planned_at(self) -> datetime | None:
        """When the newest batch was planned (None before the first). Reads the newest
        bucket's ``created_at`` only."""
        dt = self._load(_BATCHES)
        rows = self._rows_newest_first(dt, enough=bool)
        return max((r["created_at"] for r in rows), default=None)

    # ---------------------------------------------------------------- batches: plans

    def create_batch(
        self,
        positions: Sequence[UpstreamPosition],
        pipeline_inputs: Mapping[str, Sequence[str]],
        *,
        actor: str,
        table_ids: Mapping[str, str | None] | None = None,
        schema_fingerprints: Mapping[str, str | None] | None = None,
        source_states: Mapping[str, str | None] | None = None,
        bootstrap: Sequence[str] = (),
        overwrite: Sequence[str] = (),
        locations: Mapping[str, str | None] | None = None,
        reloads_owed: Sequence[str] = (),
        frozen: Collection[str] = (),
    ) -> tuple[Batch | None, bool]:
        """Plan and record the next SCHEDULED batch in one commit, unless one is open.

        The committed watermarks are read inside the compare-and-swap, so a plan never
        starts anywhere but right after them. A cursor upstream has new data when its
        ``source_states`` entry differs from the state recorded with its committed position.
        ``locations`` (upstream -> where it was observed) are recorded with the plan.
        ``reloads_owed`` that the plan does not reload are recorded with it, so the next
        plans still owe them; ``frozen`` upstreams are planned NOOP (see
        :func:`~watermark_dagster.core.planning.plan_batch`).

        Returns:
            ``(batch, True)`` for a new batch; ``(open_batch, False)`` when a batch is
            already open (possibly planned by a concurrent coordinator); ``(None, False)``
            when there is nothing to do.
        """
        table_ids = table_ids or {}
        schema_fingerprints = schema_fingerprints or {}
        source_states = source_states or {}
        locations = locations or {}

        def decide(dt: DeltaTable) -> tuple[Batch | None, bool]:
            opened = [b for b in self._open_batches(dt) if b.kind is BatchKind.SCHEDULED]
            if opened:
                return opened[0], False
            marks = self.committed()
            fresh = [
                with_committed(p, marks.get(p.name), source_states.get(p.name)) for p in positions
            ]
            plan = plan_batch(
                fresh, pipeline_inputs, bootstrap=bootstrap, overwrite=overwrite, frozen=frozen
            )
            if not plan.has_work:
                return None, False
            batch = codec.new_batch(
                self._next_seq(dt),
                BatchKind.SCHEDULED,
                plan.inputs,
                pipelines=plan.pipelines,
                actor=actor,
                full_load=plan.full_load,
                reloads_owed=tuple(sorted(set(reloads_owed) - set(plan.full_load))),
                table_ids={u: table_ids.get(u) for u in plan.inputs},
                schema_fingerprints={u: schema_fingerprints.get(u) for u in plan.inputs},
                source_states={u: source_states.get(u) for u in plan.inputs},
                locations={u: locations.get(u) for u in plan.inputs},
            )
            latest = {p.name: p.latest_version for p in fresh if not plan.inputs[p.name].is_cursor}
            committed = {u: w.committed_version for u, w in marks.items()}
            return self._insert_batch(dt, batch, committed=committed, latest=latest), True

        batch, created = self._cas(_BATCHES, decide)
        if batch is not None:
            if created:
                fault_point("after_plan_commit")
            self.ensure_plan_recorded(batch, actor=actor)
        return batch, created

    def _insert_batch(self, dt: DeltaTable, batch: Batch, **context: Any) -> Batch:
        """Commit the rows of new ``batch`` and return it as read back from them."""
        rows = codec.batch_rows(batch, **context)
        self._insert(dt, _BATCHES, rows)
        return codec.batches(rows)[0]

    def ensure_plan_recorded(self, batch: Batch, *, actor: str) -> bool:
        """Write the BATCH_PLANNED history row of ``batch`` unless it is there (a planner
        that died right after the plan commit left it out). Reads ``history``: a sensor
        calls it once per batch. Returns True when this call wrote it."""
        return self.record_once(
            "BATCH_PLANNED",
            actor=actor,
            batch_id=batch.batch_id,
            detail={
                "pipelines": list(batch.pipelines),
                "full_load": list(batch.full_load),
                "ranges": {u: i.describe() for u, i in batch.inputs.items()},
                **({"reloads_owed": list(batch.reloads_owed)} if batch.reloads_owed else {}),
            },
        )

    def create_range_replay(
        self,
        upstream: str,
        rng: VersionRange,
        *,
        mode: ReadMode,
        pipelines: Sequence[str],
        all_upstreams: Sequence[str],
        actor: str,
        reason: str | None = None,
    ) -> Batch:
        """Record a REPLAY batch that re-reads ``rng`` of ``upstream`` through ``pipelines``
        (``watermark replay``; a batch partition's backfill is :meth:`create_backfill_replay`).

        The other upstreams are pinned where the scheduled batch that applied version
        ``rng.end`` pinned them, and the replay writes with that batch's position
        (``order_seq``), so a merge target takes nothing older than what it holds (I5); it
        updates or deletes rows the target holds and never re-inserts a missing key (a row
        deleted by a later batch stays deleted). A replay never moves a committed watermark.

        Raises:
            BatchStateError: the range is not entirely applied yet (beyond the committed
                watermark), or no completed batch applied its end.
        """

        def decide(dt: DeltaTable) -> Batch:
            committed = self.committed_versions()
            check_replay_range(upstream, rng, committed.get(upstream))
            scheduled = codec.batches(self._rows(dt, _where(kind=BatchKind.SCHEDULED.value)))
            plan = plan_replay(scheduled, upstream, rng, mode=mode, upstreams=all_upstreams)
            batch = _replay_batch(
                self._next_seq(dt),
                plan.inputs,
                sorted(pipelines),
                actor,
                plan.order_seq,
                plan.origin,
            )
            return self._insert_batch(dt, batch, committed=committed, latest={}, error=reason)

        batch = self._cas(_BATCHES, decide)
        self.record(
            "BATCH_PLANNED",
            actor=actor,
            batch_id=batch.batch_id,
            upstream=upstream,
            detail={
                "kind": BatchKind.REPLAY.value,
                "range": str(rng),
                "pipelines": list(batch.pipelines),
                "order_seq": batch.order_seq,
                "reason": reason,
            },
        )
        return batch

    def create_backfill_replay(
        self,
        batch_id: str,
        *,
        pipeline: str,
        upstreams: Sequence[str],
        modes: Mapping[str, ReadMode],
        actor: str,
        reason: str | None = None,
    ) -> Batch:
        """Record a REPLAY batch for a backfill of the applied batch ``batch_id``'s
        partition: it re-reads every version range ``batch_id`` pinned for ``upstreams``
        through ``pipeline`` (see :func:`~watermark_dagster.core.replay.plan_batch_replay`).

        It writes at that batch's position, pins the other upstreams where it pinned them,
        and, like :meth:`create_range_replay`, never moves a committed watermark.

        Raises:
            BatchStateError: the batch is unknown, a range is not applied yet (beyond the
                committed watermark), or the batch pins no version range to replay.
        """
        replayed = self.get_batch(batch_id)

        def decide(dt: DeltaTable) -> Batch:
            committed = self.committed_versions()
            plan = plan_batch_replay(replayed, upstreams, modes=modes, committed=committed)
            batch = _replay_batch(
                self._next_seq(dt), plan.inputs, [pipeline], actor, plan.order_seq, replayed
            )
            return self._insert_batch(dt, batch, committed=committed, latest={}, error=reason)

        batch = self._cas(_BATCHES, decide)
        self.record(
            "BATCH_PLANNED",
            actor=actor,
            batch_id=batch.batch_id,
            pipeline=pipeline,
            detail={
                "kind": BatchKind.REPLAY.value,
                "replays": batch_id,
                "ranges": {u: i.describe() for u, i in batch.inputs.items()},
                "pipelines": list(batch.pipelines),
                "order_seq": batch.order_seq,
                "reason": reason,
            },
        )
        return batch

    # ---------------------------------------------------------------- batches: transitions

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
                self._merge(dt, _WATERMARKS, rows, on=("upstream",), columns=columns, insert=True)
            return steps

        steps = self._cas(_WATERMARKS, decide)
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
        self._record_all_once(rows)
        self._cas(_BATCHES, lambda dt: self._mark_advanced(dt, batch.batch_id, upstreams))
        return {u: step.decision for u, step in steps.items()}

    def _mark_advanced(self, dt: DeltaTable, batch_id: str, upstreams: Sequence[str]) -> None:
        rows = self._rows(dt, _where(batch_id=batch_id), buckets=[bucket_of(batch_id)])
        todo = [r["upstream"] for r in rows if r["upstream"] in upstreams and not r["advanced_at"]]
        if not todo:
            return
        at = codec.now()
        changes = [codec.batch_key(batch_id, u, advanced_at=at, updated_at=at) for u in todo]
        self._merge(dt, _BATCHES, changes, on=("batch_id", "upstream"))

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
                dt, _where(batch_id=batch_id, upstream=upstream), buckets=[bucket_of(batch_id)]
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
            self._merge(dt, _BATCHES, [change], on=("batch_id", "upstream"))
            return CursorWindow(window.start, final)

        return self._cas(_BATCHES, decide)

    def set_batch_status(
        self, batch_id: str, status: BatchStatus, *, actor: str, error: str | None = None
    ) -> bool:
        """Give every row of a batch ``status``; returns False when it already had it.

        Completing requires every ranged upstream to have been advanced.
        """

        def decide(dt: DeltaTable) -> bool:
            rows = self._rows(dt, _where(batch_id=batch_id), buckets=[bucket_of(batch_id)])
            if not rows:
                raise BatchStateError(f"No batch '{batch_id}' to mark {status}.", batch_id=batch_id)
            batch = codec.batches(rows)[0]
            if not decide_status_change(batch, codec.row_statuses(rows), status):
                return False
            change = codec.batch_key(batch_id, status=status.value, error=error)
            self._merge(dt, _BATCHES, [change], on=("batch_id",))
            return True

        changed = self._cas(_BATCHES, decide)
        if changed:
            self.record(
                f"BATCH_{status.value}",
                actor=actor,
                batch_id=batch_id,
                detail={"error": error} if error else None,
            )
        return changed

    # ---------------------------------------------------------------- watermarks

    def _put_watermark(self, dt: DeltaTable, mark: Watermark) -> None:
        """Insert or replace one upstream's watermark row. A ``pending_history`` already on
        the row is kept unless this change brings its own (see flush_pending_history)."""
        row = codec.watermark_row(mark)
        columns = [
            c
            for c in row
            if c != "upstream" and (c != "pending_history" or mark.pending_history is not None)
        ]
        self._merge(dt, _WATERMARKS, [row], on=("upstream",), columns=columns, insert=True)

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
            self._insert(dt, _WATERMARKS, [codec.watermark_row(m) for m in marks])
            return todo

        done = self._cas(_WATERMARKS, decide)
        if done:
            self.flush_pending_history(done)
        return done

    def committed(self) -> dict[str, Watermark]:
        """Every upstream's committed watermark row."""
        marks = map(codec.watermark, self._rows(self._load(_WATERMARKS)))
        return {m.upstream: m for m in marks}

    def committed_versions(self) -> dict[str, int | None]:
        """Upstream -> committed version (None: reset, nothing committed)."""
        return {u: w.committed_version for u, w in self.committed().items()}

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
            current = codec.watermark_or_none(self._rows(dt, _where(upstream=upstream)))
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

        moved, pending = self._cas(_WATERMARKS, decide)
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

    # ---------------------------------------------------------------- checkpoints

    def begin_checkpoint(self, pipeline: str, batch_id: str, *, run_id: str | None) -> int:
        """Record a RUNNING attempt of ``pipeline`` on ``batch_id``; returns the attempt number."""

        def decide(dt: DeltaTable) -> int:
            rows = self._rows(
                dt, _where(pipeline=pipeline, batch_id=batch_id), buckets=[bucket_of(batch_id)]
            )
            attempt = 1 + max((r["attempt"] for r in rows), default=0)
            running = running_checkpoint(pipeline, batch_id, attempt, run_id=run_id, at=codec.now())
            self._insert(dt, _CHECKPOINTS, [codec.checkpoint_row(running)])
            return attempt

        return self._cas(_CHECKPOINTS, decide)

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
    ) -> None:
        """Close one attempt with its outcome, counts and error."""

        def decide(dt: DeltaTable) -> None:
            rows = self._rows(
                dt,
                _where(pipeline=pipeline, batch_id=batch_id, attempt=attempt),
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
            self._merge(dt, _CHECKPOINTS, [codec.checkpoint_row(finished)], on=key)

        self._cas(_CHECKPOINTS, decide)

    def checkpoints(
        self, *, batch_id: str | None = None, pipeline: str | None = None
    ) -> list[Checkpoint]:
        """Checkpoint rows, optionally for one batch and/or one pipeline, oldest first (one
        batch's rows read its bucket only)."""
        buckets = None if batch_id is None else [bucket_of(batch_id)]
        key = _where(batch_id=batch_id, pipeline=pipeline)
        rows = self._rows(self._load(_CHECKPOINTS), key, buckets=buckets)
        found = map(codec.checkpoint, rows)
        return sorted(found, key=lambda c: (c.batch_id, c.pipeline, c.attempt))

    def newest_success(self, pipeline: str) -> str | None:
        """Id of the newest batch ``pipeline`` succeeded on (None before its first).
        Reads buckets from the newest until one holds a success."""
        succeeded = _where(pipeline=pipeline, status=CheckpointStatus.SUCCESS.value)
        dt = self._load(_CHECKPOINTS)
        rows = self._rows_newest_first(dt, succeeded, enough=bool)
        return max((r["batch_id"] for r in rows), key=seq_of, default=None)

    def newest_applied(self, pipeline: str) -> Batch | None:
        """The SCHEDULED batch with the highest sequence ``pipeline`` succeeded on: what its
        target is known to hold (replays write at older positions and do not count).
        Reads buckets from the newest until one holds such a batch."""
        succeeded = _where(pipeline=pipeline, status=CheckpointStatus.SUCCESS.value)
        checkpoints, batches = self._load(_CHECKPOINTS), self._load(_BATCHES)
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


_SHARED = threading.local()


def shared_store(root: str, *, storage_options: Mapping[str, str] | None = None) -> WatermarkStore:
    """The store of ``root`` kept for this thread and reused by every sensor tick and run
    step of the process: its table handles are refreshed to the latest version instead of
    loaded from scratch, and the tables are checked once. One per thread, because a store's
    handles are not safe to share between threads.
    """
    key = (str(root), tuple(sorted((storage_options or {}).items())))
    stores: dict[tuple[str, tuple[tuple[str, str], ...]], WatermarkStore] = (
        _SHARED.__dict__.setdefault("stores", {})
    )
    store = stores.get(key)
    if store is None:
        store = stores[key] = WatermarkStore(root, storage_options=storage_options)
    return store


__all__ = ["WatermarkStore", "shared_store"]


def _replay_batch(
    seq: int,
    inputs: Mapping[str, Any],
    pipelines: list[str],
    actor: str,
    order_seq: int,
    origin: Batch,
) -> Batch:
    """A REPLAY batch of ``inputs`` written at ``order_seq``, each upstream carrying the
    table id, schema fingerprint, location and cursor source state ``origin`` (the batch
    that applied the range) pinned for it: a Delta cursor source is read at the version
    the origin was planned at, not at its latest (I3)."""
    return codec.new_batch(
        seq,
        BatchKind.REPLAY,
        inputs,
        pipelines=pipelines,
        actor=actor,
        order_seq=order_seq,
        table_ids={u: origin.table_ids.get(u) for u in inputs},
        schema_fingerprints={u: origin.schema_fingerprints.get(u) for u in inputs},
        locations={u: origin.locations.get(u) for u in inputs},
        source_states={u: origin.source_states.get(u) for u in inputs},
    )
