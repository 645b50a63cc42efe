"""The coordinator and finalizer sensors against a real Dagster instance, without a JVM.

Upstreams are real Delta tables written with delta-rs; no pipeline runs here (the Spark
tests run them), so these tests look at what the sensors plan, request and refuse.
"""

import argparse
import json
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetSpec,
    DagsterInstance,
    DagsterRunStatus,
    SensorResult,
    build_sensor_context,
)
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.tags import PARTITION_NAME_TAG
from dagster._core.test_utils import create_run_for_test
from deltalake import write_deltalake

from tests.support.runs import died_run, finished_run
from watermark_dagster.cli import supervise
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.outcomes import succeeded_pipelines, superseded_by
from watermark_dagster.core.records import (
    Batch,
    BatchKind,
    BatchStatus,
    Checkpoint,
    CheckpointStatus,
)
from watermark_dagster.core.resuming import (
    BatchRunFacts,
    ResumeAction,
    RetryPolicy,
    RunDeath,
    TerminalFailure,
    decide_resume,
    resume_step,
)
from watermark_dagster.dagster_defs.definitions import build_definitions, location_of
from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
from watermark_dagster.dagster_defs.runs import (
    DIED_TAG,
    PLAN_ID_METADATA,
    WORKER_RUN_TAG,
    WORKER_TAG,
    check_consumers,
    terminal_error_tags,
)
from watermark_dagster.dagster_defs.sensors import (
    COORDINATOR,
    FINALIZER,
    CoordinatorCursor,
)
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.dagster_defs.translator import WatermarkTranslator
from watermark_dagster.errors import ConfigurationError, UpstreamSchemaChangedError
from watermark_dagster.operations.status import stuck_batches
from watermark_dagster.store import WatermarkStore


def _never_called(batch):
    raise AssertionError("no pipeline runs in these tests")


def _commit(path: Path, ids: list[int]) -> None:
    table = pa.table({"id": pa.array(ids, pa.int64())})
    write_deltalake(
        str(path), table, mode="append", configuration={"delta.enableChangeDataFeed": "true"}
    )


@pytest.fixture
def setup(tmp_path: Path, dagster_home: Path) -> Iterator[tuple]:
    ups = {name: tmp_path / name for name in ("up1", "up2", "up3")}
    for path in ups.values():
        _commit(path, [1, 2])
    # No pipeline runs here: give them targets, as their first runs would have.
    for target in ("a", "b"):
        _commit(tmp_path / target, [0])
    registry = Registry(
        upstreams=[DeltaUpstream(name=n, path=str(p)) for n, p in ups.items()],
        pipelines=[
            Pipeline(
                name="pipeline_a",
                upstreams=("up1", "up2"),
                target=str(tmp_path / "a"),
                keys=("id",),
                transform=_never_called,
            ),
            Pipeline(
                name="pipeline_b",
                upstreams=("up2", "up3"),
                target=str(tmp_path / "b"),
                keys=("id",),
                transform=_never_called,
            ),
        ],
    )
    defs = build_definitions(
        registry,
        control_root=str(tmp_path / "control"),
        settings=WatermarkSettings(min_batch_interval_seconds=0),
    )
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        yield defs, instance, WatermarkStore(tmp_path / "control"), ups
    finally:
        instance.dispose()


def _tick(defs, instance, name: str, cursor: str | None = None):
    with build_sensor_context(
        instance_ref=instance.get_ref(),
        definitions=defs,
        sensor_name=name,
        cursor=cursor,
        resources=dict(defs.resources),
    ) as context:
        return defs.resolve_sensor_def(name).evaluate_tick(context)


def test_coordinator_plans_adds_partition_and_requests_one_run(setup) -> None:
    defs, instance, store, _ = setup
    result = _tick(defs, instance, COORDINATOR)
    [request] = result.run_requests
    assert request.partition_key == "b000001"
    assert request.run_key == "b000001:1"
    assert request.asset_check_keys == []  # the batch run executes pipelines only
    assert sorted(k.to_user_string() for k in request.asset_selection) == [
        "pipeline_a",
        "pipeline_b",
    ]
    [add] = result.dynamic_partitions_requests
    assert list(add.partition_keys) == ["b000001"]
    # Observations of the three upstreams ride along with the tick, and so do their
    # watermark_continuity check results (all passing).
    events = result.asset_events
    observed = [e for e in events if isinstance(e, AssetObservation)]
    assert sorted(e.asset_key.to_user_string() for e in observed) == ["up1", "up2", "up3"]
    checks = [
        e
        for e in events
        if isinstance(e, AssetCheckEvaluation) and e.check_name == "watermark_continuity"
    ]
    assert sorted((e.asset_key.to_user_string(), e.passed) for e in checks) == [
        ("up1", True),
        ("up2", True),
        ("up3", True),
    ]
    batch = store.open_batch()
    assert batch is not None
    assert {u: str(i.range) for u, i in batch.inputs.items()} == {
        "up1": "[0, 0]",
        "up2": "[0, 0]",
        "up3": "[0, 0]",
    }


