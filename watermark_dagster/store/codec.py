"""Rows of the control tables <-> the records of :mod:`watermark_dagster.core.records`.

The only place a control-table row is built or parsed: the store decides with records
and hands rows to :mod:`watermark_dagster.store.tables`. Lists and mappings are stored as
JSON text, cursor positions as encoded positions, enums by value.
"""

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from watermark_dagster.core.finalizing import batch_status
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import (
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
    WatermarkHow,
    batch_id_for,
)

Row = dict[str, Any]


def now() -> datetime:
    """The time recorded in ``updated_at``, ``created_at`` and ``at`` columns."""
    return datetime.now(UTC)


# ---------------------------------------------------------------- batches


def planned_input(row: Mapping[str, Any]) -> PlannedInput:
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


def row_statuses(rows: Iterable[Row]) -> set[BatchStatus]:
    """The statuses the rows of one batch hold."""
    return {BatchStatus(r["status"]) for r in rows}


def batches(rows: Iterable[Row]) -> list[Batch]:
    """``batches`` rows (one per batch and upstream) as batches, oldest first."""
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        grouped.setdefault(row["batch_id"], []).append(row)
    found = []
    for batch_id, group in grouped.items():
        first = group[0]
        found.append(
            Batch(
                batch_id=batch_id,
                seq=first["seq"],
                kind=BatchKind(first["kind"]),
                plan_id=first["plan_id"],
                status=batch_status(row_statuses(group)),
                pipelines=tuple(json.loads(first["pipelines"])),
                inputs={r["upstream"]: planned_input(r) for r in group},
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
    return sorted(found, key=lambda b: b.seq)


def batch_rows(
    batch: Batch,
    *,
    committed: Mapping[str, int | None],
    latest: Mapping[str, int | None],
    error: str | None = None,
) -> list[Row]:
    """The ``batches`` rows of a new batch, one per input, in the order of its inputs.

    Args:
        committed: upstream -> committed version when the batch was planned.
        latest: upstream -> newest version observed (absent for cursor upstreams).
        error: recorded with the rows (a replay's reason).
    """
    return [
        {
            "batch_id": batch.batch_id,
            "seq": batch.seq,
            "kind": batch.kind.value,
            "plan_id": batch.plan_id,
            "upstream": name,
            "read_mode": planned.mode.value,
            "start_version": planned.range.start if planned.range else None,
            "end_version": planned.snapshot_version,
            "committed_version": committed.get(name),
            "latest_version": latest.get(name),
            "table_id": batch.table_ids.get(name),
            "schema_fingerprint": batch.schema_fingerprints.get(name),
            "pipelines": json.dumps(list(batch.pipelines)),
            "status": batch.status.value,
            "advanced_at": None,
            "created_at": batch.created_at,
            "updated_at": batch.created_at,
            "actor": batch.actor,
            "error": error,
            "full_load": json.dumps(list(batch.full_load)),
            "order_seq": batch.order_seq,
            "start_cursor": encode_position(planned.window.start) if planned.window else None,
            "end_cursor": encode_position(planned.window.end) if planned.window else None,
            "window_pending": batch.window_pending.get(name),
            "source_state": batch.source_states.get(name),
        }
        for name, planned in batch.inputs.items()
    ]


def new_batch(
    seq: int,
    kind: BatchKind,
    inputs: Mapping[str, PlannedInput],
    *,
    pipelines: Iterable[str],
    actor: str,
    **fields: Any,
) -> Batch:
    """A batch about to be planned (PLANNED, nothing advanced), with a fresh plan id."""
    return Batch(
        batch_id=batch_id_for(seq),
        seq=seq,
        kind=kind,
        plan_id=uuid.uuid4().hex,
        status=BatchStatus.PLANNED,
        pipelines=tuple(pipelines),
        inputs=inputs,
        advanced=frozenset(),
        created_at=now(),
        actor=actor,
        **fields,
    )


def batch_key(batch_id: str, upstream: str | None = None, **changes: Any) -> Row:
    """A partial ``batches`` row: the key of one batch (or one upstream's row of it) and
    the columns to change, stamped with ``updated_at`` unless ``changes`` set it."""
    key: Row = {"batch_id": batch_id}
    if upstream is not None:
        key["upstream"] = upstream
    return {**key, "updated_at": now(), **changes}


# ---------------------------------------------------------------- watermarks


def watermark(row: Mapping[str, Any]) -> Watermark:
    """One ``committed_watermarks`` row as a watermark."""
    return Watermark(
        upstream=row["upstream"],
        committed_version=row["committed_version"],
        batch_id=row["batch_id"],
        how=WatermarkHow(row["how"]),
        updated_at=row["updated_at"],
        actor=row["actor"],
        committed_cursor=decode_position(row["committed_cursor"]),
        table_id=row["table_id"],
        source_state=row["source_state"],
        pending_history=row["pending_history"],
    )


def watermark_or_none(rows: list[Row]) -> Watermark | None:
    """The watermark of the one row an upstream filter found, or None for no row."""
    return watermark(rows[0]) if rows else None


def watermark_row(mark: Watermark) -> Row:
    """``mark`` as a ``committed_watermarks`` row."""
    return {
        "upstream": mark.upstream,
        "committed_version": mark.committed_version,
        "batch_id": mark.batch_id,
        "how": mark.how.value,
        "updated_at": mark.updated_at,
        "actor": mark.actor,
        "committed_cursor": encode_position(mark.committed_cursor),
        "table_id": mark.table_id,
        "source_state": mark.source_state,
        "pending_history": mark.pending_history,
    }


# ---------------------------------------------------------------- checkpoints


def checkpoint(row: Mapping[str, Any]) -> Checkpoint:
    """One ``pipeline_checkpoints`` row as a checkpoint."""
    return Checkpoint(
        pipeline=row["pipeline"],
        batch_id=row["batch_id"],
        attempt=row["attempt"],
        status=CheckpointStatus(row["status"]),
        rows_read=row["rows_read"],
        rows_written=row["rows_written"],
        run_id=row["run_id"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        error=row["error"],
    )


def checkpoint_row(found: Checkpoint) -> Row:
    """``found`` as a ``pipeline_checkpoints`` row."""
    return {
        "pipeline": found.pipeline,
        "batch_id": found.batch_id,
        "attempt": found.attempt,
        "status": found.status.value,
        "rows_read": found.rows_read,
        "rows_written": found.rows_written,
        "run_id": found.run_id,
        "started_at": found.started_at,
        "finished_at": found.finished_at,
        "error": found.error,
    }


# ---------------------------------------------------------------- history


def history_row(event: str, actor: str | None, **fields: Any) -> Row:
    """One ``history`` row; ``detail`` (a mapping) is stored as JSON."""
    detail = fields.pop("detail", None)
    row = {"at": now(), "event": event, "actor": actor, **fields}
    if detail is not None:
        row["detail"] = json.dumps(detail, sort_keys=True, default=str)
    return row


def pending_history(event: str, actor: str | None, **fields: Any) -> str:
    """A history row to store with a watermark change (``pending_history``); its
    ``change_id`` in ``detail`` keys it, so it is recorded once."""
    detail = {**(fields.pop("detail", None) or {}), "change_id": uuid.uuid4().hex}
    row = history_row(event, actor, detail=detail, **fields)
    return json.dumps({**row, "at": row["at"].isoformat()}, sort_keys=True)


def pending_row(pending: str) -> tuple[Row, str]:
    """The ``history`` row a ``pending_history`` value holds, and its change id."""
    row = json.loads(pending)
    row["at"] = datetime.fromisoformat(row["at"])
    return row, json.loads(row["detail"])["change_id"]
