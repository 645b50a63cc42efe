"""Finalizing rules: advancing watermarks, fan-out gating, how batches end, manual moves."""

import dataclasses
from datetime import UTC, datetime

import pytest

from watermark_dagster.core.batch_ending import batch_status, decide_status_change
from watermark_dagster.core.finalizing import (
    AdvanceDecision,
    decide_advance,
    decide_advance_step,
    decide_cursor_advance,
    finalize_step,
    require_open,
)
from watermark_dagster.core.manual_changes import (
    batch_reading,
    check_unmoved,
    manual_watermark,
    refuse_open_batch,
    stale_after_manual_change,
)
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import CursorWindow, ReadMode, VersionRange
from watermark_dagster.core.records import (
    Batch,
    BatchKind,
    BatchStatus,
    Watermark,
    WatermarkChange,
    WatermarkHow,
    seq_of,
)
from watermark_dagster.core.reloads import reloads_due
from watermark_dagster.errors import (
    BatchStateError,
    TerminalError,
    WatermarkGapError,
    WatermarkRegressionError,
)


@pytest.mark.parametrize(
    ("committed", "rng", "expected"),
    [
        pytest.param(None, (0, 4), AdvanceDecision.ADVANCE, id="first advance from nothing"),
        pytest.param(4, (5, 9), AdvanceDecision.ADVANCE, id="contiguous"),
        pytest.param(9, (5, 9), AdvanceDecision.ALREADY_DONE, id="repeat after a crash"),
    ],
)
def test_decide_advance(committed, rng, expected) -> None:
    assert decide_advance("up1", committed, VersionRange(*rng), "b000002") is expected


def test_advance_refuses_a_gap() -> None:
    with pytest.raises(WatermarkGapError, match="skip versions 3..4"):
        decide_advance("up1", 2, VersionRange(5, 9), "b000002")


def test_advance_refuses_a_regression() -> None:
    with pytest.raises(WatermarkRegressionError, match="backwards"):
        decide_advance("up1", 12, VersionRange(5, 9), "b000002")


def _inputs(**ranges: tuple[int, int] | None) -> dict[str, PlannedInput]:
    out = {}
    for name, rng in ranges.items():
        if rng is None:
            out[name] = PlannedInput(name, ReadMode.NOOP, None, 0)
        else:
            out[name] = PlannedInput(name, ReadMode.CDF, VersionRange(*rng), rng[1])
    return out


CONSUMERS = {"up1": {"pipeline_a"}, "up2": {"pipeline_a", "pipeline_b"}, "up3": {"pipeline_b"}}


def test_fan_out_gating() -> None:
    inputs = _inputs(up1=(0, 3), up2=(0, 4), up3=(0, 5))
    both = ("pipeline_a", "pipeline_b")
    step = finalize_step(inputs, [], CONSUMERS, both, succeeded={"pipeline_a"})
    assert step.advance == ("up1",)
    assert step.waiting == {"up2": ("pipeline_b",), "up3": ("pipeline_b",)}
    assert not step.complete
    step = finalize_step(inputs, ["up1"], CONSUMERS, both, succeeded={"pipeline_a", "pipeline_b"})
    assert step.advance == ("up2", "up3")
    assert step.complete


def test_noop_inputs_never_advance_and_absent_pipelines_do_not_block() -> None:
    inputs = _inputs(up1=(4, 7), up2=None, up3=None)
    step = finalize_step(inputs, [], CONSUMERS, ["pipeline_a"], succeeded={"pipeline_a"})
    assert step.advance == ("up1",)
    assert step.complete


def test_cursor_advance_moves_only_from_start_to_end() -> None:
    window = CursorWindow((5, 1), (9, 3))
    assert decide_cursor_advance("c", (5, 1), window, "b1") is AdvanceDecision.ADVANCE
    assert decide_cursor_advance("c", (9, 3), window, "b1") is AdvanceDecision.ALREADY_DONE
    with pytest.raises(WatermarkGapError):
        decide_cursor_advance("c", (4, 0), window, "b1")
    with pytest.raises(BatchStateError, match="never pinned"):
        decide_cursor_advance("c", (5, 1), CursorWindow((5, 1)), "b1")


