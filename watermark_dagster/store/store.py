"""The watermark store: the control plane, kept in four Delta tables written with delta-rs.

No JVM is involved. Every state change is a compare-and-swap on one table: the change is
decided against the table as of version ``v`` and committed as version ``v + 1`` with
delta-rs' own commit retries turned off, so a concurrent writer that got there first makes
the commit fail; the store then reloads, decides again and retries. This is what makes two
coordinators ticking at once plan one batch, and two finalizers advance a watermark once.

History rows are written after the change they describe; a process killed between the two
leaves the change without its history row (the state itself stays consistent).
"""

import json
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake import Field as DeltaField
from deltalake.exceptions import CommitFailedError, DeltaError

from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.planning import (
    AdvanceDecision,
    PlannedInput,
    UpstreamPosition,
    cursor_state,
    decide_advance,
    decide_cursor_advance,
    plan_batch,
    with_committed,
)
from watermark_dagster.core.ranges import (
    CursorPosition,
    CursorWindow,
    ReadMode,
    VersionRange,
    decode_position,
    encode_position,
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
    batch_id_for,
    seq_of,
)
from watermark_dagster.errors import BatchStateError, CommitConflictError, TerminalError
from watermark_dagster.store import schema

T = TypeVar("T")

# A commit decided against version v must land as v + 1, or not at all.
_CAS = CommitProperties(max_commit_retries=0)


def _now() -> datetime:
    return datetime.now(UTC)


def _history_row(event: str, actor: str | None, **fields: Any) -> dict[str, Any]:
    """One ``history`` row; ``detail`` (a mapping) is stored as JSON."""
    detail = fields.pop("detail", None)
    row = {"at": _now(), "event": event, "actor": actor, **fields}
    if detail is not None:
        row["detail"] = json.dumps(detail, sort_keys=True, default=str)
    return row


def _text(version: int | None) -> str | None:
    return None if version is None else str(version)


def _planned_input(row: Mapping[str, Any]) -> PlannedInput:
    """One ``batches`` row as a planned input. Cursor rows have no versions at all."""
    mode = ReadMode(row["read_mode"])
    if row["end_version"] is None:
        start = decode_position(row["start_cursor"])
        end_text = row["end_cursor"]
        end = None if end_text is None else decode_position(end_text)
        return PlannedInput(row["upstream"], mode, None, None, CursorWindow(start, end))
    rng = (
        None
        if row["start_version"] is None
        else VersionRange(row["start_version"], row["end_version"])
    )
    return PlannedInput(row["upstream"], mode, rng, row["end_version"])


