"""Rows of the control tables <-> the records of :mod:`watermark_dagster.core.records`.

The only place a control-table row is built or parsed: the store decides with records
and hands rows to :mod:`watermark_dagster.store.tables`. Lists and mappings are stored as
JSON text, cursor positions as encoded positions, enums by value.
"""

import dataclasses
import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from watermark_dagster.core import records
from watermark_dagster.core.batch_ending import batch_status
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import (
    CursorPosition,
    CursorWindow,
    ReadMode,
    VersionRange,
    decode_position,
    encode_position,
)
from watermark_dagster.core.strategy import Strategy, StrategyRun

Row = dict[str, Any]
R = TypeVar("R")


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


def row_statuses(rows: Iterable[Row]) -> set[records.BatchStatus]:
    """The statuses the rows of one batch hold."""
    return {records.BatchStatus(r["status"]) for r in rows}


def batches(rows: Iterable[Row]) -> list[records.Batch]:
    """``batches`` rows (one per batch and upstream) as batches, oldest first."""
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        grouped.setdefault(row["batch_id"], []).append(row)
    found = []
    for batch_id, group in grouped.items():
        first = group[0]
        found.append(
            records.Batch(
                batch_id=batch_id,
                seq=first["seq"],
                kind=records.BatchKind(first["kind"]),
                plan_id=first["plan_id"],
                status=batch_status(row_statuses(group)),
                pipelines=tuple(json.loads(first["pipelines"])),
                inputs={r["upstream"]: planned_input(r) for r in group},
                advanced=frozenset(r["upstream"] for r in group if r["advanced_at"]),
                created_at=first["created_at"],
                actor=first["actor"],
                full_load=tuple(json.loads(first.get("full_load") or "[]")),
                reloads_owed=tuple(json.loads(first.get("reloads_owed") or "[]")),
                order_seq=first.get("order_seq"),
                table_ids={r["upstream"]: r["table_id"] for r in group},
                schema_fingerprints={r["upstream"]: r["schema_fingerprint"] for r in group},
                source_states={r["upstream"]: r.get("source_state") for r in group},
                window_pending={r["upstream"]: r.get("window_pending") for r in group},
                locations={r["upstream"]: r.get("location") for r in group},
            )
        )
    return sorted(found, key=lambda b: b.seq)


def batch_rows(
    batch: records.Batch,
    *,
    committed: Mapping[str, int | None],
    latest: Mapping[str, int | None],
    error: str | None = None,
) -> list[Row]:
    """The ``batches`` rows of a new batch, one per input, in the order of its inputs.

    Args:
        batch: the new batch, with its planned inputs.
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
            "reloads_owed": json.dumps(list(batch.reloads_owed)),
            "order_seq": batch.order_seq,
            "start_cursor": encode_position(planned.window.start) if planned.window else None,
            "end_cursor": encode_position(planned.window.end) if planned.window else None,
            "window_pending": batch.window_pending.get(name),
            "source_state": batch.source_states.get(name),
            "location": batch.locations.get(name),
        }
        for name, planned in batch.inputs.items()
    ]


def new_batch(
    seq: int,
    kind: records.BatchKind,
    inputs: Mapping[str, PlannedInput],
    *,
    pipelines: Iterable[str],
    actor: str,
    **fields: Any,
) -> records.Batch:
    """A batch about to be planned (PLANNED, nothing advanced), with a fresh plan id."""
    return records.Batch(
        batch_id=records.batch_id_for(seq),
        seq=seq,
        kind=kind,
        plan_id=uuid.uuid4().hex,
        status=records.BatchStatus.PLANNED,
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


def window_end(batch_id: str, upstream: str, end: CursorPosition, *, recheck_at: int | None) -> Row:
    """The change of one cursor row that pins its window's ``end`` (see ``pin_window``)."""
    return batch_key(batch_id, upstream, end_cursor=encode_position(end), window_pending=recheck_at)


# ---------------------------------------------------------------- watermarks


