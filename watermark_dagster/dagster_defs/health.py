"""Health of a code location as Dagster signals: upstream lag, stuck batches, a steady
observation cadence, freshness of the pipelines and the retention check's schedule.

* ``watermark_lag`` (on each consumed versioned upstream) fails (severity ERROR) when the
  upstream is more than ``lag_max_versions`` versions ahead of its committed watermark, or
  when its oldest unconsumed commit (the commit of ``committed + 1``) is older than
  ``lag_max_seconds``.
* ``watermark_stuck_batch`` (on each pipeline) fails (severity ERROR) while the open batch
  is stuck with that pipeline unfinished: the coordinator stopped resubmitting it after a
  terminal error, ``max_attempts`` failed runs or ``max_deaths`` runs that died. It sits
  on the pipelines, not on the
  upstreams, because the pipeline is where the failed runs and their error are; the
  upstreams the batch holds back show it through their lag check.

The coordinator sensor reports both from every tick (:class:`HealthReporter`): an
evaluation when a check's outcome changes, and otherwise at most every
``observe_every_seconds``, together with an upstream observation (so lag plots have a
point per interval even when nothing moved). Both can also be run from the UI
(:func:`~watermark_dagster.dagster_defs.checks.build_health_checks`).

The ``retention_horizon`` check runs on a schedule shipped RUNNING
(:func:`build_retention_schedule`); pipelines get a time-window freshness policy
(:func:`with_freshness`) that Dagster's freshness daemon evaluates.
"""

from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetObservation,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    DagsterEventType,
    DagsterInstance,
    DagsterInvalidDefinitionError,
    DagsterRunStatus,
    DefaultScheduleStatus,
    FreshnessPolicy,
    MetadataValue,
    RunsFilter,
    ScheduleDefinition,
    apply_freshness_policy,
    define_asset_job,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,  # not exported; the UI's match key
)

from watermark_dagster.config.env import (
    DEFAULT_FRESHNESS_FAIL_AFTER_SECONDS,
    DEFAULT_LAG_MAX_SECONDS,
    DEFAULT_LAG_MAX_VERSIONS,
    DEFAULT_OBSERVE_EVERY_SECONDS,
    DEFAULT_RETENTION_CHECK_CRON,
)
from watermark_dagster.config.options import Kind, written_as
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.observations import Observation
from watermark_dagster.core.resuming import ResumeAction, ResumeStep, RetryPolicy, resume_step
from watermark_dagster.dagster_defs.check_family import check_evaluation
from watermark_dagster.dagster_defs.names import (
    DEFAULT_NAMES,
    LocationNames,
)
from watermark_dagster.dagster_defs.names import RETENTION_JOB as RETENTION_JOB
from watermark_dagster.dagster_defs.names import RETENTION_SCHEDULE as RETENTION_SCHEDULE
from watermark_dagster.dagster_defs.runs import BATCH_TAG, DRIFT_METADATA, batch_runs, owns_run
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.observe.retention import commit_time, format_duration
from watermark_dagster.operations.coordinate import unfinished

if TYPE_CHECKING:
    from watermark_dagster.store import WatermarkStore

LAG_CHECK = "watermark_lag"
STUCK_CHECK = "watermark_stuck_batch"
DRIFT_CHECK = "watermark_drift"
# The longest run error a stuck-batch check quotes.
ERROR_CHARS = 500
# Dagster refuses a time-window freshness policy shorter than this.
MIN_FRESHNESS_SECONDS = 60
UNSTICK_FIX = (
    "fix the cause shown by the batch's failed runs, then run `watermark run --retry` (or "
    "re-execute the batch partition from the UI); `watermark batch {batch}` shows the batch."
)


def _positive(name: str, value: float, fix: str) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ConfigurationError(
            f"HealthSettings.{name}={value!r} is not a number >= 0.",
            fix=f"{fix} (environment: WATERMARK_{name.upper()})",
        )


