"""The coordinator and finalizer sensors: thin adapters over :mod:`operations.coordinate`.

Coordinator: resume the open batch (request its unfinished pipelines when no run of them
is in flight), or plan a new one when there is new data and the minimum interval passed.
Finalizer: advance each upstream of the open batch whose consumers all succeeded, then
complete the batch. The decisions are made in ``operations`` and ``core``; the sensors
turn Dagster's context into their inputs and their typed results into run requests,
partition requests and skip reasons.
"""

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetObservation,
    DynamicPartitionsDefinition,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.observations import RegistryObservation
from watermark_dagster.core.planning import batch_is_due
from watermark_dagster.core.resuming import (
    ResumeAction,
    ResumeStep,
)
from watermark_dagster.dagster_defs.checks import continuity_evaluations, retention_evaluations
from watermark_dagster.dagster_defs.finalizing import after_completion, finalize_reported
from watermark_dagster.dagster_defs.health_reporter import HealthReporter
from watermark_dagster.dagster_defs.names import COORDINATOR as COORDINATOR
from watermark_dagster.dagster_defs.names import DEFAULT_NAMES, LocationNames
from watermark_dagster.dagster_defs.names import FINALIZER as FINALIZER
from watermark_dagster.dagster_defs.resources import WatermarkStoreResource
from watermark_dagster.dagster_defs.runs import (
    ATTEMPT_TAG,
    BATCH_TAG,
    batch_runs,
    mark_deaths_recorded,
)
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.dagster_defs.upstream_assets import observation_event
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import (
    look_before_planning,
    plan_next,
    record_deaths,
    resume_batch,
)
from watermark_dagster.operations.idle import IdleReason


@dataclass
class CoordinatorCursor:
    """The coordinator's cursor, typed: what it remembers between ticks, and the open
    batch's state as of its last tick (which the headless runner reads).

    Attributes:
        observed: upstream -> the latest version already reported as an observation.
        continuity: the last reported watermark_continuity results.
        plan_recorded: the batch whose plan history row was ensured.
        stuck: ``batch:attempt`` of the stuck state last recorded in history.
        stuck_reason: set when the last tick found the open batch stuck: the reason.
        retry_at: set when the last tick waited out the backoff after a run of the open
            batch died: when it ends (epoch seconds; the headless runner sleeps till then).
        observed_at: upstream -> when its observation was last reported (epoch seconds),
            for the steady observation cadence.
        outcomes: the last reported outcome of each lag and stuck-batch check.
        retention_reported: whether the first look reported the retention_horizon checks
            (afterwards their schedule runs them).
    """

    observed: dict[str, int] = field(default_factory=dict)
    continuity: dict[str, Any] = field(default_factory=dict)
    plan_recorded: str | None = None
    stuck: str | None = None
    stuck_reason: str | None = None
    retry_at: float | None = None
    observed_at: dict[str, float] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    retention_reported: bool = False

    @classmethod
    def parse(cls, text: str | None) -> "CoordinatorCursor":
        """The cursor a tick left (keys it does not know are ignored)."""
        raw = json.loads(text) if text else {}
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})

    def dump(self) -> str:
        """The cursor as the sensor stores it."""
        return json.dumps(asdict(self))


def resume_request(
    step: ResumeStep, keys: Mapping[str, AssetKey], *, job_name: str | None = None
) -> RunRequest:
    """The run of a RUN step: it (re)materializes the step's pipelines for its batch; its
    run key carries the attempt, since Dagster never launches a run key twice (failed runs
    included). ``job_name`` names the batch job for a sensor that targets several jobs."""
    assert step.action is ResumeAction.RUN
    assert step.attempt is not None
    return RunRequest(
        job_name=job_name,
        run_key=f"{step.batch_id}:{step.attempt}",
        partition_key=step.batch_id,
        asset_selection=[keys[p] for p in step.pipelines],
        # No checks: with an asset selection Dagster would add the checks of the selected
        # assets (the stuck-batch checks) as a step of the batch run; the coordinator
        # reports those itself.
        asset_check_keys=[],
        tags={ATTEMPT_TAG: str(step.attempt), BATCH_TAG: step.batch_id},
    )


