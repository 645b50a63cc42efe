"""Lag and health as Dagster signals, on a real instance without a JVM.

Upstreams are real Delta tables written with delta-rs; the coordinator is ticked with
``build_sensor_context`` on a temporary ``DAGSTER_HOME``; pipeline runs are stood in for
by Dagster run records (failed attempts) and SUCCESS checkpoints, as in test_sensors.py.
Time is controlled through the settings (thresholds and cadence), never by sleeping.
"""

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetSelection,
    DagsterInstance,
    DagsterRunStatus,
    DefaultScheduleStatus,
    Definitions,
    FreshnessPolicy,
    build_schedule_context,
    build_sensor_context,
    define_asset_job,
    job,
    op,
)
from dagster._core.instance.ref import InstanceRef
from dagster._core.loader import LoadingContextForTest
from dagster._core.storage.tags import PARTITION_NAME_TAG
from deltalake import DeltaTable, write_deltalake

from tests.support.runs import finished_run
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.records import BatchStatus, CheckpointStatus
from watermark_dagster.dagster_defs.checks import RETENTION_CHECK
from watermark_dagster.dagster_defs.definitions import BATCH_JOB, build_definitions
from watermark_dagster.dagster_defs.health import HealthSettings
from watermark_dagster.dagster_defs.health_lag import LAG_CHECK
from watermark_dagster.dagster_defs.health_stuck import STUCK_CHECK
from watermark_dagster.dagster_defs.names import RETENTION_JOB, RETENTION_SCHEDULE
from watermark_dagster.dagster_defs.sensors import COORDINATOR
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.store import WatermarkStore

PIPELINES = {"pipeline_a": ("up1", "up2"), "pipeline_b": ("up2",)}


def _never_called(batch):
    raise AssertionError("no pipeline runs in these tests")


def _commit(path: Path, ids: list[int]) -> None:
    table = pa.table({"id": pa.array(ids, pa.int64())})
    write_deltalake(
        str(path), table, mode="append", configuration={"delta.enableChangeDataFeed": "true"}
    )


@dataclass
class Lake:
    root: Path
    registry: Registry
    instance: DagsterInstance
    store: WatermarkStore
    ups: dict[str, Path]

    def defs(self, **settings) -> Definitions:
        health = settings.pop("health", HealthSettings())
        return build_definitions(
            self.registry,
            control_root=str(self.root / "control"),
            settings=WatermarkSettings(min_batch_interval_seconds=0, health=health, **settings),
        )


@pytest.fixture
def lake(tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    ups = {name: tmp_path / name for name in ("up1", "up2")}
    for path in ups.values():
        _commit(path, [1])
    for target in ("a", "b"):  # as their first runs would have left them
        _commit(tmp_path / target, [0])
    registry = Registry(
        upstreams=[DeltaUpstream(name=n, path=str(p)) for n, p in ups.items()],
        pipelines=[
            Pipeline(
                name=name,
                upstreams=reads,
                target=str(tmp_path / name[-1]),
                keys=("id",),
                transform=_never_called,
            )
            for name, reads in PIPELINES.items()
        ],
    )
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        yield Lake(tmp_path, registry, instance, WatermarkStore(tmp_path / "control"), ups)
    finally:
        instance.dispose()


def _tick(defs: Definitions, instance: DagsterInstance, cursor: str | None = None):
    with build_sensor_context(
        instance_ref=instance.get_ref(),
        definitions=defs,
        sensor_name=COORDINATOR,
        cursor=cursor,
        resources=dict(defs.resources or {}),
    ) as context:
        return defs.resolve_sensor_def(COORDINATOR).evaluate_tick(context)


def _checks(result, name: str) -> dict[str, AssetCheckEvaluation]:
    found = [
        e
        for e in result.asset_events
        if isinstance(e, AssetCheckEvaluation) and e.check_name == name
    ]
    return {e.asset_key.to_user_string(): e for e in found}


def _observed(result) -> dict[str, AssetObservation]:
    return {
        e.asset_key.to_user_string(): e
        for e in result.asset_events
        if isinstance(e, AssetObservation)
    }


def _finish(store: WatermarkStore) -> None:
    """Every pipeline of the open batch succeeded and the finalizer advanced it."""
    batch = store.open_batch()
    assert batch is not None
    for pipeline in batch.pipelines:
        attempt = store.begin_checkpoint(pipeline, batch.batch_id, run_id=None)
        store.finish_checkpoint(
            pipeline, batch.batch_id, attempt, CheckpointStatus.SUCCESS, rows_read=0
        )
    for upstream in batch.ranged_upstreams:
        store.advance(batch, upstream, actor="test")
    store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="test")


