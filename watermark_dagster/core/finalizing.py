"""Advancing a committed watermark at a batch's end, in plain Python (no Dagster, Spark or
delta-rs): which upstreams may advance (I4), and each advance kept to I1 and I2.

The store applies these answers inside its compare-and-swap; the finalizer and the
command line call the same functions, so each rule has one definition. How a batch ends
is :mod:`~watermark_dagster.core.batch_ending`; manual moves of a watermark are
:mod:`~watermark_dagster.core.manual_changes`.
"""

from collections.abc import Iterable, Mapping
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
    BatchStatus,
    Watermark,
    WatermarkHow,
    version_text,
)
from watermark_dagster.errors import (
    BatchStateError,
    WatermarkGapError,
    WatermarkRegressionError,
)


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
