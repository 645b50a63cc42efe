"""The location's settings: how often and how eagerly batches are planned and retried,
each read from its ``WATERMARK_...`` variable unless the location sets it."""

from dataclasses import dataclass, field
from typing import Literal, get_args

from dagster import DefaultSensorStatus

from watermark_dagster.config.env import (
    DEFAULT_KEEP_BATCH_PARTITIONS,
    DEFAULT_MIN_BATCH_INTERVAL_SECONDS,
    DEFAULT_SENSOR_INTERVAL_SECONDS,
)
from watermark_dagster.config.options import Kind, is_seconds, written_as
from watermark_dagster.core.resuming import (
    DEFAULT_DEATH_BACKOFF_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_DEATHS,
    RetryPolicy,
)
from watermark_dagster.dagster_defs.health import HealthSettings
from watermark_dagster.dagster_defs.pruning import check_keep_batch_partitions
from watermark_dagster.errors import ConfigurationError

# Where a batch is finalized (WatermarkSettings.finalize).
FinalizeWhere = Literal["run", "sensor"]


@dataclass(frozen=True)
class WatermarkSettings:
    """How often and how eagerly batches are planned and retried.

    Each setting a code location leaves out is read from its ``WATERMARK_...`` variable
    (docs/configuration.md lists them, made from these declarations).

    Attributes:
        min_batch_interval_seconds: no batch is planned sooner than this after the previous
            one; changes in between are coalesced, which keeps the partition count down (0:
            plan as soon as there is work).
        sensor_interval_seconds: how often the coordinator and finalizer tick.
        max_attempts: failed runs (an error was raised) of one batch before the coordinator
            stops resubmitting it and reports it stuck (a terminal error stops it at once).
        max_deaths: runs of one batch that may die (killed, run worker lost, engine gone: no
            error) before it is reported stuck; a death spends no attempt.
        death_backoff_seconds: the wait after a run died before its batch is run again,
            doubling with each further death of the batch up to 5 minutes (0: no wait).
        maintain_every_batches: the finalizer compacts the control tables after every N-th
            batch (0: never), keeping sensor reads small as history grows.
        default_status: whether the sensors start running when the code location loads.
        keep_batch_partitions: the finalizer keeps the newest N batch partitions in Dagster
            (0: all), deleting older ones of ended batches, at most ``PRUNE_PER_TICK`` a
            tick. A pruned batch stays in the control tables (``watermark batch ID``) and
            its runs in Dagster; it is re-run with ``watermark replay``, not a UI backfill.
        finalize: where a batch is finalized: ``run`` (default) in each pipeline run's last
            step once its pipeline succeeded, so a batch completes when its last run ends,
            with the finalizer sensor as the backstop; ``sensor``: by the finalizer sensor
            alone, at its next tick after the runs.
        health: the lag and stuck-batch checks' thresholds, the observation cadence, the
            pipelines' freshness and the retention check's schedule
            (:class:`.health.HealthSettings`).
    """

    min_batch_interval_seconds: float = field(
        default=DEFAULT_MIN_BATCH_INTERVAL_SECONDS,
        metadata=written_as(Kind.SECONDS, env="WATERMARK_MIN_BATCH_INTERVAL_SECONDS"),
    )
    sensor_interval_seconds: int = field(
        default=DEFAULT_SENSOR_INTERVAL_SECONDS,
        metadata=written_as(
            Kind.WHOLE, shape="a whole number of seconds", env="WATERMARK_SENSOR_INTERVAL_SECONDS"
        ),
    )
    max_attempts: int = field(
        default=DEFAULT_MAX_ATTEMPTS,
        metadata=written_as(Kind.WHOLE, env="WATERMARK_MAX_ATTEMPTS"),
    )
    max_deaths: int = field(
        default=DEFAULT_MAX_DEATHS, metadata=written_as(Kind.WHOLE, env="WATERMARK_MAX_DEATHS")
    )
    death_backoff_seconds: float = field(
        default=DEFAULT_DEATH_BACKOFF_SECONDS,
        metadata=written_as(Kind.SECONDS, env="WATERMARK_DEATH_BACKOFF_SECONDS"),
    )
    maintain_every_batches: int = field(default=50, metadata=written_as(Kind.WHOLE))
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING
    keep_batch_partitions: int = field(
        default=DEFAULT_KEEP_BATCH_PARTITIONS,
        metadata=written_as(Kind.WHOLE, env="WATERMARK_KEEP_BATCH_PARTITIONS"),
    )
    finalize: FinalizeWhere = field(
        default="run", metadata=written_as(Kind.CHOICE, env="WATERMARK_FINALIZE")
    )
    health: HealthSettings = field(default_factory=HealthSettings)

    def __post_init__(self) -> None:
        check_keep_batch_partitions(self.keep_batch_partitions)
        if self.finalize not in get_args(FinalizeWhere):
            raise ConfigurationError(
                f"WatermarkSettings.finalize={self.finalize!r} is not where a batch can be "
                "finalized.",
                fix="use 'run' (each run finalizes its batch, the finalizer sensor backs it "
                "up) or 'sensor' (the finalizer sensor alone); environment: "
                "WATERMARK_FINALIZE.",
            )
        for name in ("min_batch_interval_seconds", "death_backoff_seconds"):
            value = getattr(self, name)
            if not is_seconds(value):
                raise ConfigurationError(
                    f"WatermarkSettings.{name}={value!r} is not a finite number of seconds "
                    "of 0 or more.",
                    fix=f"use seconds such as {getattr(WatermarkSettings, name):g} "
                    f"(environment: WATERMARK_{name.upper()}).",
                )
        interval = self.sensor_interval_seconds
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigurationError(
                f"WatermarkSettings.sensor_interval_seconds={interval!r} is not a whole number "
                "of seconds of 1 or more (Dagster ticks a sensor at most once a second).",
                fix=f"use 1 or more, such as {DEFAULT_SENSOR_INTERVAL_SECONDS} "
                "(environment: WATERMARK_SENSOR_INTERVAL_SECONDS).",
            )
        for name in ("max_attempts", "max_deaths"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"WatermarkSettings.{name}={value!r} is not a whole number of runs of 1 "
                    "or more.",
                    fix=f"use 1 or more, such as {getattr(WatermarkSettings, name)} "
                    f"(environment: WATERMARK_{name.upper()}).",
                )
        self.retry_policy  # noqa: B018 -- validates the backoff when the settings are made

    @property
    def retry_policy(self) -> RetryPolicy:
        """``max_attempts``, ``max_deaths`` and ``death_backoff_seconds`` as one value."""
        return RetryPolicy(self.max_attempts, self.max_deaths, self.death_backoff_seconds)
