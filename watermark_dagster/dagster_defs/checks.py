"""Dagster asset checks on upstreams: the retention horizon and continuity.

On each upstream's observable source asset:

* ``retention_horizon`` (versioned upstreams) fails (severity ERROR) when the oldest
  version a batch still needs is close to the table's retention horizon, or already gone,
  so an operator can act before VACUUM or log cleanup makes the range unreadable. The
  decision lives in :mod:`watermark_dagster.observe.retention`.
* ``watermark_continuity`` fails (severity ERROR) while nothing can be planned for the
  upstream: it was dropped and recreated since its committed watermark, it is missing, or
  the range it needs next can no longer be read (log cleanup, VACUUM).
  The coordinator sensor reports it whenever it looks at the upstreams (so it needs no
  manual run); it can also be run from the asset's *Checks* tab.
"""

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetChecksDefinition,
    AssetKey,
    MetadataValue,
)

from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import Upstream
from watermark_dagster.core.observations import RegistryObservation, recreation
from watermark_dagster.core.records import Batch
from watermark_dagster.core.resuming import RetryPolicy
from watermark_dagster.dagster_defs.check_family import (
    CheckFamily,
    Verdict,
    build_check_family,
    check_evaluation,
    checks_on,
    delta_logged,
    versioned,
)
from watermark_dagster.dagster_defs.health import HealthSettings
from watermark_dagster.dagster_defs.health_drift import DRIFT_CHECK, drift_result
from watermark_dagster.dagster_defs.health_lag import (
    LAG_CHECK,
    CommitTimes,
    lag_result,
    measure_lag,
)
from watermark_dagster.dagster_defs.health_stuck import (
    STUCK_CHECK,
    runs_scope,
    stuck_result,
    stuck_state,
)
from watermark_dagster.dagster_defs.health_warehouse import warehouse_family
from watermark_dagster.dagster_defs.names import (
    CONTINUITY_CHECKS_OP,
    DEFAULT_NAMES,
    DRIFT_CHECKS_OP,
    LAG_CHECKS_OP,
    RETENTION_CHECKS_OP,
    STUCK_CHECKS_OP,
    LocationNames,
)
from watermark_dagster.dagster_defs.resources import WatermarkStoreResource
from watermark_dagster.errors import TerminalError, UpstreamUnavailableError, WatermarkError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.observe.retention import RetentionStatus, check_retention, format_duration
from watermark_dagster.observe.retention_properties import DEFAULT_MARGIN, margin_for
from watermark_dagster.operations.coordinate import unreadable_next_ranges
from watermark_dagster.store import WatermarkStore

RETENTION_CHECK = "retention_horizon"
CONTINUITY_CHECK = "watermark_continuity"


@dataclass(frozen=True)
class RetentionCheckSettings:
    """How early the retention check warns.

    Attributes:
        margin: the check fails this long before the horizon: a fraction of the horizon
            (default 0.25: a quarter of it, e.g. 42 hours of a 7-day retention) or a fixed
            ``timedelta``.
    """

    margin: float | timedelta = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        margin_for(timedelta(days=1), self.margin)  # raises ConfigurationError if unusable


def retention_metadata(status: RetentionStatus) -> dict[str, Any]:
    """What a retention check result shows in the UI."""
    needed = status.needed
    meta: dict[str, Any] = {
        "upstream": status.upstream,
        "path": MetadataValue.path(status.path),
        "state": status.state.value,
        "needed_version": MetadataValue.int(needed.version)
        if needed.version is not None
        else "none",
        "needed_by": needed.why,
        "committed_version": (
            MetadataValue.int(needed.committed_version)
            if needed.committed_version is not None
            else "none"
        ),
        "latest_version": status.latest_version,
        "deleted_file_retention": format_duration(status.deleted_file_retention),
        "log_retention": format_duration(status.log_retention),
        "horizon": format_duration(status.horizon),
        "margin": format_duration(status.margin),
    }
    if needed.batch_id is not None:
        meta["batch_id"] = needed.batch_id
    if status.commit_time is not None and status.age is not None:
        meta["commit_time"] = MetadataValue.timestamp(status.commit_time)
        meta["expires_at"] = MetadataValue.timestamp(status.commit_time + status.horizon)
        meta["age"] = format_duration(status.age)
        meta["age_hours"] = MetadataValue.float(status.age / timedelta(hours=1))
        meta["time_left"] = format_duration(status.horizon - status.age)
        meta["time_left_hours"] = MetadataValue.float(
            (status.horizon - status.age) / timedelta(hours=1)
        )
    return meta


