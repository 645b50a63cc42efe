"""Finalizing decisions: what a batch's end may change, in plain Python (no Dagster,
Spark or delta-rs).

The store applies these answers inside its compare-and-swap; the finalizer and the
command line call the same functions, so each rule has one definition:

* advancing a committed watermark (I1, I2) and which upstreams may advance (I4);
* how a batch ends: the status its rows add up to, and which status changes are allowed;
* manual moves of a watermark (``watermark set`` / ``reset``): the open-batch refusal and
  which batches such a move abandons.
"""

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from watermark_dagster.core.planning import PlannedInput, cursor_state
from watermark_dagster.core.ranges import (
    CursorPosition,
    CursorWindow,
    ReadMode,
    VersionRange,
    encode_position,
)
from watermark_dagster.core.records import (
    Batch,
    BatchKind,
    BatchStatus,
    Watermark,
    WatermarkChange,
    WatermarkHow,
    version_text,
)
from watermark_dagster.errors import (
    BatchStateError,
    TerminalError,
    WatermarkGapError,
    WatermarkRegressionError,
)

# ---------------------------------------------------------------- advancing a watermark


class AdvanceDecision(StrEnum):
    """What the finalizer should do with one upstream's committed watermark."""

    ADVANCE = "ADVANCE"
    ALREADY_DONE = "ALREADY_DONE"


def decide_advance(
    upstream: str, committed: int | None, batch_range: VersionRange, batch_id: str
) -> AdvanceDecision:
    """Check that moving ``upstream`` to the end of ``batch_range`` keeps I1 and I2.

    The watermark may only move from ``start - 1`` to ``end``. Finding it already at
    ``end`` means an earlier finalizer advanced it and died before recording the batch:
    the step is done, nothing to repeat.

    Raises:
        WatermarkGapError: the watermark is below ``start - 1``; advancing would skip versions.
        WatermarkRegressionError: the watermark is already past the range (moved by hand).
    """
    current = -1 if committed is None else committed
    if current == batch_range.end:
        return AdvanceDecision.ALREADY_DONE
    if current == batch_range.start - 1:
        return AdvanceDecision.ADVANCE
    versions = f"committed={committed}, batch range={batch_range}"
    if current < batch_range.start - 1:
        raise WatermarkGapError(
            f"Upstream '{upstream}': batch {batch_id} covers {batch_range} but the committed "
            f"watermark is {committed}; advancing would skip versions "
            f"{current + 1}..{batch_range.start - 1}.",
            upstream=upstream,
            batch_id=batch_id,
            versions=versions,
            fix=f"abandon batch {batch_id} so the next plan starts at {current + 1}.",
        )
    raise WatermarkRegressionError(
        f"Upstream '{upstream}': the committed watermark {committed} is already past batch "
        f"{batch_id}'s range {batch_range}; advancing would move it backwards.",
        upstream=upstream,
        batch_id=batch_id,
        versions=versions,
        fix=f"abandon batch {batch_id}; the watermark was moved by hand while it was open.",
    )


def decide_cursor_advance(
    upstream: str,
    committed: CursorPosition | None,
    window: CursorWindow,
    batch_id: str,
) -> AdvanceDecision:
    """The cursor-upstream twin of :func:`decide_advance`: the committed position may only
    move from the window's start to its end.

    An empty window (its end pinned at its start: the source changed but held no row past
    the committed position, e.g. a late row, a delete or an OPTIMIZE) still ADVANCEs: the
    position stays, but the source state it was read at is recorded with it, so the next
    plan does not see the same change as new again and plan empty batches forever.

    Raises:
        BatchStateError: the window's end was never pinned (no pipeline read it).
        WatermarkGapError, WatermarkRegressionError: the committed position is neither the
            window's start nor its end (it was moved by hand while the batch was open).
    """
    if window.end is None:
        raise BatchStateError(
            f"Upstream '{upstream}': batch {batch_id} never pinned its window's end.",
            upstream=upstream,
            batch_id=batch_id,
            fix="run the batch's pipelines before finalizing it.",
        )
    if committed == window.start:
        return AdvanceDecision.ADVANCE
    if committed == window.end:
        return AdvanceDecision.ALREADY_DONE
    raise WatermarkGapError(
        f"Upstream '{upstream}': batch {batch_id} covers the window {window} but the committed "
        f"position is {committed}; advancing would skip or re-read rows.",
        upstream=upstream,
        batch_id=batch_id,
        versions=f"committed={committed}, window={window}",
        fix=f"abandon batch {batch_id} so the next plan starts at the committed position.",
    )