def test_open_batch_is_resumed_not_replanned(setup) -> None:
    defs, instance, store, ups = setup
    first = _tick(defs, instance, COORDINATOR)
    instance.add_dynamic_partitions("watermark_batches", ["b000001"])
    _commit(ups["up1"], [3])  # new data arrives while the batch is open
    again = _tick(defs, instance, COORDINATOR, first.cursor)
    assert len(store.batches()) == 1
    [request] = again.run_requests  # no run exists yet: the same batch is requested again
    assert request.partition_key == "b000001"
    assert not again.dynamic_partitions_requests


def test_finalizer_waits_for_the_pipelines(setup) -> None:
    defs, instance, store, _ = setup
    _tick(defs, instance, COORDINATOR)
    result = _tick(defs, instance, FINALIZER)
    assert "waits for" in (result.skip_message or "")
    assert store.committed_versions() == {}


def test_nothing_new_plans_nothing(setup) -> None:
    defs, instance, store, _ = setup
    result = _tick(defs, instance, COORDINATOR)
    assert result.run_requests
    # Finalize by hand as if both pipelines succeeded; no commit follows.
    planned = store.open_batch()
    assert planned is not None
    for upstream in planned.ranged_upstreams:
        store.advance(planned, upstream, actor="test")
    store.set_batch_status(planned.batch_id, BatchStatus.COMPLETED, actor="test")
    result = _tick(defs, instance, COORDINATOR, result.cursor)
    assert not result.run_requests
    assert "no upstream has new versions" in (result.skip_message or "")
    assert len(store.batches()) == 1


def test_default_settings_plan_the_next_batch_at_once(setup, monkeypatch) -> None:
    """A code location built without settings uses the same minimum interval as the
    environment's default (0): new commits right after a batch are planned at once."""
    from watermark_dagster.dagster_defs.component import settings_from_environment

    monkeypatch.delenv("WATERMARK_MIN_BATCH_INTERVAL_SECONDS", raising=False)
    assert WatermarkSettings().min_batch_interval_seconds == 0
    assert settings_from_environment().min_batch_interval_seconds == 0
    built, instance, store, ups = setup
    defs = build_definitions(
        location_of(built).registry, control_root=store.root
    )  # default settings
    first = _tick(defs, instance, COORDINATOR)
    planned = store.open_batch()
    assert first.run_requests
    assert planned is not None
    for upstream in planned.ranged_upstreams:
        store.advance(planned, upstream, actor="test")
    store.set_batch_status(planned.batch_id, BatchStatus.COMPLETED, actor="test")
    _commit(ups["up1"], [3])
    second = _tick(defs, instance, COORDINATOR, first.cursor)
    assert second.run_requests, second.skip_message
    assert sorted(b.batch_id for b in store.batches()) == ["b000001", "b000002"]


def test_two_coordinator_ticks_at_once_create_one_batch(setup) -> None:
    defs, instance, store, _ = setup
    barrier = threading.Barrier(2)
    results: list = []
    errors: list = []

    def tick() -> None:
        try:
            barrier.wait()
            results.append(_tick(defs, instance, COORDINATOR))
        except Exception as e:  # pragma: no cover - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=tick) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(store.batches()) == 1
    keys = {r.run_key for result in results for r in result.run_requests}
    assert keys == {"b000001:1"}  # Dagster launches one run per run key


@pytest.mark.parametrize(
    "status",
    [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED],
    ids=lambda s: s.value,
)
def test_a_submitted_run_is_in_flight_until_it_finishes(setup, status) -> None:
    """Regression: a run the daemon had submitted but not started was resubmitted (attempt 2)
    and the two runs raced on the same targets. Every unfinished status counts as in flight
    (QUEUED too; creating a queued run here would need a code location origin)."""
    defs, instance, _, _ = setup
    first = _tick(defs, instance, COORDINATOR)
    [request] = first.run_requests
    create_run_for_test(
        instance,
        job_name="watermark_batch_job",
        status=status,
        tags={**request.tags, PARTITION_NAME_TAG: request.partition_key},
    )
    again = _tick(defs, instance, COORDINATOR, first.cursor)
    assert not again.run_requests
    assert "in flight" in (again.skip_message or "")