def _valid_cron(value: object) -> bool:
    # Dagster's own test of a schedule's cron string (its parser is private).
    if not isinstance(value, str):
        return False
    try:
        ScheduleDefinition(name="cron_probe", cron_schedule=value, job_name="cron_probe")
    except DagsterInvalidDefinitionError:
        return False
    return True


@dataclass(frozen=True)
class HealthSettings:
    """Thresholds and cadences of the health signals.

    Each setting a code location leaves out is read from its ``WATERMARK_...`` variable
    (docs/configuration.md lists them, made from these declarations).

    Attributes:
        lag_max_versions: the ``watermark_lag`` check fails when an upstream is more than
            this many versions ahead of its committed watermark (0: no version bound).
        lag_max_seconds: the ``watermark_lag`` check also fails when the upstream's oldest
            unconsumed commit is older than this (0: no time bound).
        observe_every_seconds: each upstream is reported (an observation and its lag check)
            at least this often even when nothing moved, so lag plots over time (0: every
            coordinator tick).
        freshness_fail_after_seconds: a pipeline's freshness fails when it has not been
            materialized for this long (0: no freshness policy; else at least 60, Dagster's
            minimum).
        retention_check_cron: when the schedule ``watermark_retention_schedule`` runs the
            ``retention_horizon`` checks (a cron string; default hourly).

    Raises:
        ConfigurationError: a value is not usable; the message names it and the fix.
    """

    lag_max_versions: int = field(
        default=DEFAULT_LAG_MAX_VERSIONS,
        metadata=written_as(Kind.WHOLE, env="WATERMARK_LAG_MAX_VERSIONS"),
    )
    lag_max_seconds: float = field(
        default=DEFAULT_LAG_MAX_SECONDS,
        metadata=written_as(Kind.SECONDS, env="WATERMARK_LAG_MAX_SECONDS"),
    )
    observe_every_seconds: float = field(
        default=DEFAULT_OBSERVE_EVERY_SECONDS,
        metadata=written_as(Kind.SECONDS, env="WATERMARK_OBSERVE_EVERY_SECONDS"),
    )
    freshness_fail_after_seconds: float = field(
        default=DEFAULT_FRESHNESS_FAIL_AFTER_SECONDS,
        metadata=written_as(Kind.SECONDS, env="WATERMARK_FRESHNESS_FAIL_AFTER_SECONDS"),
    )
    retention_check_cron: str = field(
        default=DEFAULT_RETENTION_CHECK_CRON,
        metadata=written_as(
            Kind.TEXT, shape="text (a cron string)", env="WATERMARK_RETENTION_CHECK_CRON"
        ),
    )

    def __post_init__(self) -> None:
        if not isinstance(self.lag_max_versions, int) or isinstance(self.lag_max_versions, bool):
            raise ConfigurationError(
                f"HealthSettings.lag_max_versions={self.lag_max_versions!r} is not a whole number.",
                fix=f"use a whole number of versions such as {DEFAULT_LAG_MAX_VERSIONS} "
                "(0: no version bound; environment: WATERMARK_LAG_MAX_VERSIONS).",
            )
        _positive(
            "lag_max_versions",
            self.lag_max_versions,
            f"use a number of versions such as {DEFAULT_LAG_MAX_VERSIONS} (0: no bound).",
        )
        _positive(
            "lag_max_seconds",
            self.lag_max_seconds,
            f"use seconds such as {DEFAULT_LAG_MAX_SECONDS:g} (0: no time bound).",
        )
        _positive(
            "observe_every_seconds",
            self.observe_every_seconds,
            f"use seconds such as {DEFAULT_OBSERVE_EVERY_SECONDS:g} (0: every tick).",
        )
        fresh = self.freshness_fail_after_seconds
        _positive(
            "freshness_fail_after_seconds",
            fresh,
            f"use seconds such as {DEFAULT_FRESHNESS_FAIL_AFTER_SECONDS:g} (0: no policy).",
        )
        if 0 < fresh < MIN_FRESHNESS_SECONDS:
            raise ConfigurationError(
                f"HealthSettings.freshness_fail_after_seconds={fresh!r} is shorter than "
                f"Dagster's minimum freshness window ({MIN_FRESHNESS_SECONDS} seconds).",
                fix=f"use at least {MIN_FRESHNESS_SECONDS}, or 0 for no freshness policy "
                "(environment: WATERMARK_FRESHNESS_FAIL_AFTER_SECONDS).",
            )
        if not _valid_cron(self.retention_check_cron):
            raise ConfigurationError(
                f"HealthSettings.retention_check_cron={self.retention_check_cron!r} is not a "
                "cron string.",
                fix=f"use five cron fields such as {DEFAULT_RETENTION_CHECK_CRON!r} (hourly) "
                "(environment: WATERMARK_RETENTION_CHECK_CRON).",
            )