def build_retention_checks(
    registry: Registry,
    upstream_keys: Mapping[str, AssetKey],
    settings: RetentionCheckSettings | None = None,
    names: LocationNames = DEFAULT_NAMES,
) -> list[AssetChecksDefinition]:
    """One ``retention_horizon`` check per versioned upstream that a pipeline reads.

    The checks share one op (a ``multi_asset_check`` that can run any subset), which reads
    the committed watermarks and the open batch once and needs the ``watermark_store``
    resource. A check fails with severity ERROR when the oldest version a batch still needs
    was committed at least ``horizon - margin`` ago (horizon: the smaller of the table's
    ``delta.deletedFileRetentionDuration`` and ``delta.logRetentionDuration``), when that
    version's commit file is gone, or when the table or its retention properties cannot be
    read.

    Args:
        registry: the upstreams and pipelines.
        upstream_keys: upstream name -> its asset key (from the translator).
        settings: the warning margin.
        names: the op name and the control tables' resource key.

    Returns:
        A list holding the checks' definition, or an empty list when no pipeline reads a
        versioned upstream.

    Example:
        >>> checks = build_retention_checks(registry, {"orders": AssetKey(["orders"])})
        >>> Definitions(assets=[...], asset_checks=checks, resources={"watermark_store": ...})
    """
    settings = settings or RetentionCheckSettings()

    def evaluate(
        context: AssetCheckExecutionContext, selected: Sequence[tuple[AssetCheckKey, Upstream]]
    ) -> Iterator[Verdict]:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        store = watermark_store.get_store()
        committed, batch = store.committed_versions(), store.open_batch()
        for key, upstream in selected:
            yield key, *retention_outcome(upstream, committed, batch, settings)

    family = CheckFamily(
        op=RETENTION_CHECKS_OP,
        description="Retention horizon of each upstream's oldest needed version.",
        subjects=checks_on(
            RETENTION_CHECK, upstream_keys, delta_logged(registry.consumed_upstreams()), _name
        ),
        describe=lambda u: (
            f"Fails when the oldest version of '{u.name}' a batch still needs is "
            "near the table's retention horizon (delta.deletedFileRetentionDuration, "
            "delta.logRetentionDuration) or already gone."
        ),
        evaluate=evaluate,
    )
    return build_check_family(family, names)


def retention_outcome(
    upstream: Upstream,
    committed: Mapping[str, int | None],
    batch: Batch | None,
    settings: RetentionCheckSettings,
) -> tuple[bool, str, dict[str, Any]]:
    """``(passed, description, metadata)`` of one upstream's retention check. A table that
    cannot be read fails its own check and does not hide the other upstreams' results."""
    try:
        status = check_retention(
            upstream,
            committed=committed.get(upstream.name),
            open_input=batch.inputs.get(upstream.name) if batch else None,
            batch_id=batch.batch_id if batch else None,
            margin=settings.margin,
        )
    except TerminalError as e:
        return False, str(e), {"upstream": upstream.name, **e.metadata()}
    return status.passed, status.message, retention_metadata(status)


def retention_evaluations(
    registry: Registry,
    upstream_keys: Mapping[str, AssetKey],
    store: WatermarkStore,
    settings: RetentionCheckSettings | None = None,
) -> list[AssetCheckEvaluation]:
    """The ``retention_horizon`` results of every versioned upstream a pipeline reads, as
    events a sensor reports: the coordinator reports them on its first look, so a new
    deployment shows the check evaluated at once; the shipped schedule keeps it current."""
    settings = settings or RetentionCheckSettings()
    committed, batch = store.committed_versions(), store.open_batch()
    events = []
    for upstream in delta_logged(registry.consumed_upstreams()):
        key = AssetCheckKey(upstream_keys[upstream.name], RETENTION_CHECK)
        events.append(
            check_evaluation(key, *retention_outcome(upstream, committed, batch, settings))
        )
    return events