def test_failed_and_canceled_runs_are_resubmitted_until_max_attempts(setup) -> None:
    defs, instance, store, _ = setup
    cursor = None
    outcomes = [DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE]
    for attempt, status in enumerate(outcomes, start=1):
        result = _tick(defs, instance, COORDINATOR, cursor)
        cursor = result.cursor
        [request] = result.run_requests
        assert request.run_key == f"b000001:{attempt}"
        finished_run(instance, request, status)
        # The pipeline's attempt records its error, as a run whose transform raised does.
        attempt = store.begin_checkpoint("pipeline_a", "b000001", run_id=None)
        store.finish_checkpoint(
            "pipeline_a",
            "b000001",
            attempt,
            CheckpointStatus.FAILED,
            error=f"ValueError: no column 'amount' (attempt {attempt})",
        )
    stuck = _tick(defs, instance, COORDINATOR, cursor)
    assert not stuck.run_requests
    assert "is stuck: 3 failed runs" in (stuck.skip_message or "")
    # The reason names the newest error, not only the count.
    assert "The last error: ValueError: no column 'amount' (attempt 3)" in stuck.skip_message
    # The headless runner reads the verdict from the cursor, not from the message.
    assert CoordinatorCursor.parse(cursor).stuck_reason is None
    assert CoordinatorCursor.parse(stuck.cursor).stuck_reason == stuck.skip_message
    assert [h["event"] for h in store.history()].count("BATCH_STUCK") == 1
    assert store.open_batch() is not None  # still open: nothing is skipped or advanced


def test_start_from_latest_skips_history_and_reads_only_later_commits(
    tmp_path: Path, dagster_home: Path
) -> None:
    source = tmp_path / "audit"
    for i in range(3):
        _commit(source, [i])  # versions 0..2: history to skip
    registry = Registry(
        upstreams=[DeltaUpstream(name="audit", path=str(source), start_from="latest")],
        pipelines=[
            Pipeline(
                name="audit_copy",
                upstreams=("audit",),
                target=str(tmp_path / "t"),
                keys=("id",),
                transform=_never_called,
            )
        ],
    )
    defs = build_definitions(
        registry,
        control_root=str(tmp_path / "control"),
        settings=WatermarkSettings(min_batch_interval_seconds=0),
    )
    store = WatermarkStore(tmp_path / "control")
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        first = _tick(defs, instance, COORDINATOR)
        assert not first.run_requests  # nothing after the starting point yet
        mark = store.committed()["audit"]
        assert (mark.committed_version, mark.how.value) == (2, "START_FROM")
        assert [h["event"] for h in store.history(upstream="audit")] == ["WATERMARK_STARTED"]
        _commit(source, [3])
        second = _tick(defs, instance, COORDINATOR, first.cursor)
        assert second.run_requests
        batch = store.open_batch()
        assert batch is not None
        # Incremental from the start, not a snapshot: even though the target is missing.
        assert batch.inputs["audit"].describe() == "CDF [3, 3]"
        assert batch.full_load == ()
    finally:
        instance.dispose()


def test_a_terminal_failure_stops_the_batch_at_the_first_attempt(setup) -> None:
    defs, instance, store, _ = setup
    first = _tick(defs, instance, COORDINATOR)
    [request] = first.run_requests
    # A re-execution copies its parent's tags: a terminal tag naming another run is not
    # this run's verdict, so this plain failure is retried.
    copied = terminal_error_tags("another-run", "pipeline_a", UpstreamSchemaChangedError("x"))
    finished_run(instance, request, DagsterRunStatus.FAILURE, **copied)
    retried = _tick(defs, instance, COORDINATOR, first.cursor)
    [again] = retried.run_requests
    assert again.run_key == "b000001:2"

    run = finished_run(instance, again, DagsterRunStatus.FAILURE)
    error = UpstreamSchemaChangedError(
        "Upstream 'up1': column 'id' changed type.",
        upstream="up1",
        fix="adapt the pipelines, then run `watermark reset -t up1 --force`.",
    )
    instance.add_run_tags(run.run_id, terminal_error_tags(run.run_id, "pipeline_a", error))
    stuck = _tick(defs, instance, COORDINATOR, retried.cursor)
    assert not stuck.run_requests  # 2 failed runs of 3 allowed, but retrying cannot help
    reason = stuck.skip_message or ""
    assert "is stuck" in reason
    assert "UpstreamSchemaChangedError" in reason
    assert "watermark reset -t up1 --force" in reason
    assert "not retried" in reason
    [row] = [h for h in store.history() if h["event"] == "BATCH_STUCK"]
    detail = json.loads(row["detail"])
    assert detail["terminal"] is True
    assert detail["error"] == "UpstreamSchemaChangedError"
    # Later ticks stay stuck, and record it once.
    later = _tick(defs, instance, COORDINATOR, stuck.cursor)
    assert not later.run_requests
    assert "is stuck" in (later.skip_message or "")
    assert [h["event"] for h in store.history()].count("BATCH_STUCK") == 1


