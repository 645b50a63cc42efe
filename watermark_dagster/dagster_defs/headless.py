"""Driving a code location without the Dagster daemon: tick, run, finalize, repeat.

For cron-driven deployments, the demo and tests. It evaluates the same coordinator and
finalizer sensors the daemon would, applies their partition requests, and executes their
run requests in this process, all against a real Dagster instance, so runs and
materializations show up in the UI afterwards. Spark starts only when a run has work: the
first such run creates the session and the rest of the cycle reuses it; a cycle with nothing
to do, or whose runs all skip, starts no JVM.
"""

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    DeleteDynamicPartitionsRequest,
    Failure,
    SensorDefinition,
    SensorResult,
    build_sensor_context,
)

from watermark_dagster.core.records import BatchStatus
from watermark_dagster.core.resuming import MAX_DEATH_BACKOFF_SECONDS, ResumeAction, RetryPolicy
from watermark_dagster.dagster_defs.definitions import location_of
from watermark_dagster.dagster_defs.resources import held_spark_sessions
from watermark_dagster.dagster_defs.runs import (
    ERROR_METADATA,
    TERMINAL_TAG,
    batch_runs,
    pipeline_keys_of,
    worker_tags,
)
from watermark_dagster.dagster_defs.sensors import (
    CoordinatorCursor,
    resume_request,
)
from watermark_dagster.operations.coordinate import resume_batch
from watermark_dagster.store import WatermarkStore


def _step_failure_message(data: Any) -> str:
    """The message of a failed step: our own error when the asset reported one (a
    ``Failure`` carrying :data:`ERROR_METADATA`, whose description names the table, the
    versions and the fix), else the innermost cause."""
    user = getattr(data, "user_failure_data", None)
    if user is not None and ERROR_METADATA in (user.metadata or {}):
        return str(user.description).strip()
    chain = [data.error]
    while getattr(chain[-1], "cause", None) is not None:
        chain.append(chain[-1].cause)
    text = str(getattr(chain[-1], "message", chain[-1])).strip()
    return text.removeprefix(f"{Failure.__module__}.{Failure.__name__}: ")


def _skipped(events: Sequence[Any]) -> dict[str, str]:
    """Pipeline -> reason, for the observations and materializations of a run that record
    a skip (a skip is observed; a batch a pipeline did not need is materialized as such)."""
    found = {}
    for event in events:
        data = event.event_specific_data
        recorded = getattr(data, "materialization", None) or data.asset_observation  # type: ignore[union-attr]
        reason = recorded.metadata.get("skipped")
        if reason is not None:
            found[recorded.asset_key.to_user_string()] = str(getattr(reason, "value", reason))
    return found


@dataclass
class RunOutcome:
    """One executed run."""

    run_id: str
    batch_id: str
    pipelines: list[str]
    success: bool
    error: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    """pipeline -> why it wrote nothing (superseded batch, nothing changed for it)."""


@dataclass
class CycleReport:
    """What one headless cycle did."""

    runs: list[RunOutcome] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    stuck: str | None = None
    stopped: str | None = None
    ticks: int = 0

    @property
    def failed_runs(self) -> list[RunOutcome]:
        """Runs that did not succeed."""
        return [r for r in self.runs if not r.success]