@dataclass(frozen=True)
class FinalizeStep:
    """The finalizer's decision for one open batch."""

    advance: tuple[str, ...] = ()
    waiting: Mapping[str, tuple[str, ...]] = field(default_factory=dict[str, tuple[str, ...]])

    @property
    def complete(self) -> bool:
        """True when no upstream is still waiting for a consumer."""
        return not self.waiting


def finalize_step(
    inputs: Mapping[str, PlannedInput],
    already_advanced: Iterable[str],
    consumers: Mapping[str, Iterable[str]],
    batch_pipelines: Iterable[str],
    succeeded: Iterable[str],
) -> FinalizeStep:
    """Decide which upstreams of an open batch can advance now.

    An upstream advances once every pipeline of the batch that reads it (its consumers in
    the asset graph) has succeeded for the batch. NOOP inputs have nothing to advance.

    Args:
        inputs: the batch's planned inputs per upstream.
        already_advanced: upstreams whose watermark this batch already advanced.
        consumers: upstream -> pipelines that read it, from the asset graph.
        batch_pipelines: the pipelines the batch planned to run.
        succeeded: pipelines that materialized the batch successfully.
    """
    done = set(already_advanced)
    planned = set(batch_pipelines)
    ok = set(succeeded)
    advance: list[str] = []
    waiting: dict[str, tuple[str, ...]] = {}
    for name, planned_input in sorted(inputs.items()):
        if planned_input.mode is ReadMode.NOOP or name in done:
            continue
        pending = sorted((set(consumers.get(name, ())) & planned) - ok)
        if pending:
            waiting[name] = tuple(pending)
        else:
            advance.append(name)
    return FinalizeStep(advance=tuple(advance), waiting=waiting)


@dataclass(frozen=True)
class AdvanceStep:
    """What advancing one upstream for one batch does, decided against its committed row.

    Attributes:
        decision: ADVANCE (move the watermark now) or ALREADY_DONE (it is at the end).
        old_value: the value before, as recorded in ``history``.
        new_value: the value after, as recorded in ``history``.
        recorded_after_restart: this batch moved the watermark earlier and its process
            died before the history row; ``old_value`` is then where the batch started.
    """

    decision: AdvanceDecision
    old_value: str | None
    new_value: str
    recorded_after_restart: bool = False

    @property
    def records_history(self) -> bool:
        """True when a WATERMARK_ADVANCED row is due (written once, keyed by batch)."""
        return self.decision is AdvanceDecision.ADVANCE or self.recorded_after_restart


def decide_advance_step(
    batch_id: str, planned: PlannedInput, current: Watermark | None
) -> AdvanceStep:
    """Decide the advance of ``planned.upstream`` for ``batch_id`` from its committed row.

    Args:
        batch_id: the batch being finalized.
        planned: what the batch read from the upstream (a cursor window must be pinned).
        current: the upstream's committed watermark row (None: no row yet).

    Raises:
        WatermarkGapError, WatermarkRegressionError, BatchStateError: as
            :func:`decide_advance` and :func:`decide_cursor_advance`.
    """
    upstream = planned.upstream
    if not planned.reads:
        raise BatchStateError(
            f"Batch {batch_id} reads nothing from upstream '{upstream}' (NOOP).",
            upstream=upstream,
            batch_id=batch_id,
        )
    if planned.window is not None:
        position = current.committed_cursor if current is not None else None
        window = planned.window
        decision = decide_cursor_advance(upstream, position, window, batch_id)
        old, new = encode_position(position), encode_position(window.end) or ""
        started_at = encode_position(window.start)
    else:
        rng = planned.range
        assert rng is not None  # a versioned input that reads has a range
        version = current.committed_version if current is not None else None
        decision = decide_advance(upstream, version, rng, batch_id)
        old, new = version_text(version), str(rng.end)
        started_at = version_text(rng.start - 1 if rng.start > 0 else None)
    set_here = (
        current is not None and current.batch_id == batch_id and current.how is WatermarkHow.AUTO
    )
    if decision is AdvanceDecision.ALREADY_DONE and set_here:
        return AdvanceStep(decision, started_at, new, recorded_after_restart=True)
    return AdvanceStep(decision, old, new)