@dataclass(frozen=True)
class Lag:
    """How far an upstream is ahead of its committed watermark.

    Attributes:
        upstream: the upstream.
        latest_version: its newest version.
        committed_version: its committed watermark (None: nothing committed).
        versions: versions not consumed yet (``latest - committed``).
        pending_since: when the oldest unconsumed version (``committed + 1``) was
            committed; None when caught up, or when its commit file is gone.
        seconds: how long ago that was (0 when caught up; None when unknown).
    """

    upstream: str
    latest_version: int
    committed_version: int | None
    versions: int
    pending_since: datetime | None
    seconds: float | None


def measure_lag(
    obs: Observation,
    committed: int | None,
    now: datetime,
    committed_at: Callable[[int], datetime | None],
) -> Lag:
    """The lag of a versioned upstream from its observation and committed watermark.

    Args:
        obs: what the last look at the upstream found.
        committed: its committed version (None: nothing committed, so every version lags).
        now: the moment the age is measured at.
        committed_at: when a version was committed (None: its commit file is gone).
    """
    behind = obs.latest_version - (-1 if committed is None else committed)
    if behind <= 0:
        return Lag(obs.upstream, obs.latest_version, committed, max(behind, 0), None, 0.0)
    oldest = 0 if committed is None else committed + 1
    since = committed_at(oldest)
    seconds = None if since is None else max(0.0, (now - since).total_seconds())
    return Lag(obs.upstream, obs.latest_version, committed, behind, since, seconds)


def lag_result(lag: Lag, settings: HealthSettings) -> tuple[bool, str, str, dict[str, Any]]:
    """``(passed, outcome, description, metadata)`` of one upstream's lag check.

    ``outcome`` names which bounds are exceeded, without the numbers (which change every
    tick), so an evaluation is reported when it changes.
    """
    over: list[str] = []
    if settings.lag_max_versions and lag.versions > settings.lag_max_versions:
        over.append("versions")
    if (
        settings.lag_max_seconds
        and lag.seconds is not None
        and lag.seconds > settings.lag_max_seconds
    ):
        over.append("time")
    age = "" if lag.seconds is None else format_duration(timedelta(seconds=lag.seconds))
    if lag.versions == 0:
        state = f"'{lag.upstream}' is caught up (committed version {lag.committed_version})."
    else:
        state = f"'{lag.upstream}' is {lag.versions} version(s) behind"
        state += (
            f"; its oldest unconsumed commit is {age} old."
            if lag.seconds is not None
            else "; the commit time of its oldest unconsumed version is unknown (its commit "
            "file is gone: see the retention_horizon check)."
        )
    limits = (
        f"Limits: {settings.lag_max_versions or 'no'} versions, "
        + (
            format_duration(timedelta(seconds=settings.lag_max_seconds))
            if settings.lag_max_seconds
            else "no time bound"
        )
        + "."
    )
    meta: dict[str, Any] = {
        "upstream": lag.upstream,
        "latest_version": MetadataValue.int(lag.latest_version),
        "lag_versions": MetadataValue.int(lag.versions),
        "max_versions": MetadataValue.int(settings.lag_max_versions),
        "max_seconds": MetadataValue.float(float(settings.lag_max_seconds)),
    }
    if lag.committed_version is not None:
        meta["committed_version"] = MetadataValue.int(lag.committed_version)
    if lag.seconds is not None:
        meta["lag_seconds"] = MetadataValue.float(lag.seconds)
    if lag.pending_since is not None:
        meta["oldest_unconsumed_commit"] = MetadataValue.timestamp(lag.pending_since)
    if not over:
        return True, "ok", f"{state} {limits}", meta
    fix = (
        " Nothing has consumed it for too long: check that the watermark_coordinator and "
        "watermark_finalizer sensors are running, look for a stuck batch (the "
        f"{STUCK_CHECK} check of its pipelines, `watermark status`), or raise the limits "
        "(WATERMARK_LAG_MAX_VERSIONS, WATERMARK_LAG_MAX_SECONDS)."
    )
    return False, "over:" + "+".join(over), f"{state} {limits}{fix}", meta


