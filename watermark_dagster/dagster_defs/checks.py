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

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    MetadataValue,
    multi_asset_check,
)

from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import Upstream
from watermark_dagster.core.observations import RegistryObservation, recreation
from watermark_dagster.core.records import Batch
from watermark_dagster.dagster_defs.names import (
    CONTINUITY_CHECKS_OP,
    DEFAULT_NAMES,
    RETENTION_CHECKS_OP,
    LocationNames,
)
from watermark_dagster.dagster_defs.resources import WatermarkStoreResource
from watermark_dagster.errors import TerminalError, UpstreamUnavailableError, WatermarkError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.observe.retention import (
    DEFAULT_MARGIN,
    RetentionStatus,
    check_retention,
    format_duration,
    margin_for,
)
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


def _versioned(upstream: Upstream) -> bool:
    # Cursor upstreams (mode "timestamp") have no Delta versions to lose.
    return not upstream.is_cursor


def per_upstream_check_specs(
    upstreams: Iterable[Upstream],
    upstream_keys: Mapping[str, AssetKey],
    check: str,
    describe: Callable[[str], str],
) -> tuple[dict[AssetCheckKey, Upstream], list[AssetCheckSpec]]:
    """Check ``check`` on each of ``upstreams``: its key -> upstream, and its specs."""
    found = {AssetCheckKey(upstream_keys[u.name], check): u for u in upstreams}
    specs = [
        AssetCheckSpec(check, asset=key.asset_key, description=describe(u.name))
        for key, u in found.items()
    ]
    return found, specs


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
    upstreams, specs = per_upstream_check_specs(
        [u for u in registry.consumed_upstreams() if _versioned(u)],
        upstream_keys,
        RETENTION_CHECK,
        lambda name: (
            f"Fails when the oldest version of '{name}' a batch still needs is "
            "near the table's retention horizon (delta.deletedFileRetentionDuration, "
            "delta.logRetentionDuration) or already gone."
        ),
    )
    if not upstreams:
        return []

    @multi_asset_check(
        specs=specs,
        can_subset=True,
        name=names.of(RETENTION_CHECKS_OP),
        description="Retention horizon of each upstream's oldest needed version.",
        required_resource_keys={names.store_resource},
    )
    def retention_checks(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        store = watermark_store.get_store()
        committed, batch = store.committed_versions(), store.open_batch()
        for key in sorted(context.selected_asset_check_keys, key=lambda k: k.to_user_string()):
            passed, description, metadata = retention_outcome(
                upstreams[key], committed, batch, settings
            )
            (context.log.info if passed else context.log.error)(description)
            yield AssetCheckResult(
                asset_key=key.asset_key,
                check_name=key.name,
                passed=passed,
                severity=AssetCheckSeverity.ERROR,
                description=description,
                metadata=metadata,
            )

    return [retention_checks]


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
    for upstream in [u for u in registry.consumed_upstreams() if _versioned(u)]:
        passed, description, metadata = retention_outcome(upstream, committed, batch, settings)
        events.append(
            AssetCheckEvaluation(
                asset_key=upstream_keys[upstream.name],
                check_name=RETENTION_CHECK,
                passed=passed,
                severity=AssetCheckSeverity.ERROR,
                description=description,
                metadata=metadata,
            )
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
        events.append(
            AssetCheckEvaluation(
                asset_key=upstream_keys[name],
                check_name=CONTINUITY_CHECK,
                passed=passed,
                severity=AssetCheckSeverity.ERROR,
                description=description,
                metadata=meta,
            )
        )
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
    upstreams, specs = per_upstream_check_specs(
        registry.consumed_upstreams(),
        upstream_keys,
        CONTINUITY_CHECK,
        lambda name: (
            f"Fails while nothing can be planned for '{name}': the table was "
            "dropped and recreated since its committed watermark, it is missing, or the "
            "range it needs next can no longer be read (log cleanup, VACUUM). The "
            "coordinator sensor reports it at every look at the upstreams."
        ),
    )
    if not upstreams:
        return []

    @multi_asset_check(
        specs=specs,
        can_subset=True,
        name=names.of(CONTINUITY_CHECKS_OP),
        description="Whether each upstream still continues from its committed watermark.",
        required_resource_keys={names.store_resource},
    )
    def continuity_checks(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        store = watermark_store.get_store()
        marks = store.committed()
        unreadable = unreadable_next_ranges(registry, observer, store)
        for key in sorted(context.selected_asset_check_keys, key=lambda k: k.to_user_string()):
            upstream = upstreams[key]
            mark = marks.get(upstream.name)
            problem: WatermarkError | None
            try:
                problem = recreation(observer.observe(upstream), mark)
            except UpstreamUnavailableError as e:
                problem = e
            problem = problem or unreadable.get(upstream.name)
            passed, description, meta = continuity_result(
                upstream.name, problem, mark.committed_version if mark else None
            )
            (context.log.info if passed else context.log.error)(description)
            yield AssetCheckResult(
                asset_key=key.asset_key,
                check_name=key.name,
                passed=passed,
                severity=AssetCheckSeverity.ERROR,
                description=description,
                metadata=meta,
            )

    return [continuity_checks]
