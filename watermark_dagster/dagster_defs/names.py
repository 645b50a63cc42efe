"""The names a code location gives Dagster: job, sensors, partitions, resource keys, op
names. Several locations merged into one ``Definitions`` (one per
:class:`~watermark_dagster.dagster_defs.component.WatermarkComponent`) must not share any
of them, so each may carry a prefix; without one the names are the constants below,
unchanged.
"""

import re
from dataclasses import dataclass
from typing import Any

from watermark_dagster.errors import ConfigurationError

BATCH_JOB = "watermark_batch_job"
BATCHES_PARTITIONS_NAME = "watermark_batches"
COORDINATOR = "watermark_coordinator"
FINALIZER = "watermark_finalizer"
RETENTION_JOB = "watermark_retention_check_job"
# Observes every upstream (a click in the UI); the coordinator targets it too, so the UI
# shows the coordinator as each upstream's automation (the coordinator observes them).
OBSERVE_JOB = "watermark_observe_upstreams"
# `watermark replay` from the launchpad (dagster_defs/replay_job.py), and its op.
REPLAY_JOB = "watermark_replay_job"
REPLAY_OP = "watermark_replay"
RETENTION_SCHEDULE = "watermark_retention_schedule"
# Resource keys. The registry is a resource so that it travels with the Definitions (merges
# keep resources); no asset requires it.
SPARK_RESOURCE_KEY = "spark"
STORE_RESOURCE_KEY = "watermark_store"
REGISTRY_RESOURCE_KEY = "watermark_registry"
TARGETS_IO_MANAGER_KEY = "watermark_targets"
# Op names of the multi-assets and multi-asset checks: one op name per Definitions.
UPSTREAMS_OP = "watermark_upstreams"
LAG_CHECKS_OP = "watermark_lag_checks"
STUCK_CHECKS_OP = "watermark_stuck_batch_checks"
DRIFT_CHECKS_OP = "watermark_drift_checks"
WAREHOUSE_CHECKS_OP = "watermark_warehouse_checks"
RETENTION_CHECKS_OP = "watermark_retention_checks"
CONTINUITY_CHECKS_OP = "watermark_continuity_checks"

_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass(frozen=True)
class LocationNames:
    """The Dagster names of one code location: each constant of this module, behind
    ``prefix`` and an underscore when there is a prefix (``sales`` gives
    ``sales_watermark_coordinator``, ``sales_spark``, ...).

    Raises:
        ConfigurationError: the prefix is not a name Dagster accepts.
    """

    prefix: str | None = None

    def __post_init__(self) -> None:
        if self.prefix is not None and not _PREFIX.fullmatch(self.prefix):
            raise ConfigurationError(
                f"The location name {self.prefix!r} cannot prefix Dagster names (jobs, "
                "sensors, resource keys).",
                fix="use letters, digits and underscores, starting with a letter (e.g. sales).",
            )

    def of(self, name: str) -> str:
        """``name`` with this location's prefix."""
        return f"{self.prefix}_{name}" if self.prefix else name

    @property
    def batch_job(self) -> str:
        """The job running one batch partition's pipelines."""
        return self.of(BATCH_JOB)

    @property
    def batches_partitions(self) -> str:
        """The dynamic partitions definition of the batches."""
        return self.of(BATCHES_PARTITIONS_NAME)

    @property
    def coordinator(self) -> str:
        """The coordinator sensor."""
        return self.of(COORDINATOR)

    @property
    def finalizer(self) -> str:
        """The finalizer sensor."""
        return self.of(FINALIZER)

    @property
    def retention_job(self) -> str:
        """The job of the retention checks."""
        return self.of(RETENTION_JOB)

    @property
    def observe_job(self) -> str:
        """The job observing every upstream."""
        return self.of(OBSERVE_JOB)

    @property
    def replay_job(self) -> str:
        """The job replaying an applied version range (launchpad config)."""
        return self.of(REPLAY_JOB)

    @property
    def retention_schedule(self) -> str:
        """The schedule of the retention checks."""
        return self.of(RETENTION_SCHEDULE)

    @property
    def spark_resource(self) -> str:
        """The Spark resource's key."""
        return self.of(SPARK_RESOURCE_KEY)

    @property
    def store_resource(self) -> str:
        """The control tables' resource key."""
        return self.of(STORE_RESOURCE_KEY)

    @property
    def registry_resource(self) -> str:
        """The registry's resource key."""
        return self.of(REGISTRY_RESOURCE_KEY)

    @property
    def targets_io_manager(self) -> str:
        """The key of the I/O manager loading pipeline targets."""
        return self.of(TARGETS_IO_MANAGER_KEY)

    def resource(self, context: Any, key: str) -> Any:
        """The resource ``key`` (one of the keys above) from an op, check or sensor context."""
        return getattr(context.resources, key)


DEFAULT_NAMES = LocationNames()


def prefix_of_registry_key(key: str) -> str | None:
    """The prefix of a location whose registry resource has key ``key``: None for the
    unprefixed key; raises ``ValueError`` for a key that is no registry key."""
    if key == REGISTRY_RESOURCE_KEY:
        return None
    suffix = "_" + REGISTRY_RESOURCE_KEY
    if key.endswith(suffix) and _PREFIX.fullmatch(key[: -len(suffix)]):
        return key[: -len(suffix)]
    raise ValueError(key)