def last_failure(
    instance: DagsterInstance,
    batch_id: str,
    *,
    pipeline_keys: AbstractSet[AssetKey] | None = None,
) -> str | None:
    """The error of the newest failed run the coordinator launched for ``batch_id``: its
    first step failure's message (else the run failure's), None when there is none.
    ``pipeline_keys``, when given, keeps only runs of those assets (see
    :func:`~watermark_dagster.dagster_defs.runs.batch_runs`)."""
    runs = instance.get_runs(
        RunsFilter(tags={BATCH_TAG: batch_id}, statuses=[DagsterRunStatus.FAILURE]),
        limit=1 if pipeline_keys is None else None,
    )
    runs = [r for r in runs if owns_run(r, pipeline_keys)][:1]
    if not runs:
        return None
    for kind in (DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE):
        for entry in instance.all_logs(runs[0].run_id, of_type=kind):
            event = entry.dagster_event
            if event is None:
                continue
            error = event.step_failure_data.error if event.is_step_failure else None
            while error is not None and error.cause is not None:
                error = error.cause  # the user code's own error, not Dagster's wrapper
            text = error.message.strip() if error is not None else (event.message or "")
            if text:
                return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."
    return None


def stuck_result(
    pipeline: str, step: ResumeStep | None, error: str | None = None, *, after: str | None = None
) -> tuple[bool, str, str, dict[str, Any]]:
    """``(passed, outcome, description, metadata)`` of one pipeline's stuck-batch check,
    from the coordinator's decision for the open batch (None: no batch is open; ``after``
    the last batch it saw, ended since) and the error of its newest failed run (see
    :func:`last_failure`)."""
    if step is None:
        if after is None:
            return (
                True,
                "ok",
                f"No batch is open; '{pipeline}' is not held.",
                {"pipeline": pipeline},
            )
        # The outcome names the batch that ended: a passing result is reported again after
        # each batch, so it is newer than the batch's materializations, which the UI needs
        # to show it for the latest one (not "Not evaluated").
        return (
            True,
            f"ok:after:{after}",
            f"No batch is open (batch {after} ended); '{pipeline}' is not held.",
            {"pipeline": pipeline, "last_batch_id": after},
        )
    meta: dict[str, Any] = {"pipeline": pipeline, "batch_id": step.batch_id}
    if step.action is not ResumeAction.STUCK or pipeline not in step.pipelines:
        return True, "ok", f"Batch {step.batch_id} is not stuck on '{pipeline}'.", meta
    meta["failed_runs"] = MetadataValue.int(step.facts.failed)
    meta["unfinished"] = ", ".join(step.pipelines)
    if step.facts.terminal is not None:
        meta["error"] = step.facts.terminal.error
    elif error:
        meta["error"] = error
    meta["fix"] = UNSTICK_FIX.format(batch=step.batch_id)
    description = f"Pipeline '{pipeline}' holds batch {step.batch_id}: {step.reason}"
    if step.facts.terminal is None and error:
        description += f" Last error: {error}"
    return False, f"stuck:{step.stuck_key}", description, meta