def test_resume_decisions() -> None:
    terminal = TerminalFailure("p", "UpstreamRecreatedError", "gone. Fix: reset.")
    assert decide_resume("b1", ["p"], failed_runs=0, max_attempts=3, terminal=None).run
    assert not decide_resume("b1", ["p"], failed_runs=3, max_attempts=3, terminal=None).run
    stop = decide_resume("b1", ["p"], failed_runs=1, max_attempts=3, terminal=terminal)
    assert not stop.run
    assert stop.stuck
    assert "Fix: reset." in stop.stuck


def _succeed(store: WatermarkStore, pipeline: str, batch_id: str) -> None:
    """The checkpoint a successful run of ``pipeline`` on ``batch_id`` records."""
    attempt = store.begin_checkpoint(pipeline, batch_id, run_id=None)
    store.finish_checkpoint(pipeline, batch_id, attempt, CheckpointStatus.SUCCESS, rows_read=0)


def test_the_finalizer_counts_success_checkpoints_not_materializations(setup) -> None:
    """Succeeded has one definition: a SUCCESS checkpoint for the batch. A materialization
    of the partition carrying the plan id, without the checkpoint, advances nothing."""
    defs, instance, store, _ = setup
    _tick(defs, instance, COORDINATOR)
    batch = store.open_batch()
    assert batch is not None
    for pipeline in batch.pipelines:
        instance.report_runless_asset_event(
            AssetMaterialization(
                asset_key=AssetKey(pipeline),
                partition=batch.batch_id,
                metadata={PLAN_ID_METADATA: batch.plan_id},
            )
        )
    waiting = _tick(defs, instance, FINALIZER)
    assert "waits for" in (waiting.skip_message or "")
    assert store.committed_versions() == {}

    # pipeline_a reads up1 and up2, pipeline_b up2 and up3: up1 alone can advance.
    _succeed(store, "pipeline_a", batch.batch_id)
    partly = _tick(defs, instance, FINALIZER)
    assert "up2 waits for ['pipeline_b']" in (partly.skip_message or "")
    assert store.committed_versions() == {"up1": 0}

    _succeed(store, "pipeline_b", batch.batch_id)
    done = _tick(defs, instance, FINALIZER)
    assert done.skip_message == f"batch {batch.batch_id} completed"
    assert store.committed_versions() == {"up1": 0, "up2": 0, "up3": 0}
    assert store.get_batch(batch.batch_id).status is BatchStatus.COMPLETED


def test_the_coordinator_requests_only_pipelines_without_a_success_checkpoint(setup) -> None:
    defs, instance, store, _ = setup
    first = _tick(defs, instance, COORDINATOR)
    _succeed(store, "pipeline_a", "b000001")
    again = _tick(defs, instance, COORDINATOR, first.cursor)
    [request] = again.run_requests
    assert [k.to_user_string() for k in request.asset_selection] == ["pipeline_b"]
    _succeed(store, "pipeline_b", "b000001")
    done = _tick(defs, instance, COORDINATOR, again.cursor)
    assert not done.run_requests
    assert done.skip_message == "batch b000001: all pipelines succeeded; finalizer's turn"


def _check(pipeline: str, batch_id: str, status: CheckpointStatus) -> Checkpoint:
    return Checkpoint(
        pipeline, batch_id, 1, status, None, None, None, datetime.now(UTC), None, None
    )


def test_succeeded_is_a_success_checkpoint_for_that_batch() -> None:
    rows = [
        _check("a", "b000002", CheckpointStatus.SUCCESS),
        _check("b", "b000002", CheckpointStatus.FAILED),
        _check("c", "b000002", CheckpointStatus.RUNNING),
        _check("d", "b000001", CheckpointStatus.SUCCESS),  # another batch
        _check("b", "b000002", CheckpointStatus.SUCCESS),  # b's second attempt
    ]
    assert succeeded_pipelines("b000002", rows) == {"a", "b"}
    assert succeeded_pipelines("b000003", rows) == frozenset()


def _batch(seq: int, kind: BatchKind = BatchKind.SCHEDULED) -> Batch:
    return Batch(
        batch_id=f"b{seq:06d}",
        seq=seq,
        kind=kind,
        plan_id="p",
        status=BatchStatus.COMPLETED,
        pipelines=("a",),
        inputs={},
        advanced=frozenset(),
        created_at=datetime.now(UTC),
        actor=None,
    )