def test_an_empty_cursor_window_advances_in_place_to_record_the_source_state() -> None:
    # The source changed (late row below the position, delete, OPTIMIZE) but the window
    # read nothing: the position stays and the new source state must be recorded, or the
    # next plan sees the same change as new again, forever.
    empty = CursorWindow((5, 1), (5, 1))
    assert decide_cursor_advance("c", (5, 1), empty, "b1") is AdvanceDecision.ADVANCE
    first = CursorWindow(None, ())
    assert decide_cursor_advance("c", None, first, "b1") is AdvanceDecision.ADVANCE
    assert decide_cursor_advance("c", (), first, "b1") is AdvanceDecision.ALREADY_DONE


def _batch(
    batch_id: str = "b000002",
    *,
    status: BatchStatus = BatchStatus.PLANNED,
    kind: BatchKind = BatchKind.SCHEDULED,
    advanced: frozenset[str] = frozenset(),
    **ranges: tuple[int, int] | None,
) -> Batch:
    return Batch(
        batch_id=batch_id,
        seq=seq_of(batch_id),
        kind=kind,
        plan_id="p",
        status=status,
        pipelines=("pipeline_a",),
        inputs=_inputs(**ranges),
        advanced=advanced,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        actor="me",
    )


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        pytest.param({BatchStatus.COMPLETED}, BatchStatus.COMPLETED, id="all alike"),
        pytest.param({BatchStatus.COMPLETED, BatchStatus.PLANNED}, BatchStatus.PLANNED, id="cut"),
        pytest.param(
            {BatchStatus.COMPLETED, BatchStatus.ABANDONED}, BatchStatus.ABANDONED, id="ab"
        ),
        pytest.param({BatchStatus.ABANDONED, BatchStatus.FAILED}, BatchStatus.FAILED, id="failed"),
    ],
)
def test_the_least_finished_row_status_is_the_batch_status(statuses, expected) -> None:
    assert batch_status(statuses) is expected


def test_a_batch_ends_once_and_completes_only_when_advanced() -> None:
    planned = _batch(up1=(3, 5), up2=None)
    assert not decide_status_change(planned, {BatchStatus.PLANNED}, BatchStatus.PLANNED)
    assert decide_status_change(planned, {BatchStatus.PLANNED}, BatchStatus.FAILED)
    with pytest.raises(BatchStateError, match=r"\['up1'\] not advanced"):
        decide_status_change(planned, {BatchStatus.PLANNED}, BatchStatus.COMPLETED)
    done = _batch(up1=(3, 5), up2=None, advanced=frozenset({"up1"}))
    assert decide_status_change(done, {BatchStatus.PLANNED}, BatchStatus.COMPLETED)
    # A replay never advances anything: it completes as it is.
    replay = _batch(up1=(3, 5), kind=BatchKind.REPLAY)
    assert decide_status_change(replay, {BatchStatus.PLANNED}, BatchStatus.COMPLETED)
    abandoned = _batch(up1=(3, 5), status=BatchStatus.ABANDONED)
    with pytest.raises(BatchStateError, match="already ABANDONED"):
        decide_status_change(abandoned, {BatchStatus.ABANDONED}, BatchStatus.COMPLETED)


def _mark(version: int | None, batch_id: str | None, how: WatermarkHow) -> Watermark:
    return Watermark("up1", version, batch_id, how, datetime(2026, 1, 1, tzinfo=UTC), "me")


def test_an_advance_step_names_the_values_history_records() -> None:
    planned = _inputs(up1=(3, 5))["up1"]
    step = decide_advance_step("b000002", planned, _mark(2, "b000001", WatermarkHow.AUTO))
    assert (step.decision, step.old_value, step.new_value) == (AdvanceDecision.ADVANCE, "2", "5")
    assert step.records_history
    # Already at the end: moved by this batch (a finalizer died before its history row) ...
    step = decide_advance_step("b000002", planned, _mark(5, "b000002", WatermarkHow.AUTO))
    assert step.recorded_after_restart
    assert step.records_history
    assert (step.old_value, step.new_value) == ("2", "5")
    # ... or by hand: nothing to record.
    step = decide_advance_step("b000002", planned, _mark(5, None, WatermarkHow.MANUAL_SET))
    assert step.decision is AdvanceDecision.ALREADY_DONE
    assert not step.records_history
    with pytest.raises(BatchStateError, match="reads nothing"):
        decide_advance_step("b000002", _inputs(up1=None)["up1"], None)