class WatermarkStore:
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

    def __init__(
        self,
        root: str | Path,
        *,
        storage_options: Mapping[str, str] | None = None,
        max_commit_attempts: int = 60,
    ) -> None:
        root_str = str(root)
        if "://" not in root_str:
            root_str = str(Path(root_str).expanduser().resolve())
        self.root = root_str.rstrip("/")
        self.storage_options = dict(storage_options) if storage_options else None
        self.max_commit_attempts = max_commit_attempts
        self._ensured = False

    # ---------------------------------------------------------------- table plumbing

    def uri(self, table: str) -> str:
        """Location of one control table."""
        return f"{self.root}/{table}"

    def ensure_tables(self) -> None:
        """Create the control tables that do not exist yet (safe to call concurrently)."""
        if self._ensured:
            return
        for name, table_schema in schema.TABLES.items():
            uri = self.uri(name)
            if DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                self._add_missing_columns(uri, table_schema)
                continue
            try:
                DeltaTable.create(
                    uri,
                    table_schema,
                    mode="ignore",
                    name=f"watermark_{name}",
                    storage_options=self.storage_options,
                )
            except DeltaError:
                # Another process created it between our check and our create.
                if not DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                    raise
        self._ensured = True

    def _add_missing_columns(self, uri: str, table_schema: pa.Schema) -> None:
        """Bring a control table written by an older release up to the current schema
        (new columns are nullable, so old rows read as NULL)."""
        dt = DeltaTable(uri, storage_options=self.storage_options)
        have = {f.name for f in dt.schema().fields}
        missing = [f for f in table_schema if f.name not in have]
        if not missing:
            return
        try:
            dt.alter.add_columns([DeltaField.from_arrow(f) for f in missing])
        except DeltaError:
            # A concurrent process added them first.
            dt = DeltaTable(uri, storage_options=self.storage_options)
            if any(f.name not in {g.name for g in dt.schema().fields} for f in missing):
                raise

    def _load(self, table: str) -> DeltaTable:
        self.ensure_tables()
        return DeltaTable(self.uri(table), storage_options=self.storage_options)

    def table_version(self, table: str) -> int:
        """Current Delta version of one control table (used to prove nothing was written)."""
        return self._load(table).version()

    @staticmethod
    def _arrow(dt: DeltaTable, columns: list[str] | None = None) -> pa.Table:
        """The table as of ``dt``'s version, in the control schema.

        Files written by delta-rs merges may carry ``string_view`` columns; casting to the
        declared schema keeps filters and comparisons uniform.
        """
        name = Path(dt.table_uri.rstrip("/")).name
        table_schema = schema.TABLES[name]
        if columns is not None:
            table_schema = pa.schema([table_schema.field(c) for c in columns])
        return dt.to_pyarrow_dataset().to_table(columns=columns).cast(table_schema)

    @classmethod
    def _rows(cls, dt: DeltaTable, filter_: pc.Expression | None = None) -> list[dict[str, Any]]:
        table = cls._arrow(dt)
        if filter_ is not None:
            table = table.filter(filter_)
        return table.to_pylist()

    def _cas(self, table: str, decide_and_commit: Callable[[DeltaTable], T]) -> T:
        """Run ``decide_and_commit`` against the latest version until its commit lands."""
        for attempt in range(self.max_commit_attempts):
            dt = self._load(table)
            try:
                return decide_and_commit(dt)
            except CommitFailedError:
                time.sleep(random.uniform(0.005, 0.05) * min(attempt + 1, 8))
        raise CommitConflictError(
            f"Control table '{table}' under {self.root}: {self.max_commit_attempts} commits in a "
            "row lost to concurrent writers.",
            fix="check for a runaway process writing the control tables, then retry.",
        )

    def _append(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Blind append (history): never conflicts, delta-rs retries it itself."""
        if not rows:
            return
        data = pa.Table.from_pylist(rows, schema=schema.TABLES[table])
        write_deltalake(self.uri(table), data, mode="append", storage_options=self.storage_options)

    def record(self, event: str, *, actor: str | None, **fields: Any) -> None:
        """Append one audit row to ``history``."""
        self.ensure_tables()
        self._append("history", [_history_row(event, actor, **fields)])

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
        row = _history_row(event, actor, batch_id=batch_id, upstream=upstream, **fields)
        key = (pc.field("event") == event) & (pc.field("batch_id") == batch_id)
        if upstream is not None:
            key = key & (pc.field("upstream") == upstream)
        return self._append_once(row, key)

    def _append_once(self, row: dict[str, Any], key: pc.Expression) -> bool:
        self.ensure_tables()

        def decide(dt: DeltaTable) -> bool:
            if self._rows(dt, key):
                return False
            data = pa.Table.from_pylist([row], schema=schema.HISTORY)
            write_deltalake(dt, data, mode="append", commit_properties=_CAS)
            return True

        return self._cas("history", decide)

    @staticmethod
    def _pending_row(event: str, actor: str | None, **fields: Any) -> str:
        """A history row to store with a watermark change (``pending_history``); its
        ``change_id`` in ``detail`` keys it, so it is recorded once."""
        detail = {**(fields.pop("detail", None) or {}), "change_id": uuid.uuid4().hex}
        row = _history_row(event, actor, detail=detail, **fields)
        return json.dumps({**row, "at": row["at"].isoformat()}, sort_keys=True)

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
        row = json.loads(pending)
        row["at"] = datetime.fromisoformat(row["at"])
        change_id = json.loads(row["detail"])["change_id"]
        key = (
            (pc.field("event") == row["event"])
            & (pc.field("upstream") == upstream)
            & pc.match_substring(pc.field("detail"), change_id)  # pyright: ignore[reportAttributeAccessIssue]
        )
        wrote = self._append_once(row, key)

        def clear(dt: DeltaTable) -> None:
            source = pa.table(
                {"upstream": [upstream], "pending_history": [pending]},
                schema=pa.schema(
                    [schema.COMMITTED_WATERMARKS.field(c) for c in ("upstream", "pending_history")]
                ),
            )
            (
                dt.merge(
                    source,
                    predicate="t.upstream = s.upstream AND t.pending_history = s.pending_history",
                    source_alias="s",
                    target_alias="t",
                    commit_properties=_CAS,
                )
                .when_matched_update({"pending_history": "CAST(NULL AS STRING)"})
                .execute()
            )

        self._cas("committed_watermarks", clear)
        return int(wrote)

    # ---------------------------------------------------------------- batches

    @staticmethod
    def _batches_from_rows(rows: Iterable[dict[str, Any]]) -> list[Batch]:
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            grouped.setdefault(row["batch_id"], []).append(row)
        batches = []
        for batch_id, group in grouped.items():
            first = group[0]
            inputs = {}
            for row in group:
                inputs[row["upstream"]] = _planned_input(row)
            statuses = {BatchStatus(r["status"]) for r in group}
            # Rows of a batch change status together; a mix means a write was cut short,
            # and the least finished status is the truth.
            order = [
                BatchStatus.PLANNED,
                BatchStatus.FAILED,
                BatchStatus.ABANDONED,
                BatchStatus.COMPLETED,
            ]
            status = next(s for s in order if s in statuses)
            batches.append(
                Batch(
                    batch_id=batch_id,
                    seq=first["seq"],
                    kind=BatchKind(first["kind"]),
                    plan_id=first["plan_id"],
                    status=status,
                    pipelines=tuple(json.loads(first["pipelines"])),
                    inputs=inputs,
                    advanced=frozenset(r["upstream"] for r in group if r["advanced_at"]),
                    created_at=first["created_at"],
                    actor=first["actor"],
                    full_load=tuple(json.loads(first.get("full_load") or "[]")),
                    order_seq=first.get("order_seq"),
                    table_ids={r["upstream"]: r["table_id"] for r in group},
                    schema_fingerprints={r["upstream"]: r["schema_fingerprint"] for r in group},
                    source_states={r["upstream"]: r.get("source_state") for r in group},
                    window_pending={r["upstream"]: r.get("window_pending") for r in group},
                )
            )
        return sorted(batches, key=lambda b: b.seq)

    def _open_batches(self, dt: DeltaTable) -> list[Batch]:
        rows = self._rows(dt, pc.field("status") == BatchStatus.PLANNED.value)
        return self._batches_from_rows(rows)

    def open_batches(self) -> list[Batch]:
        """Every open batch (PLANNED, not yet finalized): scheduled and replays, oldest first."""
        return self._open_batches(self._load("batches"))

    def open_batch(self) -> Batch | None:
        """The open SCHEDULED batch (PLANNED, not yet finalized), if any."""
        opened = [
            b for b in self._open_batches(self._load("batches")) if b.kind is BatchKind.SCHEDULED
        ]
        return opened[0] if opened else None

    def get_batch(self, batch_id: str) -> Batch:
        """One batch by id.

        Raises:
            BatchStateError: no batch has that id.
        """
        rows = self._rows(self._load("batches"), pc.field("batch_id") == batch_id)
        if not rows:
            raise BatchStateError(
                f"No batch '{batch_id}' in {self.uri('batches')}.",
                batch_id=batch_id,
                fix="list batches with `watermark batches`.",
            )
        return self._batches_from_rows(rows)[0]

    def batches(self, *, limit: int | None = None) -> list[Batch]:
        """All batches, newest first (``limit`` keeps the newest N)."""
        found = self._batches_from_rows(self._rows(self._load("batches")))
        found.reverse()
        return found[:limit] if limit is not None else found

    def last_planned_at(self) -> datetime | None:
        """When the newest batch was planned (None before the first)."""
        table = self._arrow(self._load("batches"), ["created_at"])
        if table.num_rows == 0:
            return None
        return max(table["created_at"].to_pylist())

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
    ) -> tuple[Batch | None, bool]:
        """Plan and record the next SCHEDULED batch in one commit, unless one is open.

        The committed watermarks are read inside the compare-and-swap, so a plan never
        starts anywhere but right after them. A cursor upstream has new data when its
        ``source_states`` entry differs from the state recorded with its committed position.

        Returns:
            ``(batch, True)`` for a new batch; ``(open_batch, False)`` when a batch is
            already open (possibly planned by a concurrent coordinator); ``(None, False)``
            when there is nothing to do.
        """
        table_ids = table_ids or {}
        schema_fingerprints = schema_fingerprints or {}
        source_states = source_states or {}

        def decide(dt: DeltaTable) -> tuple[Batch | None, bool]:
            opened = [b for b in self._open_batches(dt) if b.kind is BatchKind.SCHEDULED]
            if opened:
                return opened[0], False
            marks = self.committed()
            committed = {u: w.committed_version for u, w in marks.items()}
            fresh = [
                with_committed(p, marks.get(p.name), source_states.get(p.name)) for p in positions
            ]
            plan = plan_batch(fresh, pipeline_inputs, bootstrap=bootstrap, overwrite=overwrite)
            if not plan.has_work:
                return None, False
            seqs = self._arrow(dt, ["seq"])["seq"]
            seq = max(seqs.to_pylist(), default=0) + 1
            batch_id = batch_id_for(seq)
            plan_id = uuid.uuid4().hex
            now = _now()
            rows = []
            for name, planned in plan.inputs.items():
                rows.append(
                    {
                        "batch_id": batch_id,
                        "seq": seq,
                        "kind": BatchKind.SCHEDULED.value,
                        "plan_id": plan_id,
                        "upstream": name,
                        "read_mode": planned.mode.value,
                        "start_version": planned.range.start if planned.range else None,
                        "end_version": planned.snapshot_version,
                        "committed_version": committed.get(name),
                        "latest_version": None
                        if planned.is_cursor
                        else next(p.latest_version for p in fresh if p.name == name),
                        "table_id": table_ids.get(name),
                        "schema_fingerprint": schema_fingerprints.get(name),
                        "pipelines": json.dumps(list(plan.pipelines)),
                        "status": BatchStatus.PLANNED.value,
                        "advanced_at": None,
                        "created_at": now,
                        "updated_at": now,
                        "actor": actor,
                        "error": None,
                        "full_load": json.dumps(list(plan.full_load)),
                        "order_seq": None,
                        "start_cursor": encode_position(planned.window.start)
                        if planned.window
                        else None,
                        "end_cursor": encode_position(planned.window.end)
                        if planned.window
                        else None,
                        "window_pending": None,
                        "source_state": source_states.get(name),
                    }
                )
            data = pa.Table.from_pylist(rows, schema=schema.BATCHES)
            write_deltalake(dt, data, mode="append", commit_properties=_CAS)
            return self._batches_from_rows(rows)[0], True

        batch, created = self._cas("batches", decide)
        if batch is not None:
            if created:
                fault_point("after_plan_commit")
            self.ensure_plan_recorded(batch, actor=actor)
        return batch, created

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
            },
        )

    def create_replay_batch(
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
        """Record a REPLAY batch that re-reads ``rng`` of ``upstream`` through ``pipelines``.

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
            committed = self.committed_versions().get(upstream)
            if committed is None or rng.end > committed:
                raise BatchStateError(
                    f"Upstream '{upstream}': the replay range {rng} goes beyond the committed "
                    f"watermark {committed}; only applied versions can be replayed.",
                    upstream=upstream,
                    versions=f"range={rng}, committed={committed}",
                    fix=f"replay up to version {committed}, or let the scheduled batches "
                    "apply the newer versions.",
                )
            done = self._batches_from_rows(
                self._rows(dt, pc.field("kind") == BatchKind.SCHEDULED.value)
            )
            covering = [
                b
                for b in done
                if b.status is BatchStatus.COMPLETED
                and upstream in b.inputs
                and b.inputs[upstream].range is not None
                and b.inputs[upstream].range.start <= rng.end <= b.inputs[upstream].range.end  # type: ignore[union-attr]
            ]
            if not covering:
                raise BatchStateError(
                    f"Upstream '{upstream}': no completed batch applied version {rng.end}, so "
                    "there is nothing to pin the other upstreams to.",
                    upstream=upstream,
                    versions=f"range={rng}",
                    fix="list batches with `watermark batches` and pick a range they applied.",
                )
            origin = covering[-1]
            origin_range = origin.inputs[upstream].range
            assert origin_range is not None
            # Rows the origin batch wrote may hold changes after the replay's end when the
            # range stops inside the origin's: the replay then ranks just below it.
            order_seq = origin.seq if rng.end == origin_range.end else origin.seq - 1
            seq = max(self._arrow(dt, ["seq"])["seq"].to_pylist(), default=0) + 1
            batch_id = batch_id_for(seq)
            plan_id = uuid.uuid4().hex
            now = _now()
            rows = []
            for name in sorted(set(all_upstreams) | {upstream}):
                base = {
                    "batch_id": batch_id,
                    "seq": seq,
                    "kind": BatchKind.REPLAY.value,
                    "plan_id": plan_id,
                    "upstream": name,
                    "committed_version": self.committed_versions().get(name),
                    "latest_version": None,
                    "table_id": origin.table_ids.get(name),
                    "schema_fingerprint": origin.schema_fingerprints.get(name),
                    "pipelines": json.dumps(sorted(pipelines)),
                    "status": BatchStatus.PLANNED.value,
                    "created_at": now,
                    "updated_at": now,
                    "actor": actor,
                    "error": reason,
                    "full_load": "[]",
                    "order_seq": order_seq,
                }
                if name == upstream:
                    base.update(
                        read_mode=mode.value,
                        start_version=rng.start,
                        end_version=rng.end,
                    )
                else:
                    pinned = origin.inputs.get(name)
                    if pinned is None:
                        continue
                    if pinned.window is not None:
                        end = encode_position(pinned.window.end)
                        base.update(read_mode=ReadMode.NOOP.value, start_cursor=end, end_cursor=end)
                    else:
                        base.update(
                            read_mode=ReadMode.NOOP.value, end_version=pinned.snapshot_version
                        )
                rows.append(base)
            data = pa.Table.from_pylist(rows, schema=schema.BATCHES)
            write_deltalake(dt, data, mode="append", commit_properties=_CAS)
            return self._batches_from_rows(data.to_pylist())[0]

        batch = self._cas("batches", decide)
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

    def _update_batch_rows(
        self, dt: DeltaTable, rows: list[dict[str, Any]], updates: Mapping[str, str]
    ) -> None:
        source = pa.Table.from_pylist(rows, schema=schema.BATCHES)
        (
            dt.merge(
                source,
                predicate="t.batch_id = s.batch_id AND t.upstream = s.upstream",
                source_alias="s",
                target_alias="t",
                commit_properties=_CAS,
            )
            .when_matched_update(updates=dict(updates))
            .execute()
        )

    def advance(self, batch: Batch, upstream: str, *, actor: str) -> AdvanceDecision:
        """Move ``upstream``'s committed watermark to the end of its range in ``batch``.

        Safe to repeat: finding the watermark already at the range's end (an earlier
        finalizer died after advancing) only records the batch row.

        Raises:
            WatermarkGapError, WatermarkRegressionError: the move would break I1 or I2.
        """
        planned = batch.inputs[upstream]
        if not planned.reads:
            raise BatchStateError(
                f"Batch {batch.batch_id} reads nothing from upstream '{upstream}' (NOOP).",
                upstream=upstream,
                batch_id=batch.batch_id,
            )
        recheck_at = None
        if planned.window is not None:
            # The window's end is pinned at the first read: take it from the table.
            pinned = self.get_batch(batch.batch_id)
            planned = pinned.inputs[upstream]
            recheck_at = pinned.window_pending.get(upstream)
        window = planned.window
        batch_range = planned.range

        def decide(dt: DeltaTable) -> tuple[AdvanceDecision, str | None, str, bool]:
            rows = self._rows(dt, pc.field("upstream") == upstream)
            row = rows[0] if rows else None
            set_here = (
                row is not None
                and row["batch_id"] == batch.batch_id
                and row["how"] == WatermarkHow.AUTO.value
            )
            if window is not None:
                current_pos = decode_position(row["committed_cursor"]) if row else None
                decision = decide_cursor_advance(upstream, current_pos, window, batch.batch_id)
                if decision is AdvanceDecision.ADVANCE:
                    self._require_open(batch.batch_id, upstream)
                new_value = encode_position(window.end) or ""
                old_value = encode_position(current_pos)
                # A window that left rows behind (held back by the lag) records when they
                # pass it, so a plan reads again then even if the source does not change.
                state = cursor_state(batch.source_states.get(upstream), recheck_at)
                if decision is AdvanceDecision.ADVANCE:
                    self._upsert_watermark(
                        dt,
                        upstream,
                        None,
                        batch.batch_id,
                        WatermarkHow.AUTO,
                        actor,
                        cursor=new_value,
                        source_state=state,
                    )
                return decision, old_value, new_value, set_here
            assert batch_range is not None
            current = row["committed_version"] if row else None
            decision = decide_advance(upstream, current, batch_range, batch.batch_id)
            if decision is AdvanceDecision.ADVANCE:
                self._require_open(batch.batch_id, upstream)
                self._upsert_watermark(
                    dt,
                    upstream,
                    batch_range.end,
                    batch.batch_id,
                    WatermarkHow.AUTO,
                    actor,
                    table_id=batch.table_ids.get(upstream),
                )
            old = None if current is None else str(current)
            return decision, old, str(batch_range.end), set_here

        decision, old, new, set_here = self._cas("committed_watermarks", decide)
        detail: dict[str, Any] = {"read": planned.describe()}
        if decision is AdvanceDecision.ADVANCE:
            fault_point("after_watermark_commit")
        elif set_here:
            # An earlier finalizer advanced and died before its history row: write it now,
            # with the value the batch started from.
            detail["recorded_after_restart"] = True
            if window is not None:
                old = encode_position(window.start)
            else:
                assert batch_range is not None
                old = str(batch_range.start - 1) if batch_range.start > 0 else None
        if decision is AdvanceDecision.ADVANCE or set_here:
            self.record_once(
                "WATERMARK_ADVANCED",
                actor=actor,
                batch_id=batch.batch_id,
                upstream=upstream,
                old_value=old,
                new_value=new,
                detail=detail,
            )

        def mark(dt: DeltaTable) -> None:
            rows = self._rows(
                dt, (pc.field("batch_id") == batch.batch_id) & (pc.field("upstream") == upstream)
            )
            if not rows or rows[0]["advanced_at"] is not None:
                return
            now = _now()
            rows[0].update(advanced_at=now, updated_at=now)
            self._update_batch_rows(
                dt, rows, {"advanced_at": "s.advanced_at", "updated_at": "s.updated_at"}
            )

        self._cas("batches", mark)
        return decision

    def _require_open(self, batch_id: str, upstream: str) -> None:
        """Refuse to advance for a batch that ended (abandoned by `watermark set --force`
        after a finalizer read it)."""
        status = self.get_batch(batch_id).status
        if status is not BatchStatus.PLANNED:
            raise BatchStateError(
                f"Batch {batch_id} is {status.value}; upstream '{upstream}' is not advanced "
                "for it.",
                batch_id=batch_id,
                upstream=upstream,
            )

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
            recheck_at: when rows held back by the lag pass it (µs since the epoch);
                recorded so a plan reads again then, even if the source does not change.
        """

        def decide(dt: DeltaTable) -> CursorWindow:
            rows = self._rows(
                dt, (pc.field("batch_id") == batch_id) & (pc.field("upstream") == upstream)
            )
            if not rows:
                raise BatchStateError(
                    f"Batch {batch_id} has no row for upstream '{upstream}'.",
                    batch_id=batch_id,
                    upstream=upstream,
                )
            row = rows[0]
            start = decode_position(row["start_cursor"])
            if row["end_cursor"] is not None:
                return CursorWindow(start, decode_position(row["end_cursor"]))
            # No row at all: the window is empty; () is the position before every row.
            final = end if end is not None else (start if start is not None else ())
            row.update(
                end_cursor=encode_position(final),
                window_pending=recheck_at,
                updated_at=_now(),
            )
            self._update_batch_rows(
                dt,
                [row],
                {
                    "end_cursor": "s.end_cursor",
                    "window_pending": "s.window_pending",
                    "updated_at": "s.updated_at",
                },
            )
            return CursorWindow(start, final)

        return self._cas("batches", decide)

    def set_batch_status(
        self, batch_id: str, status: BatchStatus, *, actor: str, error: str | None = None
    ) -> bool:
        """Give every row of a batch ``status``; returns False when it already had it.

        Completing requires every ranged upstream to have been advanced.
        """

        def decide(dt: DeltaTable) -> bool:
            rows = self._rows(dt, pc.field("batch_id") == batch_id)
            if not rows:
                raise BatchStateError(f"No batch '{batch_id}' to mark {status}.", batch_id=batch_id)
            if all(r["status"] == status.value for r in rows):
                return False
            current = self._batches_from_rows(rows)[0].status
            if current in (BatchStatus.COMPLETED, BatchStatus.ABANDONED):
                # A batch ends once: a finalizer and a `watermark set --force` that both
                # saw it open cannot both end it.
                raise BatchStateError(
                    f"Batch {batch_id} is already {current.value}; it cannot become "
                    f"{status.value}.",
                    batch_id=batch_id,
                    fix="list it with `watermark batch` and act on the next batch.",
                )
            if status is BatchStatus.COMPLETED and rows[0]["kind"] == BatchKind.SCHEDULED.value:
                pending = [
                    r["upstream"]
                    for r in rows
                    if r["read_mode"] != ReadMode.NOOP.value and r["advanced_at"] is None
                ]
                if pending:
                    raise BatchStateError(
                        f"Batch {batch_id} cannot complete: upstream(s) {pending} not advanced.",
                        batch_id=batch_id,
                    )
            now = _now()
            for r in rows:
                r.update(status=status.value, updated_at=now, error=error)
            self._update_batch_rows(
                dt,
                rows,
                {"status": "s.status", "updated_at": "s.updated_at", "error": "s.error"},
            )
            return True

        changed = self._cas("batches", decide)
        if changed:
            self.record(
                f"BATCH_{status.value}",
                actor=actor,
                batch_id=batch_id,
                detail={"error": error} if error else None,
            )
        return changed

    # ---------------------------------------------------------------- watermarks

    def _upsert_watermark(
        self,
        dt: DeltaTable,
        upstream: str,
        version: int | None,
        batch_id: str | None,
        how: WatermarkHow,
        actor: str,
        *,
        cursor: str | None = None,
        table_id: str | None = None,
        source_state: str | None = None,
        pending_history: str | None = None,
    ) -> None:
        """Insert or replace one upstream's watermark row. A ``pending_history`` already on
        the row is kept unless this change brings its own (see flush_pending_history)."""
        row = {
            "upstream": upstream,
            "committed_version": version,
            "batch_id": batch_id,
            "how": how.value,
            "updated_at": _now(),
            "actor": actor,
            "committed_cursor": cursor,
            "table_id": table_id,
            "source_state": source_state,
            "pending_history": pending_history,
        }
        source = pa.Table.from_pylist([row], schema=schema.COMMITTED_WATERMARKS)
        columns = [c for c in row if pending_history is not None or c != "pending_history"]
        (
            dt.merge(
                source,
                predicate="t.upstream = s.upstream",
                source_alias="s",
                target_alias="t",
                commit_properties=_CAS,
            )
            .when_matched_update({c: f"s.{c}" for c in columns})
            .when_not_matched_insert_all()
            .execute()
        )

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
            todo = {u: p for u, p in points.items() if u not in have}
            if not todo:
                return []
            now = _now()
            rows = [
                {
                    "upstream": u,
                    "committed_version": version,
                    "batch_id": None,
                    "how": WatermarkHow.START_FROM.value,
                    "updated_at": now,
                    "actor": actor,
                    "committed_cursor": encode_position(cursor),
                    "table_id": table_ids.get(u),
                    "source_state": None,
                    "pending_history": self._pending_row(
                        "WATERMARK_STARTED",
                        actor,
                        upstream=u,
                        new_value=str(version) if cursor is None else encode_position(cursor),
                        detail={"why": why},
                    ),
                }
                for u, (version, cursor, why) in sorted(todo.items())
            ]
            data = pa.Table.from_pylist(rows, schema=schema.COMMITTED_WATERMARKS)
            write_deltalake(dt, data, mode="append", commit_properties=_CAS)
            return sorted(todo)

        done = self._cas("committed_watermarks", decide)
        if done:
            self.flush_pending_history(done)
        return done

    def committed(self) -> dict[str, Watermark]:
        """Every upstream's committed watermark row."""
        return {
            r["upstream"]: Watermark(
                upstream=r["upstream"],
                committed_version=r["committed_version"],
                batch_id=r["batch_id"],
                how=WatermarkHow(r["how"]),
                updated_at=r["updated_at"],
                actor=r["actor"],
                committed_cursor=decode_position(r["committed_cursor"]),
                table_id=r["table_id"],
                source_state=r["source_state"],
                pending_history=r["pending_history"],
            )
            for r in self._rows(self._load("committed_watermarks"))
        }

    def committed_versions(self) -> dict[str, int | None]:
        """upstream -> committed version (None: reset, nothing committed)."""
        return {u: w.committed_version for u, w in self.committed().items()}

    def _batch_reading(self, upstream: str) -> Batch | None:
        """The open scheduled batch, if it reads ``upstream`` (a range, not NOOP)."""
        batch = self.open_batch()
        planned = batch.inputs.get(upstream) if batch is not None else None
        if planned is None or planned.mode is ReadMode.NOOP:
            return None
        return batch

    @staticmethod
    def _check_manual(upstream: str, version: int | None, how: WatermarkHow) -> None:
        if how is WatermarkHow.RESET and version is not None:
            raise ValueError(f"{upstream}: a RESET stores no version, got {version}")
        if how is WatermarkHow.MANUAL_SET and (not isinstance(version, int) or version < 0):
            raise ValueError(f"{upstream}: a MANUAL_SET needs a version >= 0, got {version!r}")
        if how not in (WatermarkHow.MANUAL_SET, WatermarkHow.RESET):
            raise ValueError(f"{upstream}: a manual change is MANUAL_SET or RESET, not {how}")

    def preview_watermark(
        self, upstream: str, version: int | None, *, how: WatermarkHow
    ) -> WatermarkChange:
        """What :meth:`set_watermark` would change now; writes nothing."""
        self._check_manual(upstream, version, how)
        rows = self._rows(self._load("committed_watermarks"), pc.field("upstream") == upstream)
        row = rows[0] if rows else {}
        reading = self._batch_reading(upstream)
        return WatermarkChange(
            upstream=upstream,
            old=row.get("committed_version"),
            new=version,
            how=how,
            old_cursor=row.get("committed_cursor"),
            open_batch=reading.batch_id if reading else None,
        )

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
            expected: the preview the operator confirmed; refused if the committed value or
                the open batch moved since.
            detail: extra facts for the history row (e.g. how a timestamp was resolved).

        Raises:
            BatchStateError: an open batch reads the upstream and ``force`` is False.
            TerminalError: the state moved since ``expected`` was previewed.
        """
        self.flush_pending_history()  # a change whose process died before recording it
        preview = self.preview_watermark(upstream, version, how=how)
        if expected is not None and (preview.old, preview.old_cursor, preview.open_batch) != (
            expected.old,
            expected.old_cursor,
            expected.open_batch,
        ):
            raise TerminalError(
                f"Upstream '{upstream}' moved while the change was being confirmed: committed "
                f"{expected.old} -> {preview.old}, open batch {expected.open_batch} -> "
                f"{preview.open_batch}. Nothing was changed.",
                upstream=upstream,
                fix="run the command again to see the current state.",
            )
        if not preview.changed:
            return preview
        if preview.open_batch is not None and not force:
            reading = self.get_batch(preview.open_batch).inputs[upstream]
            raise BatchStateError(
                f"Batch {preview.open_batch} is open and reads upstream '{upstream}' "
                f"({reading.describe()}); "
                "moving the watermark now would break it. Nothing was changed.",
                upstream=upstream,
                batch_id=preview.open_batch,
                fix=f"wait until it completes (`watermark batch {preview.open_batch}`), or "
                "pass --force to abandon it so the next plan starts from the new value.",
            )
        why = f"manual {how.value} of '{upstream}' from {preview.old} to {version}"
        if reason:
            why += f": {reason}"
        abandoned: list[str] = []
        if preview.open_batch is not None:
            try:
                self.set_batch_status(
                    preview.open_batch,
                    BatchStatus.ABANDONED,
                    actor=actor,
                    error=f"abandoned by {why}",
                )
            except BatchStateError:
                # A finalizer completed it meanwhile: nothing to abandon. The watermark
                # check below refuses if that moved this upstream.
                pass
            else:
                abandoned.append(preview.open_batch)
            fault_point("after_abandon")

        event = "WATERMARK_SET" if how is WatermarkHow.MANUAL_SET else "WATERMARK_RESET"
        details = {"reason": reason, "how": how.value, "abandoned": abandoned, **(detail or {})}

        def decide(dt: DeltaTable) -> tuple[dict[str, Any], str]:
            rows = self._rows(dt, pc.field("upstream") == upstream)
            row = rows[0] if rows else {}
            old, old_cursor = row.get("committed_version"), row.get("committed_cursor")
            # The history row is committed with the watermark and recorded just after.
            pending = self._pending_row(
                event,
                actor,
                upstream=upstream,
                old_value=old_cursor if old is None and old_cursor else _text(old),
                new_value=_text(version),
                detail=details,
            )
            # A manual set keeps the table identity the watermark refers to; a reset
            # forgets it, so a recreated table is loaded afresh.
            table_id = row.get("table_id") if how is WatermarkHow.MANUAL_SET else None
            self._upsert_watermark(
                dt, upstream, version, None, how, actor, table_id=table_id, pending_history=pending
            )
            return row, pending

        old_row, pending = self._cas("committed_watermarks", decide)
        fault_point("after_manual_watermark_commit")
        old, old_cursor = old_row.get("committed_version"), old_row.get("committed_cursor")
        self._flush_one(upstream, pending)
        stale = self._batch_reading(upstream)
        first = 0 if version is None else version + 1
        stale_range = stale.inputs[upstream].range if stale is not None else None
        if stale is not None and stale_range is not None and stale_range.start != first:
            self.set_batch_status(
                stale.batch_id,
                BatchStatus.ABANDONED,
                actor=actor,
                error=f"planned from the watermark before the {why}",
            )
            abandoned.append(stale.batch_id)
        return WatermarkChange(
            upstream=upstream,
            old=old,
            new=version,
            how=how,
            old_cursor=old_cursor,
            open_batch=preview.open_batch,
            abandoned=tuple(abandoned),
            applied=True,
        )

    # ---------------------------------------------------------------- checkpoints

    def begin_checkpoint(self, pipeline: str, batch_id: str, *, run_id: str | None) -> int:
        """Record a RUNNING attempt of ``pipeline`` on ``batch_id``; returns the attempt number."""

        def decide(dt: DeltaTable) -> int:
            rows = self._rows(
                dt, (pc.field("pipeline") == pipeline) & (pc.field("batch_id") == batch_id)
            )
            attempt = 1 + max((r["attempt"] for r in rows), default=0)
            row = {
                "pipeline": pipeline,
                "batch_id": batch_id,
                "attempt": attempt,
                "status": CheckpointStatus.RUNNING.value,
                "rows_read": None,
                "rows_written": None,
                "run_id": run_id,
                "started_at": _now(),
                "finished_at": None,
                "error": None,
            }
            data = pa.Table.from_pylist([row], schema=schema.PIPELINE_CHECKPOINTS)
            write_deltalake(dt, data, mode="append", commit_properties=_CAS)
            return attempt

        return self._cas("pipeline_checkpoints", decide)

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
                (pc.field("pipeline") == pipeline)
                & (pc.field("batch_id") == batch_id)
                & (pc.field("attempt") == attempt),
            )
            if not rows:
                raise BatchStateError(
                    f"No checkpoint for pipeline '{pipeline}', batch {batch_id}, "
                    f"attempt {attempt}.",
                    pipeline=pipeline,
                    batch_id=batch_id,
                )
            row = rows[0]
            row.update(
                status=status.value,
                rows_read=rows_read,
                rows_written=rows_written,
                finished_at=_now(),
                error=error,
            )
            source = pa.Table.from_pylist([row], schema=schema.PIPELINE_CHECKPOINTS)
            (
                dt.merge(
                    source,
                    predicate=(
                        "t.pipeline = s.pipeline AND t.batch_id = s.batch_id "
                        "AND t.attempt = s.attempt"
                    ),
                    source_alias="s",
                    target_alias="t",
                    commit_properties=_CAS,
                )
                .when_matched_update_all()
                .execute()
            )

        self._cas("pipeline_checkpoints", decide)

    def checkpoints(
        self, *, batch_id: str | None = None, pipeline: str | None = None
    ) -> list[Checkpoint]:
        """Checkpoint rows, optionally for one batch and/or one pipeline, oldest first."""
        filter_: pc.Expression | None = None
        for column, value in (("batch_id", batch_id), ("pipeline", pipeline)):
            if value is not None:
                term = pc.field(column) == value
                filter_ = term if filter_ is None else filter_ & term
        rows = self._rows(self._load("pipeline_checkpoints"), filter_)
        found = [
            Checkpoint(
                pipeline=r["pipeline"],
                batch_id=r["batch_id"],
                attempt=r["attempt"],
                status=CheckpointStatus(r["status"]),
                rows_read=r["rows_read"],
                rows_written=r["rows_written"],
                run_id=r["run_id"],
                started_at=r["started_at"],
                finished_at=r["finished_at"],
                error=r["error"],
            )
            for r in rows
        ]
        return sorted(found, key=lambda c: (c.batch_id, c.pipeline, c.attempt))

    # ---------------------------------------------------------------- upkeep

    def maintain(self, *, vacuum_retention_hours: int = 168) -> dict[str, int]:
        """Compact each control table's small files, checkpoint its log and vacuum files
        older than the retention (7 days by default, Delta's own minimum).

        Every state change adds a small file; without this, reads slow down as history
        grows. Safe while other writers run: their compare-and-swap retries absorb it.

        Returns:
            table -> files removed by compaction.
        """
        removed: dict[str, int] = {}
        for name in schema.TABLES:
            dt = self._load(name)
            metrics = dt.optimize.compact()
            removed[name] = int(metrics.get("numFilesRemoved", 0))
            dt = self._load(name)
            dt.create_checkpoint()
            dt.vacuum(retention_hours=vacuum_retention_hours, dry_run=False)
        return removed

    def newest_success(self, pipeline: str) -> str | None:
        """Id of the newest batch ``pipeline`` succeeded on (None before its first)."""
        ids = self._succeeded_batch_ids(pipeline)
        return max(ids, key=seq_of) if ids else None

    def _succeeded_batch_ids(self, pipeline: str) -> set[str]:
        rows = self._rows(
            self._load("pipeline_checkpoints"),
            (pc.field("pipeline") == pipeline)
            & (pc.field("status") == CheckpointStatus.SUCCESS.value),
        )
        return {r["batch_id"] for r in rows}

    def newest_applied(self, pipeline: str) -> Batch | None:
        """The SCHEDULED batch with the highest sequence ``pipeline`` succeeded on: what its
        target is known to hold (replays write at older positions and do not count)."""
        ids = self._succeeded_batch_ids(pipeline)
        if not ids:
            return None
        rows = self._rows(
            self._load("batches"),
            pc.field("batch_id").isin(sorted(ids))
            & (pc.field("kind") == BatchKind.SCHEDULED.value),
        )
        found = self._batches_from_rows(rows)
        return found[-1] if found else None

    # ---------------------------------------------------------------- history

    def history(
        self, *, upstream: str | None = None, batch_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Audit rows, oldest first, optionally for one upstream or batch."""
        filter_: pc.Expression | None = None
        for column, value in (("upstream", upstream), ("batch_id", batch_id)):
            if value is not None:
                term = pc.field(column) == value
                filter_ = term if filter_ is None else filter_ & term
        rows = self._rows(self._load("history"), filter_)
        return sorted(rows, key=lambda r: r["at"])


__all__ = ["WatermarkStore"]
