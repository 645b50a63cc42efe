"""The pure planning rules: ranges, NOOPs, gaps and what may advance."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from watermark_dagster.core.planning import (
    PlannedInput,
    UpstreamPosition,
    batch_is_due,
    cursor_has_new_data,
    cursor_state,
    plan_batch,
    prunable_batch_partitions,
)
from watermark_dagster.core.ranges import CursorWindow, ReadMode, VersionRange
from watermark_dagster.core.records import Batch, BatchKind, BatchStatus, batch_id_for
from watermark_dagster.core.replay import check_replay_range, plan_replay
from watermark_dagster.errors import (
    BatchStateError,
    UpstreamRecreatedError,
    recreated_fix,
)

PIPELINES = {"pipeline_a": ["up1", "up2"], "pipeline_b": ["up2", "up3"]}


def positions(**latest_and_committed: tuple[int, int | None]) -> list[UpstreamPosition]:
    return [UpstreamPosition(n, lv, cv) for n, (lv, cv) in latest_and_committed.items()]


@pytest.mark.parametrize(
    ("state", "expected_ranges", "expected_pipelines"),
    [
        pytest.param(
            {"up1": (3, None), "up2": (0, None), "up3": (5, None)},
            {"up1": (0, 3), "up2": (0, 0), "up3": (0, 5)},
            ("pipeline_a", "pipeline_b"),
            id="first batch starts at version 0",
        ),
        pytest.param(
            {"up1": (7, 3), "up2": (4, 4), "up3": (5, 5)},
            {"up1": (4, 7), "up2": None, "up3": None},
            ("pipeline_a",),
            id="only pipeline_a has work; up2 and up3 NOOP",
        ),
        pytest.param(
            {"up1": (3, 3), "up2": (9, 4), "up3": (5, 5)},
            {"up1": None, "up2": (5, 9), "up3": None},
            ("pipeline_a", "pipeline_b"),
            id="shared upstream changes: both pipelines run",
        ),
        pytest.param(
            {"up1": (3, 3), "up2": (4, 4), "up3": (5, 5)},
            {"up1": None, "up2": None, "up3": None},
            (),
            id="nothing new: no work",
        ),
    ],
)
def test_plan_ranges(state, expected_ranges, expected_pipelines) -> None:
    plan = plan_batch(positions(**state), PIPELINES)
    got = {u: (i.range.start, i.range.end) if i.range else None for u, i in plan.inputs.items()}
    assert got == expected_ranges
    assert plan.pipelines == expected_pipelines
    assert plan.has_work == bool(expected_pipelines)
    for name, planned in plan.inputs.items():
        if planned.range is None:
            assert planned.mode is ReadMode.NOOP
            # A NOOP input is read as of the committed version.
            assert planned.snapshot_version == state[name][1]
        else:
            assert planned.snapshot_version == planned.range.end


def test_max_versions_per_batch_caps_the_range() -> None:
    plan = plan_batch([UpstreamPosition("up1", 100, 9, max_versions_per_batch=10)], {"p": ["up1"]})
    assert plan.inputs["up1"].range == VersionRange(10, 19)


def test_unconsumed_upstream_gets_no_range() -> None:
    plan = plan_batch(
        [UpstreamPosition("up1", 5, None), UpstreamPosition("orphan", 5, None)], {"p": ["up1"]}
    )
    assert plan.inputs["orphan"].mode is ReadMode.NOOP


def test_recreated_upstream_fails_loudly() -> None:
    with pytest.raises(
        UpstreamRecreatedError, match=r"'up1' was dropped and recreated: it is at version 2, below"
    ) as e:
        plan_batch([UpstreamPosition("up1", 2, 7)], {"p": ["up1"]})
    assert e.value.fix == recreated_fix("up1")
    assert "`watermark reset -t up1 --force`" in str(e.value)
    assert e.value.upstream == "up1"


def test_version_range_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="below 0"):
        VersionRange(-1, 3)
    with pytest.raises(ValueError, match="end before it starts"):
        VersionRange(5, 4)
    assert VersionRange(3, 5).size == 3


def test_batch_is_due() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    minute = timedelta(minutes=1)
    assert batch_is_due(None, now, minute)
    assert not batch_is_due(now - timedelta(seconds=30), now, minute)
    assert batch_is_due(now - minute, now, minute)


# ------------------------------------------------------------------ read modes


def test_nothing_committed_reads_a_snapshot_and_loads_its_pipelines_fully() -> None:
    plan = plan_batch(
        [
            UpstreamPosition("new", 7, None, max_versions_per_batch=2),
            UpstreamPosition("old", 9, 5, mode=ReadMode.APPEND_ONLY),
        ],
        {"a": ("new",), "b": ("old",), "c": ("new", "old")},
    )
    assert plan.inputs["new"] == PlannedInput("new", ReadMode.SNAPSHOT, VersionRange(0, 7), 7)
    assert plan.inputs["old"] == PlannedInput("old", ReadMode.APPEND_ONLY, VersionRange(6, 9), 9)
    assert plan.full_load == ("a", "c")


def test_first_loads_run_even_without_new_data_and_overwrites_only_with_it() -> None:
    positions = [UpstreamPosition("u", 4, 4), UpstreamPosition("v", 6, 3)]
    plan = plan_batch(
        positions,
        {"fresh": ("u",), "idle": ("u",), "full": ("v",)},
        bootstrap=["fresh"],
        overwrite=["full", "idle"],
    )
    assert plan.pipelines == ("fresh", "full")
    assert plan.full_load == ("fresh", "full")
    assert plan.inputs["u"].mode is ReadMode.NOOP
    assert plan.inputs["u"].snapshot_version == 4


def test_snapshot_only_upstreams_are_not_capped() -> None:
    plan = plan_batch(
        [UpstreamPosition("s", 30, 10, max_versions_per_batch=2, mode=ReadMode.SNAPSHOT)],
        {"p": ("s",)},
    )
    assert plan.inputs["s"].range == VersionRange(11, 30)
    assert plan.full_load == ("p",)


def test_cursor_upstreams_get_windows_from_their_committed_position() -> None:
    new = UpstreamPosition("c", -1, None, mode=ReadMode.TIMESTAMP, committed_cursor=(5, 1))
    plan = plan_batch([replace(new, has_new_data=True)], {"p": ("c",)})
    assert plan.inputs["c"].window == CursorWindow((5, 1), None)
    assert plan.inputs["c"].mode is ReadMode.TIMESTAMP
    idle = plan_batch([new], {"p": ("c",)})
    assert not idle.has_work
    assert idle.inputs["c"].window == CursorWindow((5, 1), (5, 1))


def test_held_back_rows_bring_a_cursor_upstream_back_when_they_pass_the_lag() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    recheck = int((now + timedelta(minutes=5)).timestamp() * 1_000_000)
    state = cursor_state("s1", recheck)
    assert not cursor_has_new_data(state, "s1", now)
    assert cursor_has_new_data(state, "s1", now + timedelta(minutes=5))
    assert cursor_has_new_data(state, "s2", now)  # the source changed
    assert not cursor_has_new_data(cursor_state("s1", None), "s1", now)
    assert cursor_has_new_data(None, "s1", now)


@pytest.mark.parametrize(
    ("keys", "newest", "keep", "held", "expected"),
    [
        pytest.param(["b000001", "b000002", "b000003"], 3, 2, (), ["b000001"], id="oldest"),
        pytest.param(["b000001", "b000002"], 2, 2, (), [], id="within-keep"),
        pytest.param(["b000001", "b000002", "b000003"], 3, 0, (), [], id="keep-0-keeps-all"),
        # Retention counts sequence numbers, not the keys present: gaps (pruned before,
        # never added) do not pull newer batches out of retention.
        pytest.param(["b000004", "b000007"], 9, 3, (), ["b000004"], id="gaps"),
        # An open batch (a stuck scheduled batch, a replay) or one a run is in flight for
        # keeps its partition.
        pytest.param(["b000001", "b000002", "b000003"], 3, 1, {"b000001"}, ["b000002"], id="held"),
        # By sequence number, not text: b1000000 is newer than b999999.
        pytest.param(["b999999", "b1000000"], 1000001, 1, (), ["b999999", "b1000000"], id="num"),
        pytest.param(["b999999", "b1000000"], 1000000, 1, (), ["b999999"], id="num-newest"),
        # Keys that are not batch ids (added by hand) are not ours to delete.
        pytest.param(["manual", "b000001", "b000002"], 2, 1, (), ["b000001"], id="foreign"),
    ],
)  # fmt: skip
def test_prunable_batch_partitions(keys, newest, keep, held, expected) -> None:
    found = prunable_batch_partitions(keys, newest_seq=newest, keep=keep, held=held)
    assert found == expected


def _completed(seq: int, **inputs: PlannedInput) -> Batch:
    return Batch(
        batch_id=batch_id_for(seq),
        seq=seq,
        kind=BatchKind.SCHEDULED,
        plan_id="p",
        status=BatchStatus.COMPLETED,
        pipelines=("p",),
        inputs=inputs,
        advanced=frozenset(inputs),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        actor="me",
    )


def test_only_applied_versions_can_be_replayed() -> None:
    check_replay_range("orders", VersionRange(1, 5), 5)
    with pytest.raises(BatchStateError, match="beyond the committed watermark 4"):
        check_replay_range("orders", VersionRange(1, 5), 4)
    with pytest.raises(BatchStateError, match="beyond the committed watermark None"):
        check_replay_range("orders", VersionRange(0, 0), None)


def test_a_replay_pins_the_other_upstreams_where_the_origin_pinned_them() -> None:
    first = _completed(
        1,
        orders=PlannedInput("orders", ReadMode.CDF, VersionRange(0, 3), 3),
        log=PlannedInput("log", ReadMode.NOOP, None, 7),
        events=PlannedInput("events", ReadMode.TIMESTAMP, None, None, CursorWindow(None, (9,))),
    )
    second = _completed(2, orders=PlannedInput("orders", ReadMode.CDF, VersionRange(4, 6), 6))
    plan = plan_replay(
        [first, second],
        "orders",
        VersionRange(2, 3),
        mode=ReadMode.CDF,
        upstreams=["log", "events", "payments"],
    )
    assert plan.origin is first
    assert plan.order_seq == 1
    assert list(plan.inputs) == ["events", "log", "orders"]  # payments: not in the origin
    assert plan.inputs["orders"] == PlannedInput("orders", ReadMode.CDF, VersionRange(2, 3), 3)
    assert plan.inputs["log"] == PlannedInput("log", ReadMode.NOOP, None, 7)
    assert plan.inputs["events"].window == CursorWindow((9,), (9,))
    inside = plan_replay(
        [first, second], "orders", VersionRange(4, 5), mode=ReadMode.CDF, upstreams=[]
    )
    assert inside.origin is second
    assert inside.order_seq == 1
    with pytest.raises(BatchStateError, match="no completed batch applied version 9"):
        plan_replay([first, second], "orders", VersionRange(7, 9), mode=ReadMode.CDF, upstreams=[])