def test_an_advance_needs_the_batch_still_open() -> None:
    require_open(_batch(up1=(3, 5)), "up1")
    with pytest.raises(BatchStateError, match="is ABANDONED"):
        require_open(_batch(up1=(3, 5), status=BatchStatus.ABANDONED), "up1")


def _change(old: int | None, new: int | None) -> WatermarkChange:
    how = WatermarkHow.RESET if new is None else WatermarkHow.MANUAL_SET
    return WatermarkChange("up1", old, new, how, open_batch="b000002")


def test_a_manual_move_is_refused_while_an_open_batch_reads_the_upstream() -> None:
    reading = _batch(up1=(3, 5))
    with pytest.raises(BatchStateError, match=r"batch b000002 is open and reads up1 \(CDF") as e:
        refuse_open_batch(_change(2, 7), reading, force=False)
    assert "--force" in str(e.value)
    refuse_open_batch(_change(2, 7), reading, force=True)  # abandons it instead
    refuse_open_batch(_change(2, 2), reading, force=False)  # moves nothing
    refuse_open_batch(_change(2, 7), None, force=False)
    assert batch_reading(reading, "up1") is reading
    assert batch_reading(_batch(up1=None), "up1") is None


def test_a_confirmed_preview_must_still_hold() -> None:
    check_unmoved(None, _change(2, 7))
    check_unmoved(_change(2, 7), _change(2, 7))
    with pytest.raises(TerminalError, match="moved while the change was being confirmed"):
        check_unmoved(_change(2, 7), _change(3, 7))


def test_a_batch_planned_from_the_old_value_is_stale() -> None:
    planned = _batch(up1=(3, 5))
    assert not stale_after_manual_change(planned, "up1", 2)
    assert stale_after_manual_change(planned, "up1", 6)
    assert stale_after_manual_change(planned, "up1", None)
    assert not stale_after_manual_change(None, "up1", 6)
    assert not stale_after_manual_change(_batch(up1=None), "up1", 6)


def test_a_manual_set_keeps_the_table_identity_and_a_reset_forgets_it() -> None:
    current = dataclasses.replace(_mark(2, "b000001", WatermarkHow.AUTO), table_id="t1")
    now = datetime(2026, 1, 2, tzinfo=UTC)
    kept = manual_watermark(current, _change(2, 7), actor="me", now=now, pending_history="{}")
    assert (kept.committed_version, kept.table_id, kept.how) == (7, "t1", WatermarkHow.MANUAL_SET)
    gone = manual_watermark(current, _change(2, None), actor="me", now=now, pending_history="{}")
    assert (gone.committed_version, gone.table_id, gone.how) == (None, None, WatermarkHow.RESET)


def _abandoned(**ranges: tuple[int, int] | None) -> Batch:
    """b000003 abandoned: pipeline_a reads up1 and up2 (an append), pipeline_b up2 only;
    pipeline_c read a cursor window of clicks; pipeline_b was a first load."""
    batch = _batch("b000003", status=BatchStatus.ABANDONED, **ranges)
    window = PlannedInput("clicks", ReadMode.TIMESTAMP, None, None, CursorWindow(None, None))
    return dataclasses.replace(
        batch,
        pipelines=("pipeline_a", "pipeline_b", "pipeline_c"),
        inputs={**batch.inputs, "clicks": window},
        full_load=("pipeline_b",),
    )


READS = {"pipeline_a": ("up1", "up2"), "pipeline_b": ("up2",), "pipeline_c": ("clicks",)}


def _marks(**versions: int | None) -> dict[str, Watermark]:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return {u: Watermark(u, v, None, WatermarkHow.AUTO, now, "me") for u, v in versions.items()}


def test_a_pipeline_holding_an_abandoned_batch_reloads_where_a_watermark_falls_short() -> None:
    batch = _abandoned(up1=(3, 5), up2=(6, 8))
    # pipeline_a applied both ranges; up1 advanced for the batch, up2 did not (pipeline_b
    # had not applied it): reading [6, 8] again would append it twice.
    split = dataclasses.replace(batch, advanced=frozenset({"up1"}))
    marks = _marks(up1=5, up2=5, clicks=None)
    assert reloads_due(split, {"pipeline_a"}, marks, READS) == ("pipeline_a", "pipeline_b")
    # The forced change set up2 past what the batch read: nothing to read twice.
    assert reloads_due(split, {"pipeline_a"}, _marks(up1=5, up2=8), READS) == ("pipeline_b",)
    # ... or reset it: every reader loads it as a snapshot anyway.
    assert reloads_due(split, {"pipeline_a", "pipeline_b"}, _marks(up1=5, up2=None), READS) == ()
    # Set below what the batch read: the holder would read part of it again.
    assert reloads_due(split, {"pipeline_a"}, _marks(up1=5, up2=7), READS)[0] == "pipeline_a"