class HealthReporter:
    """What the coordinator reports about health on each tick: upstream observations on a
    steady cadence, and the lag and stuck-batch check evaluations when their outcome
    changes (and with each cadence report).

    Its memory lives in the coordinator's cursor, passed in as plain mappings that these
    methods update: ``observed_at`` (upstream -> when it was last reported, epoch
    seconds) and ``outcomes`` (check -> its last reported outcome).

    Args:
        registry: the upstreams and pipelines.
        observer: the code location's observer.
        upstream_keys: upstream name -> asset key.
        pipeline_keys: pipeline name -> asset key.
        settings: thresholds and cadence.
        observation: builds an upstream's observation event from its observation and
            committed version (the one the coordinator reports when a version moves).
    """

    def __init__(
        self,
        *,
        registry: Registry,
        observer: Observer,
        upstream_keys: Mapping[str, AssetKey],
        pipeline_keys: Mapping[str, AssetKey],
        settings: HealthSettings,
        observation: Callable[[Observation, AssetKey, int | None], AssetObservation],
    ) -> None:
        self._registry = registry
        self._observer = observer
        self._upstream_keys = upstream_keys
        self._pipeline_keys = pipeline_keys
        self._settings = settings
        self._observation = observation
        self._commit_times = CommitTimes()

    def upstream_events(
        self,
        observed: Mapping[str, Observation],
        committed: Mapping[str, int | None],
        *,
        reported_versions: dict[str, int],
        observed_at: dict[str, float],
        outcomes: dict[str, str],
        now: datetime | None = None,
    ) -> list[AssetObservation | AssetCheckEvaluation]:
        """Observations and lag checks of the versioned upstreams in ``observed``: an
        upstream is reported when its version moved since ``reported_versions`` or its last
        report is ``observe_every_seconds`` old; its lag check with it, or alone when its
        outcome changed. Updates the three mappings."""
        now = now or datetime.now(UTC)
        stamp = now.timestamp()
        events: list[AssetObservation | AssetCheckEvaluation] = []
        for name, obs in observed.items():
            if obs.is_cursor or name not in self._upstream_keys:
                continue
            key = self._upstream_keys[name]
            lag = measure_lag(
                obs,
                committed.get(name),
                now,
                lambda v, u=name: self._commit_times.get(u, v, self._registry),
            )
            passed, outcome, description, meta = lag_result(lag, self._settings)
            last = observed_at.get(name)
            due = (
                reported_versions.get(name) != obs.latest_version
                or last is None
                or stamp - last >= self._settings.observe_every_seconds
            )
            if due:
                event = self._observation(obs, key, committed.get(name))
                if lag.seconds is not None:
                    event = with_metadata(event, {"lag_seconds": MetadataValue.float(lag.seconds)})
                events.append(event)
                reported_versions[name] = obs.latest_version
                observed_at[name] = stamp
            check = AssetCheckKey(key, LAG_CHECK).to_user_string()
            if due or outcomes.get(check) != outcome:
                outcomes[check] = outcome
                events.append(
                    check_evaluation(AssetCheckKey(key, LAG_CHECK), passed, description, meta)
                )
        return events

    def observe(self) -> dict[str, Observation]:
        """A look at the consumed versioned upstreams (for ticks that did not look while
        planning); unavailable ones are left out (their continuity check says why)."""
        found = self._observer.observe_all(
            u for u in self._registry.consumed_upstreams() if not u.is_cursor
        )
        return {n: o for n, o in found.items() if isinstance(o, Observation)}

    def stuck_events(
        self,
        step: ResumeStep | None,
        *,
        outcomes: dict[str, str],
        instance: DagsterInstance | None = None,
        after: str | None = None,
    ) -> list[AssetCheckEvaluation]:
        """The stuck-batch checks whose outcome changed since ``outcomes`` (updated), from
        the coordinator's decision ``step`` for the open batch (None: none is open, and
        ``after`` is the last batch the coordinator saw open); with ``instance``, a newly
        stuck batch's check names its last run's error, and every result points at its
        pipeline's latest materialization.

        Every check gets a result at the first tick, and a passing one again once each
        batch ended (after its materializations), so a healthy pipeline never shows its
        check "Not evaluated" for its latest materialization. With ``instance``, a check
        whose newest execution ended for another materialization than its pipeline's
        latest (see :func:`evaluated_before_latest`: runs that ran at once, a backfill's) is
        reported again, whatever its outcome."""
        events: list[AssetCheckEvaluation] = []
        error: str | None = None
        looked = False
        behind = (
            set() if instance is None else evaluated_before_latest(instance, self._pipeline_keys)
        )
        for name, key in self._pipeline_keys.items():
            passed, outcome, _, _ = stuck_result(name, step, after=after)
            check = AssetCheckKey(key, STUCK_CHECK).to_user_string()
            if outcomes.get(check) == outcome and name not in behind:
                continue
            if not passed and not looked and instance is not None and step is not None:
                # Read once per newly stuck state: one run lookup and its failure events.
                error, looked = last_failure(instance, step.batch_id), True
            passed, outcome, description, meta = stuck_result(name, step, error, after=after)
            if outcomes.get(check) != outcome or name in behind:
                outcomes[check] = outcome
                events.append(
                    check_evaluation(AssetCheckKey(key, STUCK_CHECK), passed, description, meta)
                )
        if events and instance is not None:
            events = targeting_latest_materialization(instance, events)
        return events


