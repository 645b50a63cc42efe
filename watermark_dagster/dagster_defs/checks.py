"""Dagster asset checks on upstreams: the retention horizon.

One check per versioned upstream, on the upstream's observable source asset: it fails
(severity ERROR) when the oldest version a batch still needs is close to the table's
retention horizon, or already gone, so an operator can act before VACUUM or log cleanup
makes the range unreadable. The decision lives in :mod:`watermark_dagster.observe.retention`.
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dagster import (
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

from watermark_dagster.dagster_defs.resources import WatermarkStoreResource
from watermark_dagster.errors import TerminalError
from watermark_dagster.observe.retention import (
    DEFAULT_MARGIN,
    RetentionStatus,
    check_retention,
    format_duration,
    margin_for,
)
from watermark_dagster.registry import Registry, Upstream

RETENTION_CHECK = "retention_horizon"


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

    Returns:
        A list holding the checks' definition, or an empty list when no pipeline reads a
        versioned upstream.

    Example:
        >>> checks = build_retention_checks(registry, {"orders": AssetKey(["orders"])})
        >>> Definitions(assets=[...], asset_checks=checks, resources={"watermark_store": ...})
    """
    settings = settings or RetentionCheckSettings()
    upstreams = {
        AssetCheckKey(upstream_keys[u.name], RETENTION_CHECK): u
        for u in registry.consumed_upstreams()
        if _versioned(u)
    }
    if not upstreams:
        return []
    specs = [
        AssetCheckSpec(
            RETENTION_CHECK,
            asset=key.asset_key,
            description=f"Fails when the oldest version of '{u.name}' a batch still needs is "
            "near the table's retention horizon (delta.deletedFileRetentionDuration, "
            "delta.logRetentionDuration) or already gone.",
        )
        for key, u in upstreams.items()
    ]

    @multi_asset_check(
        specs=specs,
        can_subset=True,
        name="watermark_retention_checks",
        description="Retention horizon of each upstream's oldest needed version.",
    )
    def retention_checks(
        context: AssetCheckExecutionContext, watermark_store: WatermarkStoreResource
    ) -> Iterator[AssetCheckResult]:
        store = watermark_store.get_store()
        committed = store.committed_versions()
        batch = store.open_batch()
        for key in sorted(context.selected_asset_check_keys, key=lambda k: k.to_user_string()):
            upstream = upstreams[key]
            try:
                status = check_retention(
                    upstream,
                    committed=committed.get(upstream.name),
                    open_input=batch.inputs.get(upstream.name) if batch else None,
                    batch_id=batch.batch_id if batch else None,
                    margin=settings.margin,
                )
            except TerminalError as e:
                # One unreadable table must not hide the other upstreams' results.
                context.log.error(str(e))
                yield AssetCheckResult(
                    asset_key=key.asset_key,
                    check_name=key.name,
                    passed=False,
                    severity=AssetCheckSeverity.ERROR,
                    description=str(e),
                    metadata={"upstream": upstream.name, **e.metadata()},
                )
                continue
            log = context.log.info if status.passed else context.log.error
            log(status.message)
            yield AssetCheckResult(
                asset_key=key.asset_key,
                check_name=key.name,
                passed=status.passed,
                severity=AssetCheckSeverity.ERROR,
                description=status.message,
                metadata=retention_metadata(status),
            )

    return [retention_checks]