def advanced_watermark(
    batch: Batch,
    planned: PlannedInput,
    *,
    recheck_at: int | None,
    actor: str,
    now: datetime,
) -> Watermark:
    """The committed row of ``planned.upstream`` once ``batch`` advanced it.

    A versioned upstream moves to its range's end and keeps the table identity the batch
    read. A cursor upstream moves to its window's end with the source state it was read
    at; a window that left rows behind (held back by the lag) records when they pass it
    (``recheck_at``), so a plan reads again then even if the source does not change.
    """
    upstream = planned.upstream
    if planned.window is not None:
        return Watermark(
            upstream=upstream,
            committed_version=None,
            batch_id=batch.batch_id,
            how=WatermarkHow.AUTO,
            updated_at=now,
            actor=actor,
            committed_cursor=planned.window.end,
            source_state=cursor_state(batch.source_states.get(upstream), recheck_at),
        )
    assert planned.range is not None
    return Watermark(
        upstream=upstream,
        committed_version=planned.range.end,
        batch_id=batch.batch_id,
        how=WatermarkHow.AUTO,
        updated_at=now,
        actor=actor,
        table_id=batch.table_ids.get(upstream),
    )


def require_open(batch: Batch, upstream: str) -> None:
    """Refuse to advance for a batch that ended (abandoned by `watermark set --force`
    after a finalizer read it).

    Raises:
        BatchStateError: ``batch`` is no longer PLANNED.
    """
    if batch.status is not BatchStatus.PLANNED:
        raise BatchStateError(
            f"Batch {batch.batch_id} is {batch.status.value}; upstream '{upstream}' is not "
            "advanced for it.",
            batch_id=batch.batch_id,
            upstream=upstream,
        )


# ---------------------------------------------------------------- how a batch ends

# Rows of a batch change status together; a mix means a write was cut short, and the
# least finished status is the truth.
_STATUS_PRECEDENCE = (
    BatchStatus.PLANNED,
    BatchStatus.FAILED,
    BatchStatus.ABANDONED,
    BatchStatus.COMPLETED,
)


def batch_status(row_statuses: Collection[BatchStatus]) -> BatchStatus:
    """The status of a batch whose rows have ``row_statuses`` (the least finished)."""
    return next(s for s in _STATUS_PRECEDENCE if s in row_statuses)


def decide_status_change(
    batch: Batch, row_statuses: Collection[BatchStatus], status: BatchStatus
) -> bool:
    """Whether ``batch`` (with rows in ``row_statuses``) is to become ``status``.

    Returns:
        False when every row has ``status`` already (nothing to write), else True.

    Raises:
        BatchStateError: the batch already ended (a batch ends once: a finalizer and a
            `watermark set --force` that both saw it open cannot both end it), or a
            scheduled batch would complete with a ranged upstream not advanced.
    """
    if set(row_statuses) == {status}:
        return False
    if batch.status in (BatchStatus.COMPLETED, BatchStatus.ABANDONED):
        raise BatchStateError(
            f"Batch {batch.batch_id} is already {batch.status.value}; it cannot become "
            f"{status.value}.",
            batch_id=batch.batch_id,
            fix="list it with `watermark batch` and act on the next batch.",
        )
    if status is BatchStatus.COMPLETED and batch.kind is BatchKind.SCHEDULED:
        pending = [u for u in batch.ranged_upstreams if u not in batch.advanced]
        if pending:
            raise BatchStateError(
                f"Batch {batch.batch_id} cannot complete: upstream(s) {pending} not advanced.",
                batch_id=batch.batch_id,
            )
    return True


