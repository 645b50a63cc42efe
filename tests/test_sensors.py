"""The coordinator and finalizer sensors against a real Dagster instance, without a JVM.

Upstreams are real Delta tables written with delta-rs; no pipeline runs here (the Spark
tests run them), so these tests look at what the sensors plan, request and refuse.
"""

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetObservation,
    DagsterInstance,
    DagsterRunStatus,
    build_sensor_context,
)
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.tags import PARTITION_NAME_TAG
from dagster._core.test_utils import create_run_for_test
from deltalake import write_deltalake

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.planning import TerminalFailure, decide_resume
from watermark_dagster.core.records import BatchStatus
from watermark_dagster.dagster_defs.definitions import build_definitions, registry_of
from watermark_dagster.dagster_defs.runs import terminal_error_tags
from watermark_dagster.dagster_defs.sensors import COORDINATOR, FINALIZER, WatermarkSettings
from watermark_dagster.errors import UpstreamSchemaChangedError
from watermark_dagster.store import WatermarkStore


def _never_called(batch):  # noqa: ANN001, ANN202
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


def _tick(defs, instance, name: str, cursor: str | None = None):  # noqa: ANN001, ANN202
    with build_sensor_context(
        instance_ref=instance.get_ref(),
        definitions=defs,
        sensor_name=name,
        cursor=cursor,
        resources=dict(defs.resources),
    ) as context:
        return defs.resolve_sensor_def(name).evaluate_tick(context)


def test_coordinator_plans_adds_partition_and_requests_one_run(setup) -> None:  # noqa: ANN001
    defs, instance, store, _ = setup
    result = _tick(defs, instance, COORDINATOR)
    [request] = result.run_requests
    assert request.partition_key == "b000001"
    assert request.run_key == "b000001:1"
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
    checks = [e for e in events if isinstance(e, AssetCheckEvaluation)]
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


def test_open_batch_is_resumed_not_replanned(setup) -> None:  # noqa: ANN001
    defs, instance, store, ups = setup
    first = _tick(defs, instance, COORDINATOR)
    instance.add_dynamic_partitions("watermark_batches", ["b000001"])
    _commit(ups["up1"], [3])  # new data arrives while the batch is open
    again = _tick(defs, instance, COORDINATOR, first.cursor)
    assert len(store.batches()) == 1
    [request] = again.run_requests  # no run exists yet: the same batch is requested again
    assert request.partition_key == "b000001"
    assert not again.dynamic_partitions_requests


def test_finalizer_waits_for_the_pipelines(setup) -> None:  # noqa: ANN001
    defs, instance, store, _ = setup
    _tick(defs, instance, COORDINATOR)
    result = _tick(defs, instance, FINALIZER)
    assert "waits for" in (result.skip_message or "")
    assert store.committed_versions() == {}


def test_nothing_new_plans_nothing(setup) -> None:  # noqa: ANN001
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


def test_default_settings_plan_the_next_batch_at_once(setup, monkeypatch) -> None:  # noqa: ANN001
    """A code location built without settings uses the same minimum interval as the
    environment's default (0): new commits right after a batch are planned at once."""
    from watermark_dagster.config import env

    monkeypatch.delenv("WATERMARK_MIN_BATCH_INTERVAL_SECONDS", raising=False)
    assert WatermarkSettings().min_batch_interval_seconds == env.min_batch_interval_seconds()
    assert env.min_batch_interval_seconds() == 0
    built, instance, store, ups = setup
    defs = build_definitions(registry_of(built), control_root=store.root)  # default settings
    first = _tick(defs, instance, COORDINATOR)
    planned = store.open_batch()
    assert first.run_requests and planned is not None
    for upstream in planned.ranged_upstreams:
        store.advance(planned, upstream, actor="test")
    store.set_batch_status(planned.batch_id, BatchStatus.COMPLETED, actor="test")
    _commit(ups["up1"], [3])
    second = _tick(defs, instance, COORDINATOR, first.cursor)
    assert second.run_requests, second.skip_message
    assert sorted(b.batch_id for b in store.batches()) == ["b000001", "b000002"]