def test_a_cursor_window_not_advanced_is_read_again() -> None:
    batch = _abandoned(up1=None, up2=None)
    marks = _marks(up1=2, up2=2, clicks=None)
    assert reloads_due(batch, {"pipeline_c"}, marks, READS) == ("pipeline_b", "pipeline_c")
    advanced = dataclasses.replace(batch, advanced=frozenset({"clicks"}))
    assert reloads_due(advanced, {"pipeline_c"}, marks, READS) == ("pipeline_b",)


def test_a_planned_reload_not_applied_is_still_owed_and_unknown_pipelines_are_skipped() -> None:
    batch = _abandoned(up1=(3, 5), up2=(6, 8))
    marks = _marks(up1=2, up2=5)
    # Nothing held, nothing owed but the first load pipeline_b was planned for.
    assert reloads_due(batch, set(), marks, READS) == ("pipeline_b",)
    assert reloads_due(batch, set(), marks, {"pipeline_a": ("up1", "up2")}) == ()
    # Not one that reloads anyway (an overwrite, or a reader of an upstream reset).
    assert reloads_due(batch, set(), marks, READS, reloading=("pipeline_b",)) == ()


def test_a_reload_a_batch_could_not_plan_stays_owed_until_one_plans_it() -> None:
    assert reloads_due(None, set(), {}, READS) == ()
    carried = dataclasses.replace(
        _batch("b000004", up1=(6, 7), status=BatchStatus.COMPLETED), reloads_owed=("pipeline_a",)
    )
    assert reloads_due(carried, set(), _marks(up1=7), READS) == ("pipeline_a",)
    # Abandoned in turn: what it carried, and what it owes itself.
    abandoned = dataclasses.replace(
        _abandoned(up1=(3, 5), up2=(6, 8)), reloads_owed=("pipeline_c",)
    )
    marks = _marks(up1=5, up2=5)
    assert reloads_due(abandoned, set(), marks, READS) == ("pipeline_b", "pipeline_c")
    assert reloads_due(abandoned, set(), marks, {"pipeline_a": ("up1",)}) == ()


def test_a_reload_that_would_load_what_start_from_skipped_blocks_its_upstreams() -> None:
    """A pipeline owing a reload whose upstream starts from `latest` cannot be reloaded
    from the beginning: its upstreams are blocked with the reset that resolves it, and
    nothing is planned for them; one that starts from the beginning is reloaded."""
    from watermark_dagster.config.pipeline import Pipeline
    from watermark_dagster.config.registry import Registry
    from watermark_dagster.config.upstream import DeltaUpstream
    from watermark_dagster.core.observations import RegistryObservation
    from watermark_dagster.core.planning import UpstreamPosition
    from watermark_dagster.operations.coordinate import hold_unreloadable

    def copy(batch):  # never run
        return batch["a"].changes

    registry = Registry(
        upstreams=[DeltaUpstream(name="a", path="/x/a", start_from="latest")],
        pipelines=[Pipeline(name="p", upstreams=["a"], target="/x/p", keys=["id"],
                            transform=copy)],
    )  # fmt: skip
    look = RegistryObservation(
        observed={}, errors={}, positions=(UpstreamPosition("a", 9, 5),), runnable={"p": ("a",)}
    )
    held = hold_unreloadable(registry, look, ["p"], "b000003")
    assert held.runnable == {}
    assert held.positions == ()
    assert "b000003" in str(held.blocked["a"])
    assert "`watermark reset -t a`" in str(held.blocked["a"])
    assert not held.plan().has_work
    reloaded = dataclasses.replace(look, bootstrap=("p",))
    assert hold_unreloadable(registry, reloaded, ["p"], "b000003") is reloaded
    assert hold_unreloadable(registry, look, [], None) is look
