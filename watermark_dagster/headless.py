"""Driving a code location without the Dagster daemon: tick, run, finalize, repeat.

For cron-driven deployments, the demo and tests. It evaluates the same coordinator and
finalizer sensors the daemon would, applies their partition requests, and executes their
run requests in this process, all against a real Dagster instance, so runs and
materializations show up in the UI afterwards. Spark starts only when a run has work: the
first such run creates the session and the rest of the cycle reuses it; a cycle with nothing
to do, or whose runs all skip, starts no JVM.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetKey, DagsterInstance, Definitions, SensorResult, build_sensor_context
from dagster._core.definitions.sensor_definition import SensorDefinition

from watermark_dagster.dagster_defs.definitions import BATCH_JOB
from watermark_dagster.dagster_defs.resources import held_spark_sessions
from watermark_dagster.dagster_defs.sensors import COORDINATOR, FINALIZER
from watermark_dagster.errors import WatermarkError


def _ours(cls: type) -> set[str]:
    return {cls.__name__} | {n for sub in cls.__subclasses__() for n in _ours(sub)}


def _root_message(error: object) -> str:
    """The message of a failed step: our own error when one is in the cause chain (it
    names the table, the versions and the fix), else the innermost cause."""
    ours = _ours(WatermarkError)
    chain = [error]
    while getattr(chain[-1], "cause", None) is not None:
        chain.append(chain[-1].cause)  # type: ignore[attr-defined]
    named = next((e for e in chain if getattr(e, "cls_name", None) in ours), chain[-1])
    return str(getattr(named, "message", named)).strip()


def _skipped(events: Sequence[Any]) -> dict[str, str]:
    """pipeline -> reason, for the materializations of a run that record a skip."""
    found = {}
    for event in events:
        materialization = event.event_specific_data.materialization  # type: ignore[union-attr]
        reason = materialization.metadata.get("skipped")
        if reason is not None:
            found[materialization.asset_key.to_user_string()] = str(
                getattr(reason, "value", reason)
            )
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
    """

    def __init__(
        self,
        defs: Definitions,
        instance: DagsterInstance,
        *,
        log: Callable[[str], None] | None = None,
        run_log_level: str = "INFO",
    ) -> None:
        self.run_log_level = run_log_level
        self.defs = defs
        self.instance = instance
        self.log = log or (lambda _msg: None)
        self._cursors: dict[str, str | None] = {}
        self._job = defs.resolve_job_def(BATCH_JOB)

    def pipeline_key(self, name: str) -> AssetKey:
        """The asset key of pipeline ``name`` (whatever the translator made of it).

        Raises:
            KeyError: no pipeline asset has that name.
        """
        for spec in self.defs.resolve_all_asset_specs():
            if spec.key.path[-1] == name and "target" in (spec.metadata or {}):
                return spec.key
        raise KeyError(f"no pipeline asset named {name!r}")

    def _sensor(self, name: str) -> SensorDefinition:
        return self.defs.resolve_sensor_def(name)

    def tick(self, name: str) -> SensorResult:
        """Evaluate one sensor once, as the daemon would, and apply its partition requests."""
        sensor = self._sensor(name)
        with build_sensor_context(
            instance_ref=self.instance.get_ref(),
            definitions=self.defs,
            sensor_name=name,
            cursor=self._cursors.get(name),
            resources=dict(self.defs.resources or {}),
        ) as context:
            data = sensor.evaluate_tick(context)
        self._cursors[name] = data.cursor
        for request in data.dynamic_partitions_requests or []:
            keys = list(getattr(request, "partition_keys", []) or [])
            if keys:
                self.instance.add_dynamic_partitions(request.partitions_def_name, keys)
        return SensorResult(
            run_requests=data.run_requests or None,
            skip_reason=data.skip_message,
            cursor=data.cursor,
        )

    def execute_requests(self, result: SensorResult, report: CycleReport) -> None:
        """Execute each run request of a coordinator tick in this process."""
        for request in result.run_requests or []:
            keys = list(request.asset_selection or [])
            outcome = self._job.execute_in_process(
                instance=self.instance,
                partition_key=request.partition_key,
                asset_selection=keys,
                tags=dict(request.tags),
                raise_on_error=False,
                run_config={"loggers": {"console": {"config": {"log_level": self.run_log_level}}}},
            )
            error = None
            if not outcome.success:
                failures = [
                    f"{e.step_key}: {_root_message(e.event_specific_data.error)}"  # type: ignore[union-attr]
                    for e in outcome.all_events
                    if e.is_step_failure and e.event_specific_data is not None
                ]
                error = "; ".join(failures) or "run failed"
            names = [k.to_user_string() for k in keys]
            skipped = _skipped(outcome.get_asset_materialization_events())
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
            self.log(
                f"run {outcome.run_id[:8]} batch {request.partition_key} {names}: "
                + ("success" if outcome.success else f"FAILED: {error}")
                + "".join(f"; {p} SKIPPED: {why}" for p, why in skipped.items())
            )

    def run_until_idle(self, *, max_ticks: int = 100) -> CycleReport:
        """Plan or resume, run, finalize — until nothing is left to do or a batch is stuck.

        The Spark session is created by the first run that needs it and kept for the rest of
        the cycle (then stopped, unless it existed before): none when nothing needs Spark.
        """
        with held_spark_sessions():
            return self._run_until_idle(max_ticks)

    def _run_until_idle(self, max_ticks: int) -> CycleReport:
        store = self.defs.resources["watermark_store"].get_store()  # type: ignore[union-attr]
        report = CycleReport()
        for _ in range(max_ticks):
            report.ticks += 1
            coordinated = self.tick(COORDINATOR)
            self.execute_requests(coordinated, report)
            before = store.open_batch()
            self.tick(FINALIZER)
            after = store.open_batch()
            if before is not None and (after is None or after.batch_id != before.batch_id):
                report.completed.append(before.batch_id)
                self.log(f"batch {before.batch_id} completed")
            skip = coordinated.skip_reason.skip_message if coordinated.skip_reason else None
            if skip and "is stuck" in skip:
                report.stuck = skip
                self.log(skip)
                return report
            if not coordinated.run_requests and after is None:
                return report
        return report