# The statuses of a check execution that has ended (by value: the enum is not exported).
_ENDED = ("SUCCEEDED", "FAILED")


def evaluated_before_latest(
    instance: DagsterInstance, pipeline_keys: Mapping[str, AssetKey]
) -> set[str]:
    """The pipelines whose newest ``watermark_stuck_batch`` execution has ended and belongs
    to another materialization than the pipeline's latest, so the UI shows the check "Not
    evaluated" (two queries, whatever the history).

    Dagster takes a check's newest execution to be the one its run planned last. Runs of
    one pipeline in flight at once (a backfill of several partitions, the pool letting two
    go) can end in another order than they started: the run that started last then holds
    the newest execution while another one holds the newest materialization. An execution
    still planned (its run is evaluating it) is left to its run."""
    checks = {AssetCheckKey(key, STUCK_CHECK): name for name, key in pipeline_keys.items()}
    executions = instance.event_log_storage.get_latest_asset_check_execution_by_key(list(checks))
    latest = {
        record.asset_entry.asset_key: record.asset_entry.last_materialization_record
        for record in instance.get_asset_records(list(pipeline_keys.values()))
    }
    behind: set[str] = set()
    for check, name in checks.items():
        materialized, execution = latest.get(check.asset_key), executions.get(check)
        if materialized is None or execution is None or execution.status.value not in _ENDED:
            # Nothing to show it for, never evaluated (the first tick reports it), or
            # still planned.
            continue
        if execution.run_id and execution.run_id == materialized.run_id:
            continue  # evaluated in the run that materialized
        evaluation = execution.evaluation
        target = evaluation.target_materialization_data if evaluation is not None else None
        if target is not None and target.storage_id == materialized.storage_id:
            continue
        if target is None and materialized.timestamp < execution.create_timestamp:
            continue
        behind.add(name)
    return behind


def targeting_latest_materialization(
    instance: DagsterInstance, events: Sequence[AssetCheckEvaluation]
) -> list[AssetCheckEvaluation]:
    """``events`` each pointed at its asset's latest materialization (read in one query).

    Without the pointer the UI matches a check to a materialization by timestamp, and a
    check execution's timestamp is kept to the second on SQLite: a result reported within
    the second of the materialization would show as "Not evaluated" for it."""
    latest: dict[AssetKey, AssetCheckEvaluationTargetMaterializationData] = {}
    for record in instance.get_asset_records(list({e.asset_key for e in events})):
        found = record.asset_entry.last_materialization_record
        if found is not None:
            latest[record.asset_entry.asset_key] = AssetCheckEvaluationTargetMaterializationData(
                storage_id=found.storage_id,
                run_id=found.run_id,
                timestamp=found.timestamp,
            )
    return [
        AssetCheckEvaluation(
            asset_key=e.asset_key,
            check_name=e.check_name,
            passed=e.passed,
            metadata=e.metadata,
            target_materialization_data=latest.get(e.asset_key),
            severity=e.severity,
            description=e.description,
            blocking=e.blocking,
            partition=e.partition,
        )
        for e in events
    ]