def _value(meta, key: str):
    return meta[key].value


def test_the_lag_check_fails_while_nothing_consumes_and_passes_after_catching_up(
    lake: Lake,
) -> None:
    defs = lake.defs(
        health=HealthSettings(lag_max_versions=2, lag_max_seconds=0, observe_every_seconds=3600)
    )
    first = _tick(defs, lake.instance)
    assert first.run_requests  # batch 1 reads version 0 of each upstream
    lag = _checks(first, LAG_CHECK)
    assert {k: e.passed for k, e in lag.items()} == {"up1": True, "up2": True}
    assert _value(lag["up1"].metadata, "lag_versions") == 1  # nothing committed: version 0

    # Three commits arrive while batch 1 is open (nothing consumes them).
    for i in range(3):
        _commit(lake.ups["up1"], [10 + i])
    held = _tick(defs, lake.instance, first.cursor)
    lag = _checks(held, LAG_CHECK)
    assert set(lag) == {"up1"}  # up2 did not move and its outcome did not change
    assert not lag["up1"].passed
    assert _value(lag["up1"].metadata, "lag_versions") == 4
    assert _value(lag["up1"].metadata, "latest_version") == 3
    assert "4 version(s) behind" in (lag["up1"].description or "")
    assert "watermark_coordinator" in (lag["up1"].description or "")  # what to look at
    # The observation of the moved upstream rides along, its lag numeric.
    assert set(_observed(held)) == {"up1"}

    # Unchanged: nothing is reported again until the cadence is due.
    again = _tick(defs, lake.instance, held.cursor)
    assert not _checks(again, LAG_CHECK)
    assert not _observed(again)

    # Batch 1 completes; batch 2 reads versions 1..3; once it completes, up1 caught up.
    _finish(lake.store)
    second = _tick(defs, lake.instance, again.cursor)
    assert second.run_requests
    assert "up1" not in _checks(second, LAG_CHECK)  # still failing while batch 2 runs
    _finish(lake.store)
    caught_up = _tick(defs, lake.instance, second.cursor)
    lag = _checks(caught_up, LAG_CHECK)
    assert lag["up1"].passed
    assert _value(lag["up1"].metadata, "lag_versions") == 0
    assert _value(lag["up1"].metadata, "committed_version") == 3
    assert "caught up" in (lag["up1"].description or "")


def test_the_lag_check_measures_the_age_of_the_oldest_unconsumed_commit(lake: Lake) -> None:
    # No version bound; any unconsumed commit older than a millisecond is too old.
    defs = lake.defs(
        health=HealthSettings(lag_max_versions=0, lag_max_seconds=0.001, observe_every_seconds=0)
    )
    first = _tick(defs, lake.instance)
    _finish(lake.store)  # version 0 of both is committed
    _commit(lake.ups["up2"], [5])
    _commit(lake.ups["up2"], [6])
    result = _tick(defs, lake.instance, first.cursor)
    lag = _checks(result, LAG_CHECK)
    assert lag["up1"].passed
    assert not lag["up2"].passed
    meta = lag["up2"].metadata
    commit_ms = next(
        h["timestamp"] for h in DeltaTable(str(lake.ups["up2"])).history() if h["version"] == 1
    )
    assert _value(meta, "oldest_unconsumed_commit") == commit_ms / 1000
    age = _value(meta, "lag_seconds")
    assert isinstance(age, float)
    assert age > 0
    assert "oldest unconsumed commit is" in (lag["up2"].description or "")
    # The observation carries the same age as a number.
    obs = _observed(result)["up2"]
    assert isinstance(_value(obs.metadata, "lag_seconds"), float)