def continuity_result(
    upstream: str, problem: WatermarkError | str | None, committed: int | None = None
) -> tuple[bool, str, dict[str, Any]]:
    """``(passed, description, metadata)`` of the continuity check of one upstream.

    Args:
        upstream: the upstream checked.
        problem: why nothing can be planned for it (an error, or its text), or None.
        committed: its committed version, for the description of a pass.
    """
    if problem is None:
        at = "nothing committed yet" if committed is None else f"committed version {committed}"
        return True, f"'{upstream}' continues from its watermark ({at}).", {"upstream": upstream}
    meta: dict[str, Any] = {"upstream": upstream}
    if isinstance(problem, WatermarkError):
        meta.update(problem.metadata())
    return False, str(problem), meta


def continuity_evaluations(
    look: RegistryObservation,
    upstream_keys: Mapping[str, AssetKey],
    reported: Mapping[str, str],
) -> tuple[list[AssetCheckEvaluation], dict[str, str]]:
    """The continuity check evaluations a coordinator tick reports from its look at the
    upstreams: only those whose outcome changed since ``reported`` (so the event log gets
    a row per change, not per tick).

    Returns:
        the evaluations, and the new ``upstream -> outcome`` mapping to remember.
    """
    names = sorted(set(look.observed) | set(look.errors))
    now: dict[str, str] = {}
    events: list[AssetCheckEvaluation] = []
    for name in names:
        problem: WatermarkError | str | None = look.blocked.get(name) or look.errors.get(name)
        mark = look.marks.get(name)
        passed, description, meta = continuity_result(
            name, problem, mark.committed_version if mark else None
        )
        outcome = "ok" if passed else description
        now[name] = outcome
        if reported.get(name) == outcome:
            continue
        key = AssetCheckKey(upstream_keys[name], CONTINUITY_CHECK)
        events.append(check_evaluation(key, passed, description, meta))
    return events, now


def build_continuity_checks(
    registry: Registry,
    upstream_keys: Mapping[str, AssetKey],
    observer: Observer,
    names: LocationNames = DEFAULT_NAMES,
) -> list[AssetChecksDefinition]:
    """One ``watermark_continuity`` check per upstream that a pipeline reads.

    The coordinator sensor reports these checks from every look it takes at the upstreams
    (see :func:`continuity_evaluations`); the definition returned here lets the UI show
    them and run them by hand. A check fails with severity ERROR while the upstream blocks
    its pipelines: dropped and recreated since its committed watermark (another table id,
    or fewer versions than the watermark), missing, or its next range no longer readable
    (commits or change files gone); the description names the fix.

    Args:
        registry: the upstreams and pipelines.
        upstream_keys: upstream name -> its asset key (from the translator).
        observer: the code location's observer (its cache is shared with the sensors).
        names: the op name and the control tables' resource key.
    """

    def evaluate(
        context: AssetCheckExecutionContext, selected: Sequence[tuple[AssetCheckKey, Upstream]]
    ) -> Iterator[Verdict]:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        store = watermark_store.get_store()
        marks = store.committed()
        unreadable = unreadable_next_ranges(registry, observer, store)
        for key, upstream in selected:
            mark = marks.get(upstream.name)
            problem: WatermarkError | None
            try:
                problem = recreation(observer.observe(upstream), mark)
            except UpstreamUnavailableError as e:
                problem = e
            problem = problem or unreadable.get(upstream.name)
            committed = mark.committed_version if mark else None
            yield key, *continuity_result(upstream.name, problem, committed)

    family = CheckFamily(
        op=CONTINUITY_CHECKS_OP,
        description="Whether each upstream still continues from its committed watermark.",
        subjects=checks_on(CONTINUITY_CHECK, upstream_keys, registry.consumed_upstreams(), _name),
        describe=lambda u: (
            f"Fails while nothing can be planned for '{u.name}': the table was "
            "dropped and recreated since its committed watermark, it is missing, or the "
            "range it needs next can no longer be read (log cleanup, VACUUM). The "
            "coordinator sensor reports it at every look at the upstreams."
        ),
        evaluate=evaluate,
    )
    return build_check_family(family, names)


def _name(upstream: Upstream) -> str:
    return upstream.name