@pytest.mark.parametrize(
    ("batch", "newest", "superseded"),
    [
        (_batch(2), None, False),  # the pipeline's first batch
        (_batch(2), _batch(1), False),  # the next batch
        (_batch(2), _batch(2), False),  # a retry of the batch it applied last
        (_batch(2), _batch(3), True),  # a backfill of an older batch (I5)
        (_batch(5, BatchKind.REPLAY), _batch(9), False),  # a replay writes at its position
    ],
    ids=["first", "next", "retry", "backfill", "replay"],
)
def test_which_batch_a_pipeline_may_apply(
    batch: Batch, newest: Batch | None, superseded: bool
) -> None:
    calls: list[int] = []

    def newest_applied() -> Batch | None:
        calls.append(1)
        return newest

    found = superseded_by(batch, newest_applied)
    assert (found is not None) is superseded
    assert found is (newest if superseded else None)
    # A replay is never superseded: the pipeline's history is not even read.
    assert bool(calls) is (batch.kind is not BatchKind.REPLAY)


TERMINAL = TerminalFailure("p", "UpstreamRecreatedError", "gone. Fix: reset.")
DIED_AT = 1_000_000.0


def _deaths(n: int) -> tuple[RunDeath, ...]:
    return tuple(RunDeath(f"run{i}", "killed by SIGKILL (signal 9)", DIED_AT) for i in range(n))


@pytest.mark.parametrize(
    ("todo", "facts", "retry", "action", "attempt"),
    [
        (["p"], BatchRunFacts(in_flight=("r1",), last_attempt=1), False, ResumeAction.WAIT, None),
        ([], BatchRunFacts(failed=1, last_attempt=1), False, ResumeAction.DONE, None),
        (["p"], BatchRunFacts(), False, ResumeAction.RUN, 1),
        (["p"], BatchRunFacts(failed=2, last_attempt=2), False, ResumeAction.RUN, 3),
        (["p"], BatchRunFacts(failed=3, last_attempt=3), False, ResumeAction.STUCK, None),
        (
            ["p"],
            BatchRunFacts(failed=1, last_attempt=1, terminal=TERMINAL),
            False,
            ResumeAction.STUCK,
            None,
        ),
        (
            ["p"],
            BatchRunFacts(failed=3, last_attempt=3, terminal=TERMINAL),
            True,
            ResumeAction.RUN,
            4,
        ),
        (
            ["p"],
            BatchRunFacts(failed=2, last_attempt=4, deaths=_deaths(2), last_died=True),
            False,
            ResumeAction.RUN,
            5,
        ),
        (
            ["p"],
            BatchRunFacts(last_attempt=3, deaths=_deaths(3), last_died=True),
            False,
            ResumeAction.STUCK,
            None,
        ),
        (
            ["p"],
            BatchRunFacts(last_attempt=3, deaths=_deaths(3), last_died=True),
            True,
            ResumeAction.RUN,
            4,
        ),
    ],
    ids=[
        "in-flight",
        "all-succeeded",
        "first",
        "retry",
        "attempts-used",
        "terminal",
        "operator-retry",
        "deaths-spend-no-attempt",
        "deaths-used",
        "operator-retry-after-deaths",
    ],
)
def test_resume_steps(todo, facts, retry, action, attempt) -> None:
    policy = RetryPolicy(max_attempts=3, max_deaths=3, death_backoff_seconds=10)
    step = resume_step("b1", todo, facts, policy=policy, now=DIED_AT + 60, retry=retry)
    assert (step.action, step.attempt) == (action, attempt)
    assert step.is_stuck is (action is ResumeAction.STUCK)
    if step.is_stuck:
        assert step.stuck_key == f"b1:{facts.last_attempt}"
        assert "is stuck" in (step.reason or "")
        assert step.pipelines == tuple(todo)


def test_the_backoff_after_a_death_doubles_up_to_five_minutes() -> None:
    policy = RetryPolicy(death_backoff_seconds=10)
    assert [policy.backoff(n) for n in range(7)] == [0, 10, 20, 40, 80, 160, 300]
    assert RetryPolicy(death_backoff_seconds=0).backoff(5) == 0
    with pytest.raises(ValueError, match="max_deaths=0"):
        RetryPolicy(max_deaths=0)


def test_after_a_death_the_batch_waits_out_its_backoff() -> None:
    policy = RetryPolicy(death_backoff_seconds=10)
    facts = BatchRunFacts(last_attempt=2, deaths=_deaths(2), last_died=True)
    waiting = resume_step("b1", ["p"], facts, policy=policy, now=DIED_AT + 5)
    assert (waiting.action, waiting.retry_at) == (ResumeAction.WAIT, DIED_AT + 20)
    assert "killed by SIGKILL (signal 9)" in (waiting.reason or "")
    assert "requested again in 15 s (backoff)" in (waiting.reason or "")
    later = resume_step("b1", ["p"], facts, policy=policy, now=DIED_AT + 20)
    assert (later.action, later.attempt) == (ResumeAction.RUN, 3)
    # The newest run failed (raised): no backoff, whatever died before it.
    failed_last = BatchRunFacts(failed=1, last_attempt=3, deaths=_deaths(2), last_died=False)
    assert resume_step("b1", ["p"], failed_last, policy=policy, now=DIED_AT).action is (
        ResumeAction.RUN
    )