def test_observations_are_reported_on_the_cadence_when_nothing_moved(lake: Lake) -> None:
    steady = lake.defs(health=HealthSettings(observe_every_seconds=0))
    sparse = lake.defs(health=HealthSettings(observe_every_seconds=3600))
    first = _tick(steady, lake.instance)
    _finish(lake.store)
    # Nothing moved since: the default-like cadence reports nothing...
    quiet = _tick(sparse, lake.instance, first.cursor)
    assert not _observed(quiet)
    assert not _checks(quiet, LAG_CHECK)
    # ...while a due cadence reports every upstream, with its lag check.
    due = _tick(steady, lake.instance, quiet.cursor)
    assert set(_observed(due)) == {"up1", "up2"}
    assert {k: e.passed for k, e in _checks(due, LAG_CHECK).items()} == {
        "up1": True,
        "up2": True,
    }
    assert "no upstream has new versions" in (due.skip_message or "")
    # The cursor keeps one report time per upstream, no history.
    assert '"observed_at": {"up1"' in (due.cursor or "")


def _fail_attempts(lake: Lake, defs: Definitions, attempts: int):
    cursor = None
    for attempt in range(1, attempts + 1):
        result = _tick(defs, lake.instance, cursor)
        cursor = result.cursor
        [request] = result.run_requests or []
        assert (request.run_key or "").endswith(f":{attempt}")
        finished_run(lake.instance, request, DagsterRunStatus.FAILURE, job_name=BATCH_JOB)
    return cursor


def test_the_stuck_check_fails_while_the_batch_is_stuck_and_passes_once_fixed(
    lake: Lake,
) -> None:
    defs = lake.defs(max_attempts=2)
    cursor = _fail_attempts(lake, defs, 2)
    stuck = _tick(defs, lake.instance, cursor)
    assert not stuck.run_requests
    checks = _checks(stuck, STUCK_CHECK)
    assert {k: e.passed for k, e in checks.items()} == {
        "pipeline_a": False,
        "pipeline_b": False,
    }
    failing = checks["pipeline_a"]
    text = failing.description or ""
    assert "b000001" in text
    assert "pipeline_a" in text
    assert "2 failed runs" in text  # the error the coordinator gave up on
    assert "watermark run --retry" in text  # the fix
    assert failing.metadata["batch_id"].value == "b000001"
    assert failing.metadata["failed_runs"].value == 2

    # Reported once per stuck state, not per tick.
    later = _tick(defs, lake.instance, stuck.cursor)
    assert not _checks(later, STUCK_CHECK)

    # The operator fixes the cause and reruns the batch: its pipelines succeed.
    batch = lake.store.open_batch()
    assert batch is not None
    for pipeline in batch.pipelines:
        attempt = lake.store.begin_checkpoint(pipeline, batch.batch_id, run_id=None)
        lake.store.finish_checkpoint(
            pipeline, batch.batch_id, attempt, CheckpointStatus.SUCCESS, rows_read=0
        )
    fixed = _tick(defs, lake.instance, later.cursor)
    assert {k: e.passed for k, e in _checks(fixed, STUCK_CHECK).items()} == {
        "pipeline_a": True,
        "pipeline_b": True,
    }


def _run_checks(defs: Definitions, instance: DagsterInstance, check: str) -> dict[str, bool]:
    """Run checks as the UI's *Execute* does: a run of the check ops alone."""
    keys = [k for k in defs.resolve_asset_graph().asset_check_keys if k.name == check]
    job = define_asset_job("ui_checks", selection=AssetSelection.checks(*keys))
    merged = Definitions.merge(defs, Definitions(jobs=[job]))
    result = merged.resolve_job_def("ui_checks").execute_in_process(instance=instance)
    assert result.success
    assert not result.get_asset_materialization_events()
    return {e.asset_key.to_user_string(): e.passed for e in result.get_asset_check_evaluations()}


