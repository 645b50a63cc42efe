"""The schedule of the ``retention_horizon`` checks (:func:`build_retention_schedule`),
shipped RUNNING so the checks are evaluated with nobody clicking.
"""

from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetSelection,
    DefaultScheduleStatus,
    ScheduleDefinition,
    define_asset_job,
)

from watermark_dagster.dagster_defs.health import HealthSettings
from watermark_dagster.dagster_defs.names import DEFAULT_NAMES, LocationNames


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