# ---------------------------------------------------------------- manual changes


def batch_reading(open_batch: Batch | None, upstream: str) -> Batch | None:
    """``open_batch`` if it reads ``upstream`` (a range or window, not NOOP), else None."""
    planned = open_batch.inputs.get(upstream) if open_batch is not None else None
    if planned is None or planned.mode is ReadMode.NOOP:
        return None
    return open_batch


def check_manual_change(upstream: str, version: int | None, how: WatermarkHow) -> None:
    """Validate a manual move: MANUAL_SET to a version >= 0, or RESET to None.

    Raises:
        ValueError: any other combination.
    """
    if how is WatermarkHow.RESET and version is not None:
        raise ValueError(f"{upstream}: a RESET stores no version, got {version}")
    if how is WatermarkHow.MANUAL_SET and (not isinstance(version, int) or version < 0):
        raise ValueError(f"{upstream}: a MANUAL_SET needs a version >= 0, got {version!r}")
    if how not in (WatermarkHow.MANUAL_SET, WatermarkHow.RESET):
        raise ValueError(f"{upstream}: a manual change is MANUAL_SET or RESET, not {how}")


def manual_change(
    upstream: str,
    version: int | None,
    how: WatermarkHow,
    current: Watermark | None,
    *,
    open_batch: str | None = None,
) -> WatermarkChange:
    """The manual move of ``upstream`` from its committed row ``current`` to ``version``.

    Raises:
        ValueError: ``how`` and ``version`` do not go together (see
            :func:`check_manual_change`).
    """
    check_manual_change(upstream, version, how)
    return WatermarkChange(
        upstream=upstream,
        old=current.committed_version if current is not None else None,
        new=version,
        how=how,
        old_cursor=encode_position(current.committed_cursor) if current is not None else None,
        open_batch=open_batch,
    )


def check_unmoved(expected: WatermarkChange | None, preview: WatermarkChange) -> None:
    """Refuse a manual change whose state moved since the operator confirmed ``expected``.

    Raises:
        TerminalError: the committed value or the open batch differ from ``expected``.
    """
    if expected is None:
        return
    now = (preview.old, preview.old_cursor, preview.open_batch)
    if now != (expected.old, expected.old_cursor, expected.open_batch):
        raise TerminalError(
            f"Upstream '{preview.upstream}' moved while the change was being confirmed: "
            f"committed {expected.old} -> {preview.old}, open batch {expected.open_batch} -> "
            f"{preview.open_batch}. Nothing was changed.",
            upstream=preview.upstream,
            fix="run the command again to see the current state.",
        )


def refuse_open_batch(change: WatermarkChange, reading: Batch | None, *, force: bool) -> None:
    """Refuse a manual move of ``change.upstream`` while an open batch reads it.

    Moving the watermark under an open batch would break it; ``force`` abandons the batch
    instead, so the next plan starts from the new value. A change that moves nothing is
    never refused.

    Args:
        change: the previewed change (``watermark set`` / ``reset``).
        reading: the open batch that reads the upstream (see :func:`batch_reading`), or None.
        force: the operator asked to abandon that batch.

    Raises:
        BatchStateError: ``reading`` is open, the change moves the watermark and ``force``
            is False; the message names the batch and what it reads.
    """
    if reading is None or force or not change.changed:
        return
    upstream = change.upstream
    raise BatchStateError(
        f"Upstream '{upstream}': batch {reading.batch_id} is open and reads {upstream} "
        f"({reading.inputs[upstream].describe()}); moving the watermark now would break it. "
        "Nothing was changed.",
        upstream=upstream,
        batch_id=reading.batch_id,
        fix=f"wait until it completes (`watermark batch {reading.batch_id}`), or pass --force "
        "to abandon it so the next plan starts from the new value.",
    )