def test_the_checks_run_from_the_ui_agree_with_the_coordinator(lake: Lake) -> None:
    defs = lake.defs(max_attempts=1, health=HealthSettings(lag_max_versions=1))
    cursor = _fail_attempts(lake, defs, 1)
    _tick(defs, lake.instance, cursor)
    _commit(lake.ups["up1"], [7])  # up1: versions 0 and 1 unconsumed, over the bound
    assert _run_checks(defs, lake.instance, STUCK_CHECK) == {
        "pipeline_a": False,
        "pipeline_b": False,
    }
    assert _run_checks(defs, lake.instance, LAG_CHECK) == {"up1": False, "up2": True}
    _finish(lake.store)
    assert _run_checks(defs, lake.instance, STUCK_CHECK) == {
        "pipeline_a": True,
        "pipeline_b": True,
    }


def test_the_retention_checks_run_on_a_schedule_shipped_running(lake: Lake) -> None:
    defs = lake.defs(health=HealthSettings(retention_check_cron="*/5 * * * *"))
    schedule = defs.resolve_schedule_def(RETENTION_SCHEDULE)
    assert schedule.default_status is DefaultScheduleStatus.RUNNING
    assert schedule.cron_schedule == "*/5 * * * *"
    assert schedule.job_name == RETENTION_JOB
    # Its job holds the retention checks alone: no asset, so no pipeline run and no JVM.
    job = defs.resolve_job_def(RETENTION_JOB)
    assert _job_entities(defs, RETENTION_JOB) == (
        set(),
        {f"up1:{RETENTION_CHECK}", f"up2:{RETENTION_CHECK}"},
    )
    with build_schedule_context(instance=lake.instance) as context:
        [request] = schedule.evaluate_tick(context).run_requests or []
    assert not request.asset_selection
    # What its run does: evaluates the checks, materializes nothing.
    result = job.execute_in_process(instance=lake.instance)
    assert result.success
    assert not result.get_asset_materialization_events()
    evaluations = result.get_asset_check_evaluations()
    assert sorted((e.asset_key.to_user_string(), e.check_name) for e in evaluations) == [
        ("up1", RETENTION_CHECK),
        ("up2", RETENTION_CHECK),
    ]


def _job_entities(defs: Definitions, name: str) -> tuple[set[str], set[str]]:
    """The assets and the checks a job's runs execute."""
    layer = defs.resolve_job_def(name).asset_layer
    assets = {k.to_user_string() for k in layer.selected_asset_keys}
    checks = {k.to_user_string() for d in layer.data for k in d.assets_def.check_keys}
    return assets, checks


def test_batch_runs_execute_the_pipelines_without_the_checks(lake: Lake) -> None:
    """The stuck-batch checks sit on the pipeline assets; a batch run (daemon or
    headless) still executes the pipelines alone."""
    defs = lake.defs()
    assert _job_entities(defs, BATCH_JOB) == ({"pipeline_a", "pipeline_b"}, set())
    graph_checks = {k.to_user_string() for k in defs.resolve_asset_graph().asset_check_keys}
    assert {f"pipeline_a:{STUCK_CHECK}", f"pipeline_b:{STUCK_CHECK}"} <= graph_checks