def test_runs_that_died_spend_no_attempt_and_stop_the_batch_only_at_max_deaths(
    setup, tmp_path: Path
) -> None:
    """One failed run and four that died, with max_attempts=2: the deaths are retried; the
    fourth death reaches max_deaths=4 and the batch is stuck with a reason naming them.
    Each death is recorded in history once, with what Dagster said of it."""
    _, instance, store, _ = setup
    settings = WatermarkSettings(
        min_batch_interval_seconds=0, max_attempts=2, max_deaths=4, death_backoff_seconds=0
    )
    defs = build_definitions(
        location_of(setup[0]).registry, control_root=str(tmp_path / "control"), settings=settings
    )
    result = _tick(defs, instance, COORDINATOR)
    [request] = result.run_requests
    finished_run(instance, request, DagsterRunStatus.FAILURE)
    for attempt in range(2, 6):
        result = _tick(defs, instance, COORDINATOR, result.cursor)
        [request] = result.run_requests
        assert request.run_key == f"b000001:{attempt}"  # not stuck at 2 runs: deaths
        died_run(instance, request, f"Run worker lost (attempt {attempt}).")
    stuck = _tick(defs, instance, COORDINATOR, result.cursor)
    assert not stuck.run_requests
    reason = stuck.skip_message or ""
    assert "its runs died 4 times (max_deaths=4) without raising an error" in reason
    assert "Run worker lost (attempt 5)." in reason  # newest first
    assert "out of memory" in reason
    again = _tick(defs, instance, COORDINATOR, stuck.cursor)
    assert not again.run_requests
    rows = sorted(store.history(), key=lambda h: h["at"])
    died = [json.loads(h["detail"])["how"] for h in rows if h["event"] == "RUN_DIED"]
    assert died == [f"Run worker lost (attempt {a})." for a in range(2, 6)]
    [row] = [json.loads(h["detail"]) for h in rows if h["event"] == "BATCH_STUCK"]
    assert (row["cause"], row["failed_runs"], len(row["deaths"])) == ("deaths", 1, 4)
    # What `watermark list`, `get` and `batch` show: a reason, and the fix apart from it.
    [shown] = stuck_batches(store, [store.open_batch()]).values()
    assert "its runs died 4 times" in shown["reason"]
    assert "out of memory" not in shown["reason"]
    assert "spark.driver.memory" in shown["fix"]


def test_a_run_whose_worker_is_gone_dies_and_waits_out_the_backoff(setup) -> None:
    """A started run whose worker process no longer exists is marked died (a crash), and the
    batch is requested again only after the backoff; a re-execution that copied the dead
    worker's tag from its parent is not taken for dead."""
    defs, instance, store, _ = setup
    first = _tick(defs, instance, COORDINATOR)
    [request] = first.run_requests
    identity = f"{socket.gethostname()}:{_ended_pid()}:-"
    run = create_run_for_test(
        instance,
        job_name="watermark_batch_job",
        status=DagsterRunStatus.STARTED,
        tags={
            **request.tags,
            PARTITION_NAME_TAG: request.partition_key,
            WORKER_TAG: identity,
            WORKER_RUN_TAG: "someone-else",  # copied from a parent run
        },
    )
    waiting = _tick(defs, instance, COORDINATOR, first.cursor)
    assert "in flight" in (waiting.skip_message or "")
    instance.add_run_tags(run.run_id, {WORKER_RUN_TAG: run.run_id})
    backoff = _tick(defs, instance, COORDINATOR, waiting.cursor)
    assert not backoff.run_requests
    assert "is gone" in (backoff.skip_message or "")
    assert "(backoff)" in (backoff.skip_message or "")
    assert CoordinatorCursor.parse(backoff.cursor).retry_at is not None
    assert instance.get_run_by_id(run.run_id).status is DagsterRunStatus.FAILURE
    [row] = [json.loads(h["detail"]) for h in store.history() if h["event"] == "RUN_DIED"]
    assert row["run_id"] == run.run_id
    assert identity in row["how"]