def build_coordinator_sensor(
    *,
    registry: Registry,
    observer: Observer,
    job: Any,
    partitions_def: DynamicPartitionsDefinition,
    upstream_keys: Mapping[str, AssetKey],
    pipeline_keys: Mapping[str, AssetKey],
    settings: WatermarkSettings,
    names: LocationNames = DEFAULT_NAMES,
    observe_job: Any = None,
):
    """The sensor that plans batches and (re)submits their runs of ``job``; ``names`` gives
    its name, the batch partitions' and the control tables' resource key.

    It observes the upstreams too (reporting their observations itself): with
    ``observe_job`` (the job that observes them) among its targets, the UI lists it as the
    automation of each upstream. It never requests a run of that job."""
    actor = f"sensor:{names.coordinator}"
    # Batch ids repeat across the control roots of several locations in one instance.
    scope = frozenset(pipeline_keys.values()) if names.prefix else None
    health = HealthReporter(
        registry=registry,
        observer=observer,
        upstream_keys=upstream_keys,
        pipeline_keys=pipeline_keys,
        settings=settings.health,
        observation=observation_event,
    )

    @sensor(
        name=names.coordinator,
        jobs=[job, observe_job] if observe_job is not None else [job],
        required_resource_keys={names.store_resource},
        minimum_interval_seconds=settings.sensor_interval_seconds,
        default_status=settings.default_status,
        description="Plans a batch when upstreams have new versions and no batch is open; "
        "resumes the open batch by requesting its unfinished pipelines.",
    )
    def watermark_coordinator(context: SensorEvaluationContext) -> SensorResult | SkipReason:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        store = watermark_store.get_store()
        cursor = CoordinatorCursor.parse(context.cursor)
        cursor.stuck_reason = cursor.retry_at = None
        events: list[AssetObservation | AssetCheckEvaluation] = []

        batch = store.open_batch()
        look: RegistryObservation | None = None
        if batch is None:
            found = look_before_planning(registry, observer, store, actor=actor)
            for name, (_, _, why) in found.started.items():
                context.log.info(f"{name}: {why}")
            look = found.observation
            committed = {u: w.committed_version for u, w in look.marks.items()}
            observed, errors = look.observed, look.errors
            for error in errors.values():
                context.log.error(error)
            # The watermark_continuity check of each upstream, reported when it changes:
            # a recreated or missing upstream shows as a failing check without a click.
            checks, cursor.continuity = continuity_evaluations(
                look, upstream_keys, cursor.continuity
            )
            # Observations when a version moved, or on the steady cadence; the lag checks
            # with them, and the stuck-batch checks (no batch is open: none is stuck).
            events += health.upstream_events(
                observed,
                committed,
                reported_versions=cursor.observed,
                observed_at=cursor.observed_at,
                outcomes=cursor.outcomes,
            )
            events += health.stuck_events(
                None,
                outcomes=cursor.outcomes,
                instance=context.instance,
                after=cursor.plan_recorded,
            )
            events += checks
            if not cursor.retention_reported:
                # Evaluated at once on a new deployment, not only at the schedule's first
                # run (up to an hour later).
                events += retention_evaluations(registry, upstream_keys, store)
                cursor.retention_reported = True
            now = datetime.now(UTC)
            interval = timedelta(seconds=settings.min_batch_interval_seconds)
            if not batch_is_due(store.last_planned_at(), now, interval):
                return SensorResult(
                    skip_reason=f"previous batch planned less than {interval} ago",
                    asset_events=events,
                    cursor=cursor.dump(),
                )
            batch, created = plan_next(store, found, actor=actor)
            if batch is None:
                return SensorResult(
                    skip_reason=IdleReason.of(look).text, asset_events=events, cursor=cursor.dump()
                )
            if created:
                context.log.info(
                    f"planned batch {batch.batch_id}: "
                    + ", ".join(f"{u}={i.describe()}" for u, i in batch.inputs.items())
                    + f"; pipelines {list(batch.pipelines)}"
                    + (f"; full load {list(batch.full_load)}" if batch.full_load else "")
                )

        elif cursor.plan_recorded != batch.batch_id:
            # Once per batch, not per tick (it reads history): the plan's history row, if
            # the process that planned it died before writing it.
            store.ensure_plan_recorded(batch, actor=actor)
        cursor.plan_recorded = batch.batch_id

        add_partition = []
        if not context.instance.has_dynamic_partition(names.batches_partitions, batch.batch_id):
            add_partition = [partitions_def.build_add_request([batch.batch_id])]

        runs = batch_runs(context.instance, batch.batch_id, pipeline_keys=scope)
        for death in runs.unrecorded:
            context.log.warning(f"batch {batch.batch_id}: {death.describe()} (the run died)")
        record_deaths(store, batch, runs.unrecorded, actor=actor)
        mark_deaths_recorded(context.instance, runs.unrecorded)
        step = resume_batch(
            store,
            batch,
            runs.facts,
            known=pipeline_keys.keys(),
            policy=settings.retry_policy,
            now=time.time(),
            actor=actor,
            stuck_recorded=cursor.stuck,
        )
        cursor.retry_at = step.retry_at
        requests = None
        if step.action is ResumeAction.STUCK:
            if cursor.stuck != step.stuck_key:
                # The full reason (with the fix) is this tick's skip reason.
                context.log.warning(f"batch {batch.batch_id} is stuck: not resubmitted")
            cursor.stuck, cursor.stuck_reason = step.stuck_key, step.reason
        elif step.action is ResumeAction.RUN:
            context.log.info(
                f"batch {batch.batch_id} attempt {step.attempt}: requesting {list(step.pipelines)}"
            )
            requests = [resume_request(step, pipeline_keys, job_name=job.name)]
        if look is None:  # the batch was open already: nothing was observed above
            events += health.upstream_events(
                health.observe(),
                store.committed_versions(),
                reported_versions=cursor.observed,
                observed_at=cursor.observed_at,
                outcomes=cursor.outcomes,
            )
        events += health.stuck_events(step, outcomes=cursor.outcomes, instance=context.instance)
        return SensorResult(
            run_requests=requests,
            skip_reason=None if requests else step.reason,
            dynamic_partitions_requests=add_partition or None,
            asset_events=events,
            cursor=cursor.dump(),
        )

    return watermark_coordinator