class HeadlessRunner:
    """Evaluates the sensors of ``defs`` and executes what they request, in this process.

    Args:
        defs: a code location built with :func:`build_definitions`.
        instance: the Dagster instance to record runs, materializations and ticks in.
        log: where progress lines go (default: nowhere).
        run_log_level: level of Dagster's console log inside executed runs (``"DEBUG"`` shows
            every step event; the event log in the instance is complete either way).
        name: which location of ``defs`` to run, when it holds several (components); its
            prefixed job and sensors are the ones ticked and executed.
    """

    def __init__(
        self,
        defs: Definitions,
        instance: DagsterInstance,
        *,
        log: Callable[[str], None] | None = None,
        run_log_level: str = "INFO",
        name: str | None = None,
    ) -> None:
        self.run_log_level = run_log_level
        self.defs = defs
        self.location = location_of(defs, name)
        self.names = self.location.names
        self.instance = instance
        self.log = log or (lambda _msg: None)
        self._cursors: dict[str, str | None] = {}
        self._instance_ref = instance.get_ref()
        self._job = defs.resolve_job_def(self.names.batch_job)

    @cached_property
    def pipeline_keys(self) -> dict[str, AssetKey]:
        """Pipeline name -> its asset key (whatever the translator made of it); only the
        location's own pipelines, those on its batch partitions."""
        partitions = self.names.batches_partitions
        return pipeline_keys_of(
            s
            for s in self.defs.resolve_all_asset_specs()
            if getattr(s.partitions_def, "name", None) == partitions
        )

    def pipeline_key(self, name: str) -> AssetKey:
        """The asset key of pipeline ``name`` (whatever the translator made of it).

        Raises:
            KeyError: no pipeline asset has that name.
        """
        try:
            return self.pipeline_keys[name]
        except KeyError:
            raise KeyError(f"no pipeline asset named {name!r}") from None

    def _sensor(self, name: str) -> SensorDefinition:
        return self.defs.resolve_sensor_def(name)

    def tick(self, name: str) -> SensorResult:
        """Evaluate one sensor once, as the daemon would: record its asset events
        (observations, check evaluations) in the instance and apply its partition requests."""
        sensor = self._sensor(name)
        # The open instance, not a new one from its ref (an alembic check and a storage
        # connection per tick); the ref too, which Dagster needs to resolve partition keys.
        with build_sensor_context(
            instance=self.instance,
            instance_ref=self._instance_ref,
            definitions=self.defs,
            sensor_name=name,
            cursor=self._cursors.get(name),
            resources=dict(self.defs.resources or {}),
        ) as context:
            data = sensor.evaluate_tick(context)
        self._cursors[name] = data.cursor
        for event in data.asset_events or []:
            self.instance.report_runless_asset_event(event)
        for request in data.dynamic_partitions_requests or []:
            keys = list(request.partition_keys or [])
            if isinstance(request, DeleteDynamicPartitionsRequest):
                for key in keys:
                    self.instance.delete_dynamic_partition(request.partitions_def_name, key)
            elif keys:
                self.instance.add_dynamic_partitions(request.partitions_def_name, keys)
        return SensorResult(
            run_requests=data.run_requests or None,
            skip_reason=data.skip_message,
            cursor=data.cursor,
        )

    def _stopped_from_outside(self, run_id: str) -> bool:
        """Whether run ``run_id`` ended because it was asked to stop (canceled or
        terminated: Dagster turns the SIGTERM into an interrupt of the step)."""
        run = self.instance.get_run_by_id(run_id)
        return run is not None and run.status in (
            DagsterRunStatus.CANCELED,
            DagsterRunStatus.CANCELING,
        )

    def execute_requests(self, result: SensorResult, report: CycleReport) -> None:
        """Execute each run request of a coordinator tick in this process."""
        for request in result.run_requests or []:
            keys = list(request.asset_selection or [])
            # The request's own check selection (none for the coordinator's runs): without
            # it Dagster adds the checks of the selected assets as a step of the run.
            checks = request.asset_check_keys
            job = self._job.get_subset(
                asset_selection=set(keys),
                asset_check_selection=None if checks is None else set(checks),
            )
            # This process is the run's worker from its first event: killed before its
            # step starts, the run is still found dead, not left in flight for ever.
            run_id = str(uuid.uuid4())  # as Dagster makes them
            outcome = job.execute_in_process(
                instance=self.instance,
                partition_key=request.partition_key,
                run_id=run_id,
                tags={**request.tags, **worker_tags(run_id)},
                raise_on_error=False,
                run_config={"loggers": {"console": {"config": {"log_level": self.run_log_level}}}},
            )
            error, terminal, traces = None, None, []
            if not outcome.success and self._stopped_from_outside(outcome.run_id):
                report.stopped = (
                    f"run {outcome.run_id[:8]} of batch {request.partition_key} was stopped from "
                    "outside (canceled in Dagster, or by a forced watermark change that abandons "
                    "its batch); this command stops with it, as the interrupt may have cut a "
                    "call to Spark short. Run it again to go on."
                )
                self.log(report.stopped)
                return
            if not outcome.success:
                failures = []
                for e in outcome.all_events:
                    if not e.is_step_failure or e.event_specific_data is None:
                        continue
                    info = e.event_specific_data.error  # type: ignore[union-attr]
                    failures.append(f"{e.step_key}: {_step_failure_message(e.event_specific_data)}")
                    if info is not None:
                        traces.append(info.to_string())
                error = "; ".join(failures) or "run failed"
                run = self.instance.get_run_by_id(outcome.run_id)
                terminal = run.tags.get(TERMINAL_TAG) if run is not None else None
            names = [k.to_user_string() for k in keys]
            skipped = _skipped(
                [
                    *outcome.get_asset_materialization_events(),
                    *outcome.get_asset_observation_events(),
                ]
            )
            report.runs.append(
                RunOutcome(
                    outcome.run_id,
                    str(request.partition_key),
                    names,
                    outcome.success,
                    error,
                    skipped,
                )
            )
            head = f"run {outcome.run_id[:8]} batch {request.partition_key} {names}: "
            skips = "".join(f"; {p} SKIPPED: {why}" for p, why in skipped.items())
            if outcome.success:
                self.log(head + "success" + skips)
            elif terminal:
                # The coordinator stops the batch and reports the error with its fix once.
                self.log(head + f"FAILED with {json.loads(terminal)['error']} (not retryable)")
            else:
                self.log(head + f"FAILED: {error}")
                for trace in traces:
                    self.log(trace.rstrip())

    def evaluate_checks(self, keys: Sequence[AssetCheckKey], tags: Mapping[str, str]) -> bool:
        """Execute the checks ``keys`` in this process, in a run of their own (tagged
        ``tags``), as the UI's "Execute" of a check does: the location's own check
        definitions, each result naming its asset's latest materialization. For runs of
        the batch job, which leaves the checks to the coordinator, when no batch ending
        will make the coordinator report them (a replay). Whether the run succeeded."""
        if not keys:
            return True
        job = self.defs.resolve_implicit_global_asset_job_def().get_subset(
            asset_selection=set(), asset_check_selection=set(keys)
        )
        outcome = job.execute_in_process(
            instance=self.instance,
            tags=dict(tags),
            raise_on_error=False,
            run_config={"loggers": {"console": {"config": {"log_level": self.run_log_level}}}},
        )
        names = ", ".join(sorted(k.to_user_string() for k in keys))
        self.log(
            f"run {outcome.run_id[:8]} checks {names}: "
            + ("evaluated" if outcome.success else "FAILED to evaluate")
        )
        return outcome.success

    def retry_request(self, store: WatermarkStore) -> SensorResult | None:
        """One more run of the open batch's unfinished pipelines, whatever its failed runs
        (``watermark run --retry``: the operator fixed what made it stuck)."""
        batch = store.open_batch()
        if batch is None:
            return None
        step = resume_batch(
            store,
            batch,
            batch_runs(
                self.instance,
                batch.batch_id,
                pipeline_keys=frozenset(self.pipeline_keys.values()) if self.names.prefix else None,
            ).facts,
            known=self.pipeline_keys.keys(),
            policy=RetryPolicy(),  # not consulted: a retry runs whatever the failed runs
            actor="watermark run --retry",
            retry=True,
        )
        if step.action is not ResumeAction.RUN:
            return None
        request = resume_request(step, self.pipeline_keys)
        names = [k.to_user_string() for k in request.asset_selection or []]
        self.log(f"batch {batch.batch_id}: retrying {names}")
        return SensorResult(run_requests=[request])

    def run_until_idle(
        self, *, max_ticks: int = 100, max_batches: int | None = None, retry: bool = False
    ) -> CycleReport:
        """Plan or resume, run, finalize — until nothing is left to do or a batch is stuck.

        Commits that arrive while a batch runs are planned into the next batch, so this
        can run several batches. When a run of the open batch died (a killed process), the
        coordinator's backoff is waited out here, as the daemon would wait it out. The
        Spark session is created by the first run that needs
        it and kept for the rest of the cycle (then stopped, unless it existed before):
        none when nothing needs Spark.

        Args:
            max_ticks: stop after this many coordinator ticks.
            max_batches: stop once that many batches completed (``watermark run --once``:
                at most one).
            retry: first run the open batch's unfinished pipelines once more, even if the
                batch is stuck (after a terminal error, or after ``max_attempts`` failures
                or ``max_deaths`` deaths), then go on as without it, until idle.
        """
        with held_spark_sessions():
            return self._run_until_idle(max_ticks, max_batches, retry)

    def _run_until_idle(self, max_ticks: int, max_batches: int | None, retry: bool) -> CycleReport:
        store = self.location.store()
        report = CycleReport()
        if retry:
            retried = store.open_batch()
            again = self.retry_request(store)
            if again is not None and retried is not None:
                self.execute_requests(again, report)
                # Its last run finalizes the batch when every pipeline now succeeded.
                if store.get_batch(retried.batch_id).status is BatchStatus.COMPLETED:
                    report.completed.append(retried.batch_id)
                    self.log(f"batch {retried.batch_id} completed")
        for _ in range(max_ticks):
            if report.stopped:
                return report
            report.ticks += 1
            coordinated = self.tick(self.names.coordinator)
            # The batch open before its runs: a run finalizes its own batch (its last
            # step), so it may be completed by the time the finalizer ticks.
            before = store.open_batch()
            self.execute_requests(coordinated, report)
            if report.stopped:
                return report
            self.tick(self.names.finalizer)
            after = store.open_batch()
            if before is not None and (after is None or after.batch_id != before.batch_id):
                report.completed.append(before.batch_id)
                self.log(f"batch {before.batch_id} completed")
            state = CoordinatorCursor.parse(coordinated.cursor)
            if state.stuck_reason is not None:
                report.stuck = state.stuck_reason  # the caller reports it (once)
                return report
            if state.retry_at is not None:
                wait = min(max(0.0, state.retry_at - time.time()), MAX_DEATH_BACKOFF_SECONDS)
                why = getattr(coordinated.skip_reason, "skip_message", coordinated.skip_reason)
                self.log(f"{why}: waiting {wait:.0f} s")
                time.sleep(wait)
                continue
            ended = before is not None and after is None
            if not coordinated.run_requests and after is None and not ended:
                return report
            if max_batches is not None and len(report.completed) >= max_batches:
                return report
        return report