def test_a_killed_commands_watcher_marks_only_its_own_runs_died(
    setup, tmp_path: Path, dagster_home: Path
) -> None:
    """The watching process of a killed `watermark run` marks the runs its child executed
    as died; a re-execution that copied the child's worker tag from its parent is not one
    of them (it may be starting elsewhere)."""
    _, instance, _, _ = setup
    identity = f"{socket.gethostname()}:{_ended_pid()}:-"
    mine, copied = (
        create_run_for_test(
            instance,
            job_name="watermark_batch_job",
            status=DagsterRunStatus.STARTED,
            tags={PARTITION_NAME_TAG: "b000001", WORKER_TAG: identity, WORKER_RUN_TAG: run_of},
        )
        for run_of in ("self", "another-run")
    )
    instance.add_run_tags(mine.run_id, {WORKER_RUN_TAG: mine.run_id})
    args = argparse.Namespace(home=str(tmp_path / "wm"), command="run")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DAGSTER_HOME", str(dagster_home))
        supervise.mark_killed(args, identity, signal.SIGKILL)
    assert instance.get_run_by_id(mine.run_id).status is DagsterRunStatus.FAILURE
    assert "killed by SIGKILL (signal 9)" in instance.get_run_by_id(mine.run_id).tags[DIED_TAG]
    assert instance.get_run_by_id(copied.run_id).status is DagsterRunStatus.STARTED