class CommitTimes:
    """When versions of upstreams were committed, read from their commit files and kept
    (a version's commit time never changes), so a tick reads at most one small file per
    upstream whose watermark moved."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._known: dict[tuple[str, int], datetime | None] = {}

    def get(self, upstream: str, version: int, registry: Registry) -> datetime | None:
        """When ``version`` of ``upstream`` was committed (None: its commit file is gone)."""
        found = self._known.get((upstream, version))
        if found is None:
            found = commit_time(registry.upstreams[upstream], version)
            if len(self._known) >= self.LIMIT:
                self._known.clear()
            if found is not None:  # a gone file is looked at again next time
                self._known[(upstream, version)] = found
        return found


def with_metadata(event: AssetObservation, extra: Mapping[str, Any]) -> AssetObservation:
    """``event`` with ``extra`` added to its metadata."""
    return AssetObservation(
        asset_key=event.asset_key,
        description=event.description,
        metadata={**event.metadata, **extra},
        partition=event.partition,
        tags=event.tags,
    )


def drift_result(
    pipeline: str, metadata: Mapping[str, Any] | None
) -> tuple[bool, str, dict[str, Any]]:
    """The ``watermark_drift`` check of ``pipeline`` from its newest materialization's
    ``metadata`` (None: none yet): passed, the description, the check's metadata.

    A full batch of a declared pipeline counts the keys it rewrote that its own changes did
    not touch: rows a recompute gives that the target did not hold although nothing that
    reaches them changed. A wrong incremental derivation leaves such rows, and so does a
    write to the target from outside; the batch writes the correct rows either way.
    """
    drift = _metadata_value((metadata or {}).get(DRIFT_METADATA))
    batch = _metadata_value((metadata or {}).get("batch_id"))
    if drift is None:
        return (
            True,
            f"Pipeline '{pipeline}': drift not measured by its newest batch "
            f"{batch or '(none yet)'} (a `full` batch measures it; an incremental batch "
            "or a rewrite does not compare the target).",
            {},
        )
    sample = _metadata_value((metadata or {}).get(f"{DRIFT_METADATA}_sample")) or []
    meta: dict[str, Any] = {DRIFT_METADATA: drift, "batch_id": batch}
    if not drift:
        return True, f"Pipeline '{pipeline}': no drift found by its full batch {batch}.", meta
    meta[f"{DRIFT_METADATA}_sample"] = MetadataValue.json(sample)
    return (
        False,
        f"Pipeline '{pipeline}': its full batch {batch} found {drift} key(s) whose target row "
        "differed from the full transform although the batch's changes did not touch them "
        f"(e.g. {', '.join(str(k) for k in sample)}): the target had drifted. The batch wrote "
        "the correct rows. Fix: look for writes to the target from outside the pipeline; if "
        "there are none, the incremental derivation missed these keys: report the pipeline's "
        "SQL and key paths, and set strategy: full until it is fixed.",
        meta,
    )


def _metadata_value(entry: object) -> Any:
    return entry.value if isinstance(entry, MetadataValue) else entry


def drift_evaluation(
    key: AssetKey, pipeline: str, metadata: Mapping[str, Any]
) -> AssetCheckEvaluation:
    """The ``watermark_drift`` check evaluated for the materialization a pipeline's run just
    recorded with ``metadata``, as an event of that run."""
    passed, description, meta = drift_result(pipeline, metadata)
    return check_evaluation(AssetCheckKey(key, DRIFT_CHECK), passed, description, meta)


def runs_scope(
    pipeline_keys: Mapping[str, AssetKey], names: LocationNames
) -> frozenset[AssetKey] | None:
    """The pipelines whose runs a location counts as its own: all runs of a batch when it
    is unprefixed, else only its pipelines' (batch ids repeat across locations)."""
    return frozenset(pipeline_keys.values()) if names.prefix else None