def test_pipelines_carry_the_freshness_policy_of_the_settings(lake: Lake) -> None:
    specs = {s.key.to_user_string(): s for s in lake.defs().resolve_all_asset_specs()}
    day = FreshnessPolicy.time_window(fail_window=timedelta(days=1))
    assert specs["pipeline_a"].freshness_policy == day
    assert specs["pipeline_b"].freshness_policy == day
    assert specs["up1"].freshness_policy is None  # upstreams are not ours to keep fresh
    off = lake.defs(health=HealthSettings(freshness_fail_after_seconds=0))
    assert all(s.freshness_policy is None for s in off.resolve_all_asset_specs())


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("lag_max_versions", -1, "WATERMARK_LAG_MAX_VERSIONS"),
        ("lag_max_versions", 1.5, "WATERMARK_LAG_MAX_VERSIONS"),
        ("lag_max_seconds", -5, "WATERMARK_LAG_MAX_SECONDS"),
        ("observe_every_seconds", "often", "WATERMARK_OBSERVE_EVERY_SECONDS"),
        ("freshness_fail_after_seconds", 30, "WATERMARK_FRESHNESS_FAIL_AFTER_SECONDS"),
        ("retention_check_cron", "every hour", "WATERMARK_RETENTION_CHECK_CRON"),
    ],
)
def test_bad_health_settings_are_refused_naming_the_value_and_the_fix(
    field: str, value: object, named: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        HealthSettings(**{field: value})  # type: ignore[arg-type]
    assert f"{field}={value!r}" in str(refused.value)
    assert named in (refused.value.fix or "")


def test_the_environment_sets_the_health_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from watermark_dagster.definitions import build_demo_location

    monkeypatch.setenv("WATERMARK_FRESHNESS_FAIL_AFTER_SECONDS", "7200")
    monkeypatch.setenv("WATERMARK_RETENTION_CHECK_CRON", "*/10 * * * *")
    defs = build_demo_location(tmp_path).definitions
    assert defs.resolve_schedule_def(RETENTION_SCHEDULE).cron_schedule == "*/10 * * * *"
    fresh = [s.freshness_policy for s in defs.resolve_all_asset_specs() if s.freshness_policy]
    assert fresh
    assert set(fresh) == {FreshnessPolicy.time_window(fail_window=timedelta(hours=2))}
    monkeypatch.setenv("WATERMARK_LAG_MAX_VERSIONS", "many")
    with pytest.raises(ConfigurationError, match="WATERMARK_LAG_MAX_VERSIONS"):
        build_demo_location(tmp_path)


def test_a_stuck_batch_names_the_error_of_its_last_failed_run(lake: Lake) -> None:
    defs = lake.defs(max_attempts=1)
    first = _tick(defs, lake.instance)
    [request] = first.run_requests or []

    @op(name="pipeline_a")
    def broken() -> None:
        raise RuntimeError("the transform broke: no column 'amount'")

    @job(name=BATCH_JOB)
    def failed_batch_run() -> None:
        broken()

    # A real failed run of the batch, recorded with its step failure as Dagster does.
    outcome = failed_batch_run.execute_in_process(
        instance=lake.instance,
        tags={**request.tags, PARTITION_NAME_TAG: request.partition_key or ""},
        raise_on_error=False,
    )
    assert not outcome.success
    stuck = _tick(defs, lake.instance, first.cursor)
    failing = _checks(stuck, STUCK_CHECK)["pipeline_a"]
    assert not failing.passed
    assert "RuntimeError: the transform broke: no column 'amount'" in (failing.description or "")
    assert "the transform broke" in str(failing.metadata["error"].value)


def test_the_stuck_check_passes_again_after_each_batch_so_it_is_never_not_evaluated(
    lake: Lake,
) -> None:
    defs = lake.defs()
    first = _tick(defs, lake.instance)  # plans b000001
    assert {k: e.passed for k, e in _checks(first, STUCK_CHECK).items()} == {
        "pipeline_a": True,
        "pipeline_b": True,
    }
    # The batch's runs materialize its partitions (stood in for), then it ends.
    lake.instance.add_dynamic_partitions("watermark_batches", ["b000001"])
    for pipeline in PIPELINES:
        lake.instance.report_runless_asset_event(
            AssetMaterialization(pipeline, partition="b000001")
        )
    _finish(lake.store)

    after = _tick(defs, lake.instance, first.cursor)
    checks = _checks(after, STUCK_CHECK)
    assert {k: e.passed for k, e in checks.items()} == {"pipeline_a": True, "pipeline_b": True}
    assert "b000001 ended" in (checks["pipeline_a"].description or "")
    # Recorded as the daemon records a tick's events, each names the pipeline's latest
    # materialization: the UI shows it for that one, not "Not evaluated". (Matched by
    # timestamp instead, a result within the second of the materialization would not be:
    # SQLite keeps a check execution's time to the second.)
    for evaluation in checks.values():
        lake.instance.report_runless_asset_event(evaluation)
    for pipeline in PIPELINES:
        key = AssetCheckKey(AssetKey(pipeline), STUCK_CHECK)
        record = lake.instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        [materialized] = lake.instance.fetch_materializations(AssetKey(pipeline), limit=1).records
        target = record.evaluation and record.evaluation.target_materialization_data
        assert target is not None
        assert target.storage_id == materialized.storage_id
        # What the UI's executionForLatestMaterialization asks.
        context = LoadingContextForTest(lake.instance)
        assert asyncio.run(record.targets_latest_materialization(context))
    # Then quiet until something changes.
    assert not _checks(_tick(defs, lake.instance, after.cursor), STUCK_CHECK)


def test_a_stuck_check_behind_a_newer_materialization_is_reported_again(lake: Lake) -> None:
    defs = lake.defs()
    first = _tick(defs, lake.instance)  # plans b000001
    lake.instance.add_dynamic_partitions("watermark_batches", ["b000001"])
    for pipeline in PIPELINES:
        lake.instance.report_runless_asset_event(
            AssetMaterialization(pipeline, partition="b000001")
        )
    _finish(lake.store)
    ended = _tick(defs, lake.instance, first.cursor)
    for evaluation in _checks(ended, STUCK_CHECK).values():
        lake.instance.report_runless_asset_event(evaluation)
    quiet = _tick(defs, lake.instance, ended.cursor)
    assert not _checks(quiet, STUCK_CHECK)

    # pipeline_a gets a newer materialization that no execution of its check belongs to,
    # as when a backfill's runs of it end in another order than they started (Dagster
    # takes the last started run's execution for the newest): the UI would show the check
    # "Not evaluated". The next tick reports it again, for that materialization, though
    # its outcome did not change; pipeline_b's is left alone.
    lake.instance.report_runless_asset_event(
        AssetMaterialization("pipeline_a", partition="b000001")
    )
    again = _tick(defs, lake.instance, quiet.cursor)
    checks = _checks(again, STUCK_CHECK)
    assert set(checks) == {"pipeline_a"}, checks
    assert checks["pipeline_a"].passed
    [newest] = lake.instance.fetch_materializations(AssetKey("pipeline_a"), limit=1).records
    target = checks["pipeline_a"].target_materialization_data
    assert target is not None
    assert target.storage_id == newest.storage_id
    lake.instance.report_runless_asset_event(checks["pipeline_a"])
    key = AssetCheckKey(AssetKey("pipeline_a"), STUCK_CHECK)
    record = lake.instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    assert asyncio.run(record.targets_latest_materialization(LoadingContextForTest(lake.instance)))
    # Then quiet again.
    assert not _checks(_tick(defs, lake.instance, again.cursor), STUCK_CHECK)


def test_the_ui_lists_the_coordinator_as_the_automation_of_every_upstream(lake: Lake) -> None:
    from dagster._core.remote_representation.external import RemoteRepository
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._core.remote_representation.handle import RepositoryHandle

    # What the UI's "Automations" of an asset reads (AssetNode.targetingInstigators).
    repository = RemoteRepository(
        RepositorySnap.from_def(lake.defs().get_repository_def()),
        repository_handle=RepositoryHandle.for_test(),
        auto_materialize_use_sensors=True,
    )
    for asset in ("up1", "up2", *PIPELINES):
        sensors = repository.get_sensors_targeting(AssetKey(asset))
        assert {s.name for s in sensors} == {COORDINATOR}, asset