def _ended_pid() -> int:
    """The pid of a child process that has ended and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_the_asset_graph_agrees_with_the_registry_consumers(setup) -> None:
    defs, _, _, _ = setup
    registry = location_of(defs).registry
    upstream_keys = {u: AssetKey(u) for u in registry.upstreams}
    specs = list(defs.resolve_all_asset_specs())
    check_consumers(registry, specs, upstream_keys)  # built from the registry: they agree
    assert registry.consumers("up2") == ("pipeline_a", "pipeline_b")
    assert registry.consumers("up1") == ("pipeline_a",)

    # A graph where pipeline_b no longer depends on up3 disagrees, and says so.
    cut = [
        s.replace_attributes(deps=[d for d in s.deps if d.asset_key != AssetKey("up3")])
        if s.key == AssetKey("pipeline_b")
        else s
        for s in specs
    ]
    with pytest.raises(ConfigurationError, match=r"Upstream 'up3'.*\[\].*\['pipeline_b'\]"):
        check_consumers(registry, cut, upstream_keys)
    # Assets that are not pipelines (no watermark/pipeline metadata) are not consumers.
    check_consumers(registry, [*specs, AssetSpec("report", deps=["up1"])], upstream_keys)


class _Prefixed(WatermarkTranslator):
    def get_asset_key(self, item):
        return AssetKey(["lake", item.name])

    def get_group_name(self, item) -> str:
        return "lake"

    def get_metadata(self, item):
        return {"owner": "data"}


def test_a_translator_renames_assets_and_the_adapters_follow(setup, tmp_path: Path) -> None:
    """Keys, groups and metadata come from the translator's get_* hooks; the sensors and
    the headless runner find pipeline assets by their watermark/pipeline metadata."""
    built, instance, _, _ = setup
    defs = build_definitions(
        location_of(built).registry,
        control_root=str(tmp_path / "control2"),
        settings=WatermarkSettings(min_batch_interval_seconds=0),
        translator=_Prefixed(),
    )
    specs = {s.key: s for s in defs.resolve_all_asset_specs()}
    assert AssetKey(["lake", "up1"]) in specs
    assert AssetKey(["lake", "pipeline_a"]) in specs
    pipeline_a = specs[AssetKey(["lake", "pipeline_a"])]
    assert pipeline_a.group_name == "lake"
    assert pipeline_a.metadata["owner"] == "data"
    assert "target" not in pipeline_a.metadata
    assert {d.asset_key for d in pipeline_a.deps} == {
        AssetKey(["lake", "up1"]),
        AssetKey(["lake", "up2"]),
    }
    runner = HeadlessRunner(defs, instance)
    assert runner.pipeline_key("pipeline_a") == AssetKey(["lake", "pipeline_a"])
    with pytest.raises(KeyError, match="no pipeline asset named 'up1'"):
        runner.pipeline_key("up1")
    [request] = _tick(defs, instance, COORDINATOR).run_requests
    assert sorted(k.to_user_string() for k in request.asset_selection) == [
        "lake/pipeline_a",
        "lake/pipeline_b",
    ]


def test_a_run_failing_with_our_error_reports_it_with_its_fix(setup) -> None:
    """A WatermarkError reaches Dagster as a Failure carrying its class; the headless runner
    reports its own message (not Dagster's wrapper), and a terminal one tags the run."""
    defs, instance, store, _ = setup
    planned = _tick(defs, instance, COORDINATOR)
    [request] = planned.run_requests
    instance.add_dynamic_partitions("watermark_batches", ["b000001"])
    store.set_batch_status("b000001", BatchStatus.ABANDONED, actor="test")
    runner = HeadlessRunner(defs, instance)
    report = CycleReport()
    runner.execute_requests(SensorResult(run_requests=[request]), report)  # decided: no JVM
    [run] = report.runs
    assert not run.success
    assert (run.error or "").startswith(
        "pipeline_a: BatchStateError: Batch b000001 was abandoned; pipeline 'pipeline_a' will "
        "not run it."
    ), run.error
    tags = instance.get_run_by_id(run.run_id).tags
    assert json.loads(tags["watermark/terminal_error"])["error"] == "BatchStateError"


def test_a_pipeline_the_batch_did_not_need_is_materialized_as_nothing_to_do(setup) -> None:
    """When a batch completes, the finalizer records each pipeline it did not need as
    materialized with nothing to do (no run), so the partition is never shown missing; the
    pipelines it needed get nothing from the finalizer (their runs materialize them)."""
    defs, instance, store, ups = setup
    first = _tick(defs, instance, COORDINATOR)
    for pipeline in ("pipeline_a", "pipeline_b"):
        _succeed(store, pipeline, "b000001")
    done = _tick(defs, instance, FINALIZER)
    assert not [e for e in done.asset_events if isinstance(e, AssetMaterialization)]

    _commit(ups["up1"], [3])  # only pipeline_a reads up1
    second = _tick(defs, instance, COORDINATOR, first.cursor)
    batch = store.open_batch()
    assert batch is not None
    assert batch.pipelines == ("pipeline_a",)
    assert second.run_requests
    _succeed(store, "pipeline_a", batch.batch_id)
    completed = _tick(defs, instance, FINALIZER)
    assert completed.skip_message == f"batch {batch.batch_id} completed"
    [nothing] = [e for e in completed.asset_events if isinstance(e, AssetMaterialization)]
    assert nothing.asset_key == AssetKey("pipeline_b")
    assert nothing.partition == batch.batch_id
    meta = {k: getattr(v, "value", v) for k, v in nothing.metadata.items()}
    assert meta["skip_kind"] == "not_in_batch"
    assert meta["batch_id"] == batch.batch_id
    assert meta[PLAN_ID_METADATA] == batch.plan_id


def test_upstream_observations_carry_no_dagster_data_version(setup) -> None:
    """A batch partition's inputs are its pinned ranges: an upstream's newer version must
    not make completed partitions look unsynced, so observations carry the Delta version as
    metadata only."""
    defs, instance, _, _ = setup
    result = _tick(defs, instance, COORDINATOR)
    observed = [e for e in result.asset_events if isinstance(e, AssetObservation)]
    assert observed
    for event in observed:
        assert "dagster/data_version" not in (event.tags or {})
        assert isinstance(event.metadata["latest_version"].value, int)
        assert "committed_version" not in event.metadata  # nothing committed yet: left out


def test_the_first_look_reports_the_retention_checks_then_leaves_them_to_the_schedule(
    setup,
) -> None:
    """A new deployment shows retention_horizon evaluated at once, without a click or
    waiting for the hourly schedule; later ticks do not repeat it."""
    defs, instance, store, _ = setup
    first = _tick(defs, instance, COORDINATOR)
    retention = [
        e
        for e in first.asset_events
        if isinstance(e, AssetCheckEvaluation) and e.check_name == "retention_horizon"
    ]
    assert sorted((e.asset_key.to_user_string(), e.passed) for e in retention) == [
        ("up1", True),
        ("up2", True),
        ("up3", True),
    ]
    planned = store.open_batch()
    assert planned is not None
    for upstream in planned.ranged_upstreams:
        store.advance(planned, upstream, actor="test")
    store.set_batch_status(planned.batch_id, BatchStatus.COMPLETED, actor="test")
    again = _tick(defs, instance, COORDINATOR, first.cursor)
    assert not [
        e
        for e in again.asset_events
        if isinstance(e, AssetCheckEvaluation) and e.check_name == "retention_horizon"
    ]


def test_range_metadata_is_numeric_or_left_out() -> None:
    """Plots need numbers: a snapshot starts at 0, a NOOP input has no start, a cursor
    window no versions; never the text "none"."""
    from watermark_dagster.dagster_defs.pipeline_outcomes import outcome_metadata
    from watermark_dagster.operations.decide import InputReport, PipelineOutcome

    reports = (
        InputReport("snap", "SNAPSHOT", None, 4, rows_read=3),
        InputReport("idle", "NOOP", None, 7, rows_read=0),
        InputReport("cdf", "CDF", 5, 6, rows_read=2),
        InputReport("events", "TIMESTAMP", None, None, rows_read=1, window="(a, b]"),
    )
    meta = outcome_metadata(PipelineOutcome("a", _batch(1), 1, reports, None))
    versions = {k: v.value for k, v in meta.items() if k.endswith("_version")}
    assert versions == {
        "snap/start_version": 0,
        "snap/end_version": 4,
        "idle/end_version": 7,
        "cdf/start_version": 5,
        "cdf/end_version": 6,
    }
    assert not [k for k, v in meta.items() if v == "none"]