def stuck_state(
    instance: DagsterInstance,
    store: "WatermarkStore",
    pipelines: Collection[str],
    policy: RetryPolicy,
    *,
    scope: AbstractSet[AssetKey] | None = None,
) -> tuple[ResumeStep | None, str | None]:
    """What the ``watermark_stuck_batch`` checks are evaluated from: the coordinator's
    decision for the open batch (None: no batch is open) and, when the batch is stuck, the
    error of its newest failed run (see :func:`stuck_result`)."""
    batch = store.open_batch()
    step = None
    if batch is not None:
        facts = batch_runs(instance, batch.batch_id, pipeline_keys=scope).facts
        todo = unfinished(store, batch, pipelines)
        step = resume_step(batch.batch_id, todo, facts, policy=policy)
    error = (
        last_failure(instance, step.batch_id, pipeline_keys=scope)
        if step is not None and step.action is ResumeAction.STUCK
        else None
    )
    return step, error


def stuck_evaluations(
    instance: DagsterInstance,
    store: "WatermarkStore",
    pipeline_keys: Mapping[str, AssetKey],
    policy: RetryPolicy,
    *,
    scope: AbstractSet[AssetKey] | None = None,
) -> list[AssetCheckEvaluation]:
    """Every pipeline's ``watermark_stuck_batch`` check evaluated now, as the check's own
    op evaluates it, as events a run logs after it materialized the pipelines outside the
    batch job (a replay from the launchpad): without them the check shows "Not evaluated"
    for the new materializations until the coordinator next reports a change."""
    step, error = stuck_state(instance, store, pipeline_keys.keys(), policy, scope=scope)
    events = []
    for name, key in sorted(pipeline_keys.items()):
        passed, _, description, meta = stuck_result(name, step, error)
        events.append(check_evaluation(AssetCheckKey(key, STUCK_CHECK), passed, description, meta))
    return events


def build_retention_schedule(
    check_keys: Sequence[AssetCheckKey],
    settings: HealthSettings,
    names: LocationNames = DEFAULT_NAMES,
) -> tuple[list[Any], list[ScheduleDefinition]]:
    """The job running only the ``retention_horizon`` checks and its schedule, RUNNING by
    default, so the checks are evaluated with nobody clicking.

    The job selects the checks alone (``AssetSelection.checks``): its runs execute the
    check op with the ``watermark_store`` resource and materialize no asset, so no
    pipeline runs and no JVM starts.

    Returns:
        ``([job], [schedule])``, or two empty lists when there is no retention check.
    """
    if not check_keys:
        return [], []
    job = define_asset_job(
        names.retention_job,
        selection=AssetSelection.checks(*check_keys),
        description="Runs the retention_horizon checks of the upstreams (no pipeline, no JVM).",
    )
    schedule = ScheduleDefinition(
        name=names.retention_schedule,
        job=job,
        cron_schedule=settings.retention_check_cron,
        default_status=DefaultScheduleStatus.RUNNING,
        description="Evaluates the retention_horizon checks "
        f"({settings.retention_check_cron}; WATERMARK_RETENTION_CHECK_CRON).",
    )
    return [job], [schedule]


def with_freshness(asset: AssetsDefinition, settings: HealthSettings) -> AssetsDefinition:
    """``asset`` with a time-window freshness policy: it fails when the asset has not been
    materialized for ``freshness_fail_after_seconds`` (unchanged when that is 0)."""
    if not settings.freshness_fail_after_seconds:
        return asset
    policy = FreshnessPolicy.time_window(
        fail_window=timedelta(seconds=settings.freshness_fail_after_seconds)
    )

    def attach(spec: AssetSpec) -> AssetSpec:
        return apply_freshness_policy(spec, policy)

    return asset.map_asset_specs(attach)
