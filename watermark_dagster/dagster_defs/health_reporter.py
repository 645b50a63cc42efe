"""What the coordinator sensor reports about health on each tick
(:class:`HealthReporter`): an evaluation of the lag and stuck-batch checks when a check's
outcome changes, and otherwise at most every ``observe_every_seconds``, together with an
upstream observation (so lag plots have a point per interval even when nothing moved).
"""

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    AssetObservation,
    DagsterInstance,
    MetadataValue,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,  # not exported; the UI's match key
)

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.observations import Observation
from watermark_dagster.core.resuming import ResumeStep
from watermark_dagster.dagster_defs.check_family import check_evaluation
from watermark_dagster.dagster_defs.health import HealthSettings
from watermark_dagster.dagster_defs.health_lag import (
    LAG_CHECK,
    CommitTimes,
    lag_result,
    measure_lag,
)
from watermark_dagster.dagster_defs.health_stuck import (
    STUCK_CHECK,
    evaluated_before_latest,
    last_failure,
    stuck_result,
)
from watermark_dagster.observe.observer import Observer


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


def with_metadata(event: AssetObservation, extra: Mapping[str, Any]) -> AssetObservation:
    """``event`` with ``extra`` added to its metadata."""
    return AssetObservation(
        asset_key=event.asset_key,
        description=event.description,
        metadata={**event.metadata, **extra},
        partition=event.partition,
        tags=event.tags,
    )