def test_two_coordinator_ticks_at_once_create_one_batch(setup) -> None:  # noqa: ANN001
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
def test_a_submitted_run_is_in_flight_until_it_finishes(setup, status) -> None:  # noqa: ANN001
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


def test_failed_and_canceled_runs_are_resubmitted_until_max_attempts(setup) -> None:  # noqa: ANN001
    defs, instance, store, _ = setup
    cursor = None
    outcomes = [DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE]
    for attempt, status in enumerate(outcomes, start=1):
        result = _tick(defs, instance, COORDINATOR, cursor)
        cursor = result.cursor
        [request] = result.run_requests
        assert request.run_key == f"b000001:{attempt}"
        create_run_for_test(
            instance,
            job_name="watermark_batch_job",
            status=status,
            tags={**request.tags, PARTITION_NAME_TAG: request.partition_key},
        )
    stuck = _tick(defs, instance, COORDINATOR, cursor)
    assert not stuck.run_requests
    assert "is stuck: 3 failed runs" in (stuck.skip_message or "")
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


def test_a_terminal_failure_stops_the_batch_at_the_first_attempt(setup) -> None:  # noqa: ANN001
    defs, instance, store, _ = setup
    first = _tick(defs, instance, COORDINATOR)
    [request] = first.run_requests
    # A re-execution copies its parent's tags: a terminal tag naming another run is not
    # this run's verdict, so this plain failure is retried.
    copied = terminal_error_tags("another-run", "pipeline_a", UpstreamSchemaChangedError("x"))
    create_run_for_test(
        instance,
        job_name="watermark_batch_job",
        status=DagsterRunStatus.FAILURE,
        tags={**request.tags, PARTITION_NAME_TAG: request.partition_key, **copied},
    )
    retried = _tick(defs, instance, COORDINATOR, first.cursor)
    [again] = retried.run_requests
    assert again.run_key == "b000001:2"

    run = create_run_for_test(
        instance,
        job_name="watermark_batch_job",
        status=DagsterRunStatus.FAILURE,
        tags={**again.tags, PARTITION_NAME_TAG: again.partition_key},
    )
    error = UpstreamSchemaChangedError(
        "Upstream 'up1': column 'id' changed type.",
        upstream="up1",
        fix="adapt the pipelines, then run `watermark reset -t up1 --force`.",
    )
    instance.add_run_tags(run.run_id, terminal_error_tags(run.run_id, "pipeline_a", error))
    stuck = _tick(defs, instance, COORDINATOR, retried.cursor)
    assert not stuck.run_requests  # 2 failed runs of 3 allowed, but retrying cannot help
    reason = stuck.skip_message or ""
    assert "is stuck" in reason and "UpstreamSchemaChangedError" in reason
    assert "watermark reset -t up1 --force" in reason and "not retried" in reason
    [row] = [h for h in store.history() if h["event"] == "BATCH_STUCK"]
    detail = json.loads(row["detail"])
    assert detail["terminal"] is True and detail["error"] == "UpstreamSchemaChangedError"
    # Later ticks stay stuck, and record it once.
    later = _tick(defs, instance, COORDINATOR, stuck.cursor)
    assert not later.run_requests and "is stuck" in (later.skip_message or "")
    assert [h["event"] for h in store.history()].count("BATCH_STUCK") == 1


def test_resume_decisions() -> None:
    terminal = TerminalFailure("p", "UpstreamRecreatedError", "gone. Fix: reset.")
    assert decide_resume("b1", ["p"], failed_runs=0, max_attempts=3, terminal=None).run
    assert not decide_resume("b1", ["p"], failed_runs=3, max_attempts=3, terminal=None).run
    stop = decide_resume("b1", ["p"], failed_runs=1, max_attempts=3, terminal=terminal)
    assert not stop.run and stop.stuck and "Fix: reset." in stop.stuck
