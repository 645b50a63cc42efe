"""The ``watermark_lag`` check: how far a consumed versioned upstream is ahead of its
committed watermark.

It fails (severity ERROR) when the upstream is more than ``lag_max_versions`` versions
ahead of its committed watermark, or when its oldest unconsumed commit (the commit of
``committed + 1``) is older than ``lag_max_seconds``. The coordinator reports it from every
tick (:class:`~watermark_dagster.dagster_defs.health_reporter.HealthReporter`), and it can
be run from the UI (:func:`~watermark_dagster.dagster_defs.checks.build_health_checks`).
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dagster import MetadataValue

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.observations import Observation
from watermark_dagster.dagster_defs.health import HealthSettings
from watermark_dagster.dagster_defs.health_stuck import STUCK_CHECK
from watermark_dagster.observe.retention import commit_time, format_duration

LAG_CHECK = "watermark_lag"


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
