"""The coordinator and finalizer sensors: thin adapters over the store and the core rules.

Coordinator: resume the open batch (request its unfinished pipelines when no run of them
is in flight), or plan a new one when there is new data and the minimum interval passed.
Finalizer: advance each upstream of the open batch whose consumers all succeeded, then
complete the batch.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetObservation,
    DefaultSensorStatus,
    DeleteDynamicPartitionsRequest,
    DynamicPartitionsDefinition,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from watermark_dagster.config.env import (
    DEFAULT_KEEP_BATCH_PARTITIONS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MIN_BATCH_INTERVAL_SECONDS,
    DEFAULT_SENSOR_INTERVAL_SECONDS,
)
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.planning import (
    batch_is_due,
    decide_resume,
    prunable_batch_partitions,
)
from watermark_dagster.dagster_defs.assets import BATCHES_PARTITIONS_NAME, observation_event
from watermark_dagster.dagster_defs.checks import continuity_evaluations
from watermark_dagster.dagster_defs.resources import WatermarkStoreResource
from watermark_dagster.dagster_defs.runs import (
    ATTEMPT_TAG,
    BATCH_TAG,
    batch_runs,
    consumers_from_graph,
    succeeded_pipelines,
    unfinished_pipelines,
)
from watermark_dagster.errors import UpstreamUnavailableError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import finalize_batch, look_before_planning, plan_next

COORDINATOR = "watermark_coordinator"
FINALIZER = "watermark_finalizer"


@dataclass(frozen=True)
class WatermarkSettings:
    """How often and how eagerly batches are planned and retried.

    Attributes:
        min_batch_interval_seconds: no batch is planned sooner than this after the previous
            one; changes in between are coalesced (keeps the partition count down). Default
            0 (plan as soon as there is work), as ``WATERMARK_MIN_BATCH_INTERVAL_SECONDS``.
        sensor_interval_seconds: how often the coordinator and finalizer tick.
        max_attempts: runs of one batch that may fail before the coordinator stops
            resubmitting it and reports it stuck.
        maintain_every_batches: the finalizer compacts the control tables after every N-th
            batch (0: never), keeping sensor reads small as history grows.
        default_status: whether the sensors start running when the code location loads.
        keep_batch_partitions: the finalizer keeps the newest N batch partitions in Dagster
            and deletes older ones of finished batches when a batch completes (0: keep all),
            so the partitions view and its queries stay small. Their batches, ranges and
            history stay in the control tables (`watermark batches`, `watermark batch ID`),
            their runs and materializations in Dagster; a pruned batch is re-run with
            `watermark replay`, not a UI backfill. ``WATERMARK_KEEP_BATCH_PARTITIONS``.
    """

    min_batch_interval_seconds: float = DEFAULT_MIN_BATCH_INTERVAL_SECONDS
    sensor_interval_seconds: int = DEFAULT_SENSOR_INTERVAL_SECONDS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    maintain_every_batches: int = 50
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING
    keep_batch_partitions: int = DEFAULT_KEEP_BATCH_PARTITIONS


def resume_request(batch_id: str, keys: list[AssetKey], attempt: int) -> RunRequest:
    """The run that (re)materializes ``keys`` for batch ``batch_id``; its key carries the
    attempt, since Dagster never launches a run key twice (failed runs included)."""
    return RunRequest(
        run_key=f"{batch_id}:{attempt}",
        partition_key=batch_id,
        asset_selection=keys,
        tags={ATTEMPT_TAG: str(attempt), BATCH_TAG: batch_id},
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
):
    """The sensor that plans batches and (re)submits their runs."""

    @sensor(
        name=COORDINATOR,
        job=job,
        minimum_interval_seconds=settings.sensor_interval_seconds,
        default_status=settings.default_status,
        description="Plans a batch when upstreams have new versions and no batch is open; "
        "resumes the open batch by requesting its unfinished pipelines.",
    )
    def watermark_coordinator(
        context: SensorEvaluationContext, watermark_store: WatermarkStoreResource
    ) -> SensorResult | SkipReason:
        store = watermark_store.get_store()
        cursor = json.loads(context.cursor) if context.cursor else {}
        seen: dict[str, int] = cursor.get("observed", {})
        events: list[AssetObservation | AssetCheckEvaluation] = []

        batch = store.open_batch()
        if batch is None:
            found = look_before_planning(registry, observer, store, actor=f"sensor:{COORDINATOR}")
            for name, (_, _, why) in found.started.items():
                context.log.info(f"{name}: {why}")
            look = found.observation
            committed = {u: w.committed_version for u, w in look.marks.items()}
            observed, errors = look.observed, look.errors
            for error in errors.values():
                context.log.error(error)
            # The watermark_continuity check of each upstream, reported when it changes:
            # a recreated or missing upstream shows as a failing check without a click.
            checks, cursor["continuity"] = continuity_evaluations(
                look, upstream_keys, cursor.get("continuity", {})
            )
            for name, obs in observed.items():
                if obs.is_cursor:
                    continue
                if seen.get(name) != obs.latest_version:
                    events.append(observation_event(obs, upstream_keys[name], committed.get(name)))
                    seen[name] = obs.latest_version
            cursor["observed"] = seen
            events += checks
            now = datetime.now(UTC)
            interval = timedelta(seconds=settings.min_batch_interval_seconds)
            if not batch_is_due(store.last_planned_at(), now, interval):
                return SensorResult(
                    skip_reason=f"previous batch planned less than {interval} ago",
                    asset_events=events,
                    cursor=json.dumps(cursor),
                )
            batch, created = plan_next(store, found, actor=f"sensor:{COORDINATOR}")
            if batch is None:
                reason = "no upstream has new versions"
                if look.blocked:
                    reason += (
                        f"; blocked, dropped and recreated: {sorted(look.blocked)} (see their "
                        "watermark_continuity check for the fix)"
                    )
                if set(errors) - set(look.blocked):
                    reason += f"; unavailable: {sorted(set(errors) - set(look.blocked))}"
                return SensorResult(
                    skip_reason=reason, asset_events=events, cursor=json.dumps(cursor)
                )
            if created:
                context.log.info(
                    f"planned batch {batch.batch_id}: "
                    + ", ".join(f"{u}={i.describe()}" for u, i in batch.inputs.items())
                    + f"; pipelines {list(batch.pipelines)}"
                    + (f"; full load {list(batch.full_load)}" if batch.full_load else "")
                )

        elif cursor.get("plan_recorded") != batch.batch_id:
            # Once per batch, not per tick (it reads history): the plan's history row, if
            # the process that planned it died before writing it.
            store.ensure_plan_recorded(batch, actor=f"sensor:{COORDINATOR}")
        cursor["plan_recorded"] = batch.batch_id

        add_partition = []
        if not context.instance.has_dynamic_partition(BATCHES_PARTITIONS_NAME, batch.batch_id):
            add_partition = [partitions_def.build_add_request([batch.batch_id])]

        runs = batch_runs(context.instance, batch.batch_id)
        if runs.dead:
            context.log.warning(f"batch {batch.batch_id}: runs {list(runs.dead)} lost their worker")
            for run_id in runs.dead:
                store.record(
                    "RUN_DIED",
                    actor=f"sensor:{COORDINATOR}",
                    batch_id=batch.batch_id,
                    detail={"run_id": run_id},
                )

        def result(skip: str | None, requests: list[RunRequest] | None = None) -> SensorResult:
            return SensorResult(
                run_requests=requests or None,
                skip_reason=None if requests else skip,
                dynamic_partitions_requests=add_partition or None,
                asset_events=events,
                cursor=json.dumps(cursor),
            )

        if runs.in_flight:
            return result(f"batch {batch.batch_id}: run(s) {list(runs.in_flight)} in flight")
        todo = unfinished_pipelines(context.instance, batch, pipeline_keys)
        if not todo:
            return result(f"batch {batch.batch_id}: all pipelines succeeded; finalizer's turn")
        decision = decide_resume(
            batch.batch_id,
            todo,
            failed_runs=runs.failed,
            max_attempts=settings.max_attempts,
            terminal=runs.terminal,
        )
        if not decision.run:
            stuck_key = f"{batch.batch_id}:{runs.last_attempt}"
            if cursor.get("stuck") != stuck_key:
                cursor["stuck"] = stuck_key
                detail: dict[str, Any] = {
                    "failed_runs": runs.failed,
                    "pipelines": todo,
                    "reason": decision.stuck,
                    "terminal": runs.terminal is not None,
                }
                if runs.terminal is not None:
                    detail.update(error=runs.terminal.error, message=runs.terminal.message)
                store.record(
                    "BATCH_STUCK",
                    actor=f"sensor:{COORDINATOR}",
                    batch_id=batch.batch_id,
                    detail=detail,
                )
                # The full reason (with the fix) is this tick's skip reason.
                context.log.warning(f"batch {batch.batch_id} is stuck: not resubmitted")
            return result(decision.stuck)
        attempt = runs.last_attempt + 1
        request = resume_request(batch.batch_id, [pipeline_keys[p] for p in todo], attempt)
        context.log.info(f"batch {batch.batch_id} attempt {attempt}: requesting {todo}")
        return result(None, [request])

    return watermark_coordinator


def build_finalizer_sensor(
    *,
    registry: Registry,
    observer: Observer,
    upstream_keys: Mapping[str, AssetKey],
    pipeline_keys: Mapping[str, AssetKey],
    settings: WatermarkSettings,
):
    """The sensor that advances committed watermarks and completes batches."""
    pipeline_names = {key: name for name, key in pipeline_keys.items()}

    @sensor(
        name=FINALIZER,
        minimum_interval_seconds=settings.sensor_interval_seconds,
        default_status=settings.default_status,
        description="Advances each upstream's committed watermark once every pipeline reading "
        "it succeeded for the open batch; then completes the batch.",
    )
    def watermark_finalizer(
        context: SensorEvaluationContext, watermark_store: WatermarkStoreResource
    ) -> SensorResult | SkipReason:
        store = watermark_store.get_store()
        batch = store.open_batch()
        if batch is None:
            return SkipReason("no open batch")
        consumers = consumers_from_graph(
            context.repository_def.asset_graph,  # type: ignore[union-attr]
            upstream_keys,
            pipeline_names,
        )
        done = succeeded_pipelines(context.instance, batch, pipeline_keys)
        actor = f"sensor:{FINALIZER}"
        events = []

        def advanced(upstream: str) -> None:
            context.log.info(
                f"batch {batch.batch_id}: advanced {upstream} past "
                f"{batch.inputs[upstream].describe()}"
            )
            if batch.inputs[upstream].is_cursor:
                return
            try:
                obs = observer.observe(registry.upstreams[upstream])
            except UpstreamUnavailableError as e:
                context.log.warning(str(e))
                return
            events.append(
                observation_event(
                    obs, upstream_keys[upstream], batch.inputs[upstream].snapshot_version
                )
            )

        step = finalize_batch(
            store, batch, consumers=consumers, succeeded=done, actor=actor, on_advance=advanced
        )
        if not step.complete:
            waiting = "; ".join(f"{u} waits for {list(p)}" for u, p in step.waiting.items())
            return SensorResult(
                skip_reason=f"batch {batch.batch_id}: {waiting}", asset_events=events
            )
        context.log.info(f"batch {batch.batch_id} completed")
        if settings.maintain_every_batches and batch.seq % settings.maintain_every_batches == 0:
            removed = store.maintain()
            context.log.info(f"control tables compacted: {removed}")
        pruned = (
            prunable_batch_partitions(
                context.instance.get_dynamic_partitions(BATCHES_PARTITIONS_NAME),
                keep=settings.keep_batch_partitions,
                open_batch_ids={b.batch_id for b in store.open_batches()},
            )
            if settings.keep_batch_partitions
            else []
        )
        if pruned:
            context.log.info(
                f"pruned {len(pruned)} batch partition(s) older than the newest "
                f"{settings.keep_batch_partitions}: {pruned[0]} .. {pruned[-1]}"
            )
        return SensorResult(
            skip_reason=f"batch {batch.batch_id} completed",
            asset_events=events,
            dynamic_partitions_requests=(
                [DeleteDynamicPartitionsRequest(BATCHES_PARTITIONS_NAME, pruned)]
                if pruned
                else None
            ),
        )

    return watermark_finalizer