def build_health_checks(
    registry: Registry,
    *,
    upstream_keys: Mapping[str, AssetKey],
    pipeline_keys: Mapping[str, AssetKey],
    observer: Observer,
    settings: HealthSettings,
    policy: RetryPolicy,
    names: LocationNames = DEFAULT_NAMES,
) -> list[AssetChecksDefinition]:
    """The ``watermark_lag`` checks of the consumed versioned upstreams, the
    ``watermark_stuck_batch`` checks of the pipelines and the ``watermark_drift`` checks of
    the declared pipelines, runnable from the UI (the coordinator reports the first two on
    its own through :class:`~watermark_dagster.dagster_defs.health_reporter.HealthReporter`, and
    each batch run reports the third).

    Args:
        registry: the upstreams and pipelines.
        upstream_keys: upstream name -> asset key.
        pipeline_keys: pipeline name -> asset key.
        observer: the code location's observer.
        settings: the lag thresholds.
        policy: the failed runs and deaths after which the coordinator calls a batch stuck.
        names: the op names and the control tables' resource key; a prefixed location
            counts only the runs of its own pipelines (batch ids repeat across locations).
    """
    commit_times = CommitTimes()

    def lag(
        context: AssetCheckExecutionContext, selected: Sequence[tuple[AssetCheckKey, Upstream]]
    ) -> Iterator[Verdict]:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        committed = watermark_store.get_store().committed_versions()
        now = datetime.now(UTC)
        for key, upstream in selected:
            try:
                obs = observer.observe(upstream)
            except UpstreamUnavailableError as e:
                yield key, False, str(e), {"upstream": upstream.name, **e.metadata()}
                continue
            measured = measure_lag(
                obs,
                committed.get(upstream.name),
                now,
                lambda v, u=upstream.name: commit_times.get(u, v, registry),
            )
            passed, _, description, meta = lag_result(measured, settings)
            yield key, passed, description, meta

    scope = runs_scope(pipeline_keys, names)

    def stuck(
        context: AssetCheckExecutionContext, selected: Sequence[tuple[AssetCheckKey, str]]
    ) -> Iterator[Verdict]:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        step, error = stuck_state(
            context.instance, watermark_store.get_store(), pipeline_keys.keys(), policy, scope=scope
        )
        for key, pipeline in selected:
            passed, _, description, meta = stuck_result(pipeline, step, error)
            yield key, passed, description, meta

    def drift(
        context: AssetCheckExecutionContext, selected: Sequence[tuple[AssetCheckKey, str]]
    ) -> Iterator[Verdict]:
        for key, pipeline in selected:
            event = context.instance.get_latest_materialization_event(key.asset_key)
            materialization = event.asset_materialization if event is not None else None
            metadata = materialization.metadata if materialization is not None else None
            yield key, *drift_result(pipeline, metadata)

    def pipeline_name(pipeline: str) -> str:
        return pipeline

    declared = [p for p in pipeline_keys if registry.pipelines[p].declared is not None]
    families: list[CheckFamily[Any]] = [
        CheckFamily(
            op=LAG_CHECKS_OP,
            description="How far each upstream is ahead of its committed watermark.",
            subjects=checks_on(
                LAG_CHECK, upstream_keys, versioned(registry.consumed_upstreams()), _name
            ),
            describe=lambda u: (
                f"Fails when '{u.name}' is too far ahead of its committed watermark (versions "
                "or age of its oldest unconsumed commit). The coordinator sensor reports it."
            ),
            evaluate=lag,
        ),
        CheckFamily(
            op=STUCK_CHECKS_OP,
            description="Whether the open batch is stuck.",
            subjects=checks_on(STUCK_CHECK, pipeline_keys, pipeline_keys, pipeline_name),
            describe=lambda p: (
                f"Fails while the open batch is stuck with '{p}' unfinished (a terminal "
                "error, max_attempts failed runs or max_deaths runs that died). The "
                "coordinator sensor reports it."
            ),
            evaluate=stuck,
        ),
        CheckFamily(
            op=DRIFT_CHECKS_OP,
            description="Whether the newest full batch found the target drifted.",
            subjects=checks_on(DRIFT_CHECK, pipeline_keys, declared, pipeline_name),
            describe=lambda p: (
                f"Fails when a full batch of '{p}' found target rows that differed from the "
                "full transform for keys its changes did not touch (drift). Each batch run "
                "evaluates it for its materialization."
            ),
            evaluate=drift,
            needs_store=False,
        ),
        warehouse_family(registry, pipeline_keys, observer, settings, commit_times, names),
    ]
    return [c for family in families for c in build_check_family(family, names)]