def build_finalizer_sensor(
    *,
    registry: Registry,
    observer: Observer,
    upstream_keys: Mapping[str, AssetKey],
    pipeline_keys: Mapping[str, AssetKey],
    settings: WatermarkSettings,
    names: LocationNames = DEFAULT_NAMES,
):
    """The sensor that advances committed watermarks and completes batches (``names``
    gives its name, the batch partitions' and the control tables' resource key).

    When it completes a batch it also records, for each pipeline the batch did not need, a
    materialization of the batch partition that says so (done, nothing to do).

    Consumers come from the registry (:meth:`Registry.consumers`), which the asset graph
    is checked against (:func:`watermark_dagster.dagster_defs.runs.check_consumers`).
    """
    actor = f"sensor:{names.finalizer}"

    @sensor(
        name=names.finalizer,
        required_resource_keys={names.store_resource},
        minimum_interval_seconds=settings.sensor_interval_seconds,
        default_status=settings.default_status,
        description="Advances each upstream's committed watermark once every pipeline reading "
        "it succeeded for the open batch; then completes the batch.",
    )
    def watermark_finalizer(context: SensorEvaluationContext) -> SensorResult | SkipReason:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        store = watermark_store.get_store()
        batch = store.open_batch()
        if batch is None:
            return SkipReason("no open batch")
        finalized = finalize_reported(
            store,
            batch,
            registry=registry,
            observer=observer,
            upstream_keys=upstream_keys,
            pipeline_keys=pipeline_keys,
            actor=actor,
            log=context.log,
        )
        events = finalized.events
        if not finalized.step.complete:
            waiting = "; ".join(
                f"{u} waits for {list(p)}" for u, p in finalized.step.waiting.items()
            )
            return SensorResult(
                skip_reason=f"batch {batch.batch_id}: {waiting}", asset_events=events
            )
        pruning = after_completion(
            context.instance,
            store,
            batch,
            settings=settings,
            partitions_name=names.batches_partitions,
            log=context.log,
        )
        request = pruning.request()
        return SensorResult(
            skip_reason=f"batch {batch.batch_id} completed",
            asset_events=events,
            dynamic_partitions_requests=[request] if request else None,
        )

    return watermark_finalizer
