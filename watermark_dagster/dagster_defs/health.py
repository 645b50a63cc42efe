"""The settings of a code location's health signals (:class:`HealthSettings`): the
thresholds of the lag check, the observation cadence, the pipelines' freshness and the
retention check's schedule.

The signals live beside it: the lag check (``health_lag``), the stuck-batch check
(``health_stuck``), the drift check (``health_drift``), what the coordinator reports on
each tick (``health_reporter``), the retention check's schedule (``health_retention``) and
the freshness policy (``health_freshness``).
"""

from dataclasses import dataclass, field

from dagster import (
    DagsterInvalidDefinitionError,
    ScheduleDefinition,
)

from watermark_dagster.config.env import (
    DEFAULT_FRESHNESS_FAIL_AFTER_SECONDS,
    DEFAULT_LAG_MAX_SECONDS,
    DEFAULT_LAG_MAX_VERSIONS,
    DEFAULT_OBSERVE_EVERY_SECONDS,
    DEFAULT_RETENTION_CHECK_CRON,
)
from watermark_dagster.config.options import Kind, is_seconds, written_as
from watermark_dagster.errors import ConfigurationError

# Dagster refuses a time-window freshness policy shorter than this.
MIN_FRESHNESS_SECONDS = 60


def _positive(name: str, value: float, fix: str) -> None:
    if not is_seconds(value):
        raise ConfigurationError(
            f"HealthSettings.{name}={value!r} is not a finite number >= 0.",
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