def manual_event(how: WatermarkHow) -> str:
    """The ``history`` event of a manual move: WATERMARK_SET or WATERMARK_RESET."""
    return "WATERMARK_SET" if how is WatermarkHow.MANUAL_SET else "WATERMARK_RESET"


def manual_why(change: WatermarkChange, reason: str | None) -> str:
    """The phrase that names a manual move in the error of the batches it abandons."""
    why = f"manual {change.how.value} of '{change.upstream}' from {change.old} to {change.new}"
    return f"{why}: {reason}" if reason else why


def manual_watermark(
    current: Watermark | None,
    change: WatermarkChange,
    *,
    actor: str,
    now: datetime,
    pending_history: str,
) -> Watermark:
    """The committed row after a manual move from ``current``.

    A manual set keeps the table identity the watermark refers to; a reset forgets it,
    so a recreated table is loaded afresh. ``pending_history`` is the move's history row,
    committed with it.
    """
    kept = current.table_id if current is not None else None
    table_id = kept if change.how is WatermarkHow.MANUAL_SET else None
    # Not a batch's: batch_id None.
    return Watermark(
        change.upstream,
        change.new,
        None,
        change.how,
        now,
        actor,
        table_id=table_id,
        pending_history=pending_history,
    )


def stale_after_manual_change(batch: Batch | None, upstream: str, version: int | None) -> bool:
    """True when ``batch`` (the open batch reading ``upstream``) was planned from the
    watermark before a manual move to ``version``: its range does not start right after
    the new value, so it is abandoned and the next plan starts from the new value."""
    planned = batch.inputs.get(upstream) if batch is not None else None
    if planned is None or planned.range is None:
        return False
    first = 0 if version is None else version + 1
    return planned.range.start != first


def reloads_due(
    newest: Batch | None,
    holding: Collection[str],
    marks: Mapping[str, Watermark],
    pipeline_inputs: Mapping[str, Collection[str]],
    *,
    reloading: Collection[str] = (),
) -> tuple[str, ...]:
    """The pipelines the next plan owes a reload in full, from the newest scheduled batch.

    A pipeline stays owed until a batch plans its reload: ``newest.reloads_owed`` names
    those the newest batch could not plan (their upstreams were blocked or unavailable).
    When a forced change abandoned ``newest``, these are owed too:

    * a pipeline that holds the batch (``holding``: succeeded, recovered by the forced
      change, or written late by a run the change could not fence because its target did
      not exist yet) and read an upstream whose committed watermark does not cover what
      the batch read: not advanced for the batch, and for a versioned one below the version
      it read up to. The next batch would read those changes again, and an append target
      would hold them twice (I4); reloading the target from the next batch's snapshots
      makes it whole again;
    * a pipeline the batch was to reload that does not hold it: its target may hold the
      rows of an earlier abandoned batch.

    None is owed by a pipeline that reloads in the next plan anyway (``reloading``: an
    overwrite pipeline, or one reading a versioned upstream with nothing committed, which
    it loads as a snapshot), nor by one no longer in ``pipeline_inputs``.
    """
    if newest is None:
        return ()
    owed = set(newest.reloads_owed)
    if newest.status is BatchStatus.ABANDONED:
        for pipeline in newest.pipelines:
            upstreams = pipeline_inputs.get(pipeline)
            if upstreams is None:
                continue
            if pipeline in holding:
                if not all(_covers(newest, u, marks.get(u)) for u in upstreams):
                    owed.add(pipeline)
            elif pipeline in newest.full_load:
                owed.add(pipeline)
    return tuple(sorted(p for p in owed if p in pipeline_inputs and p not in reloading))


def _covers(batch: Batch, upstream: str, mark: Watermark | None) -> bool:
    """Whether ``upstream``'s committed watermark covers what ``batch`` read of it."""
    planned = batch.inputs.get(upstream)
    if planned is None or upstream in batch.advanced:
        return True
    if planned.is_cursor:
        return not planned.reads  # a window read and not advanced is read again
    if mark is None or mark.committed_version is None:
        return True  # read as a snapshot next: its readers reload anyway
    read_to = planned.snapshot_version
    return read_to is None or mark.committed_version >= read_to