def _record(cls: type[R], row: Mapping[str, Any], **parsed: Any) -> R:
    """A record from the row's columns of the same names; ``parsed`` gives the columns
    stored in another form (enums by value, encoded positions)."""
    fields = {f.name: row[f.name] for f in dataclasses.fields(cls)}  # pyright: ignore[reportArgumentType]
    return cls(**{**fields, **parsed})


def _row(record: Any, **stored: Any) -> Row:
    """A record's fields as a row; ``stored`` gives the columns stored in another form."""
    return {**{f.name: getattr(record, f.name) for f in dataclasses.fields(record)}, **stored}


def watermark(row: Mapping[str, Any]) -> records.Watermark:
    """One ``committed_watermarks`` row as a watermark."""
    return _record(
        records.Watermark,
        row,
        how=records.WatermarkHow(row["how"]),
        committed_cursor=decode_position(row["committed_cursor"]),
    )


def watermark_or_none(rows: list[Row]) -> records.Watermark | None:
    """The watermark of the one row an upstream filter found, or None for no row."""
    return watermark(rows[0]) if rows else None


def watermark_row(mark: records.Watermark) -> Row:
    """``mark`` as a ``committed_watermarks`` row."""
    return _row(mark, how=mark.how.value, committed_cursor=encode_position(mark.committed_cursor))


# ---------------------------------------------------------------- checkpoints


def checkpoint(row: Mapping[str, Any]) -> records.Checkpoint:
    """One ``pipeline_checkpoints`` row as a checkpoint."""
    return _record(records.Checkpoint, row, status=records.CheckpointStatus(row["status"]))


def checkpoint_row(found: records.Checkpoint) -> Row:
    """``found`` as a ``pipeline_checkpoints`` row."""
    return _row(found, status=found.status.value)


# ---------------------------------------------------------------- history


def history_row(event: str, actor: str | None, **fields: Any) -> Row:
    """One ``history`` row; ``detail`` (a mapping) is stored as JSON."""
    detail = fields.pop("detail", None)
    row = {"at": now(), "event": event, "actor": actor, **fields}
    if detail is not None:
        row["detail"] = json.dumps(detail, sort_keys=True, default=str)
    return row


def _recorded_strategy(row: Row) -> tuple[Strategy, dict[str, Any]] | None:
    """The strategy a ``PIPELINE_SUCCEEDED`` history row records, with what it records
    of it, or None when it records none."""
    detail = json.loads(row.get("detail") or "{}")
    recorded = detail.get("strategy") if isinstance(detail, dict) else None
    if not isinstance(recorded, dict):
        return None
    try:
        strategy = Strategy(recorded["strategy"])
    except (KeyError, TypeError, ValueError):
        return None
    return None if strategy is Strategy.AUTO else (strategy, recorded)


def strategy_written(row: Row) -> Strategy | None:
    """The strategy that wrote the batch, as a ``PIPELINE_SUCCEEDED`` history row records
    it, measured or not (a retry whose write Delta skipped records the rewrite its commit
    shows, without seconds); None when it records none."""
    found = _recorded_strategy(row)
    return None if found is None else found[0]


def strategy_run(row: Row) -> StrategyRun | None:
    """The measured strategy a ``PIPELINE_SUCCEEDED`` history row records (see
    ``StrategyChoice.measured``), or None when it records none (a hand-written pipeline, a
    full load, a replay, a retry's skipped write, a row from before strategies were
    recorded)."""
    found = _recorded_strategy(row)
    if found is None:
        return None
    strategy, measured = found
    try:
        seconds = float(measured["seconds"])
    except (KeyError, TypeError, ValueError):
        return None

    def size(name: str) -> int | None:
        value = measured.get(name)
        return value if isinstance(value, int) else None

    return StrategyRun(
        batch_id=str(row.get("batch_id")),
        strategy=strategy,
        seconds=seconds,
        changed_bytes=size("changed_bytes"),
        snapshot_bytes=size("snapshot_bytes"),
        switched=measured.get("switched") is True,
        rebuilt=measured.get("rebuilt") is True,
    )


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
