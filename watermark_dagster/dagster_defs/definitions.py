"""Building a code location from a registry: its ``Definitions`` and the location object
that carries them with the registry and the store settings.

The ``watermark`` command line needs the registry behind a code location, which a
``Definitions`` cannot hold as an attribute. :func:`build_location` returns a
:class:`WatermarkLocation` holding both; the ``Definitions`` carry the registry as a
resource as well, so :func:`location_of` recovers the whole location from a plain
``Definitions`` built here (a module that exposes only ``defs``), with no process-wide
lookup. Several locations merged into one ``Definitions`` (one per component) each carry
a name that prefixes their jobs, sensors and resource keys (:mod:`.names`);
:func:`locations_in` finds them all.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Required, TypedDict, Unpack

from dagster import (
    AssetSelection,
    Definitions,
    DynamicPartitionsDefinition,
    define_asset_job,
    in_process_executor,
)

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.locations import absolute_location
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.secrets import (
    StorageOptions,
    check_spark_conf,
    checked_options,
    resolved_options,
)
from watermark_dagster.dagster_defs.assets import build_pipeline_asset
from watermark_dagster.dagster_defs.checks import (
    RETENTION_CHECK,
    build_continuity_checks,
    build_health_checks,
    build_retention_checks,
)
from watermark_dagster.dagster_defs.health_freshness import with_freshness
from watermark_dagster.dagster_defs.health_retention import build_retention_schedule
from watermark_dagster.dagster_defs.names import BATCH_JOB as BATCH_JOB
from watermark_dagster.dagster_defs.names import (
    DEFAULT_NAMES,
    LocationNames,
    prefix_of_registry_key,
)
from watermark_dagster.dagster_defs.names import REGISTRY_RESOURCE_KEY as REGISTRY_RESOURCE_KEY
from watermark_dagster.dagster_defs.names import SPARK_RESOURCE_KEY as SPARK_RESOURCE_KEY
from watermark_dagster.dagster_defs.names import STORE_RESOURCE_KEY as STORE_RESOURCE_KEY
from watermark_dagster.dagster_defs.replay_job import build_replay_job
from watermark_dagster.dagster_defs.resources import (
    SparkSessionResource,
    WatermarkStoreResource,
    dagster_values,
    spark_from_variables,
)
from watermark_dagster.dagster_defs.runs import check_consumers
from watermark_dagster.dagster_defs.sensors import (
    build_coordinator_sensor,
    build_finalizer_sensor,
)
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.dagster_defs.target_io import PipelineTargetIOManager
from watermark_dagster.dagster_defs.translator import WatermarkTranslator
from watermark_dagster.dagster_defs.upstream_assets import build_upstream_assets
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.runtime.catalog import resolve_catalog_tables
from watermark_dagster.runtime.jdbc import spark_jdbc_settings
from watermark_dagster.runtime.storage import spark_s3_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from watermark_dagster.store import WatermarkStore


@dataclass(frozen=True)
class WatermarkLocation:
    """A watermark code location: its registry, control tables, Spark resource and the
    ``Definitions`` Dagster loads.

    Built by :func:`build_location`, or recovered from its ``Definitions`` by
    :func:`location_of`. The ``watermark`` command line works on one of these.
    """

    registry: Registry
    store_resource: WatermarkStoreResource
    spark_resource: SparkSessionResource
    definitions: Definitions
    names: LocationNames = DEFAULT_NAMES

    @property
    def name(self) -> str | None:
        """The location's name, the prefix of its Dagster names (None: unprefixed)."""
        return self.names.prefix

    @property
    def control_root(self) -> str:
        """Where the control tables live."""
        return self.store_resource.control_root

    @property
    def storage_options(self) -> dict[str, str] | None:
        """delta-rs storage options for the control root (credentials as ``EnvVar``; the
        stores resolve them when they open a table)."""
        return self.store_resource.storage_options

    def store(self) -> "WatermarkStore":
        """The control tables (created on first use, as the sensors do)."""
        return self.store_resource.get_store()

    def read_only_store(self) -> "WatermarkStore":
        """The same control tables opened read-only: nothing is created (a missing table
        reads as empty) and nothing can be written."""
        from watermark_dagster.store import ReadOnlyWatermarkStore

        return ReadOnlyWatermarkStore(self.control_root, storage_options=self.storage_options)

    def spark_session(self) -> "SparkSession":
        """The location's Spark session (started on first call)."""
        return self.spark_resource.get_session()


def build_location(
    registry: Registry,
    *,
    control_root: str,
    spark: SparkSessionResource | None = None,
    settings: WatermarkSettings | None = None,
    translator: WatermarkTranslator | None = None,
    storage_options: StorageOptions | None = None,
    name: str | None = None,
) -> WatermarkLocation:
    """Everything a watermark code location needs, from its registry.

    Upstreams become observable source assets, pipelines batch-partitioned assets selected
    by one job, and the coordinator and finalizer sensors drive them. The in-process
    executor runs all pipelines of a run in one process: one JVM per run, not per asset.

    Args:
        registry: the upstreams and pipelines. Those named by catalog table are resolved
            to their locations here, in a short-lived Spark process with ``spark``'s
            settings (:mod:`watermark_dagster.runtime.catalog`); a registry of paths starts
            none.
        control_root: where the control tables live.
        spark: the Spark resource (default: the one the ``WATERMARK_SPARK_MASTER``,
            ``WATERMARK_SPARK_REMOTE``, ``WATERMARK_SPARK_CONF`` and ``WATERMARK_ENGINE``
            variables describe, local[*] with Delta when they are unset).
        settings: sensor and batching settings.
        translator: asset keys and groups.
        storage_options: delta-rs storage options for the control root.
        name: prefixes the location's job, sensors, batch partitions, resource keys and op
            names (``sales`` gives ``sales_watermark_coordinator``), so that several
            locations merge into one ``Definitions``; None keeps the plain names. Asset keys
            are the translator's: locations merged together must not share one.

    Returns:
        the location; Dagster loads its ``definitions``.

    Example:
        >>> location = build_location(registry, control_root="/lake/_watermark")
        >>> defs = location.definitions
    """
    if not registry.pipelines:
        raise ConfigurationError(
            "The registry has no pipeline; there is nothing to run.",
            fix="declare at least one pipeline with @pipeline(...).",
        )
    spark = spark or spark_from_variables()
    # Dagster records the resources' configuration: credentials only as references.
    spark_settings = spark.settings()
    check_spark_conf(spark_settings.conf, where="the Spark resource's settings")
    storage_options = checked_options("The control root", storage_options)
    control_root = absolute_location(control_root)
    # Catalog table names become locations here, once, in a short-lived Spark process:
    # everything below (observation, planning, asset metadata) works by location.
    registry = resolve_catalog_tables(
        registry,
        master=spark_settings.master,
        remote=spark_settings.remote,
        app_name=spark_settings.app_name,
        conf=resolved_options(spark_settings.conf, "The Spark resource") or {},
    )
    settings = settings or WatermarkSettings()
    translator = translator or WatermarkTranslator()
    names = LocationNames(name)
    observer = Observer()
    partitions_def = DynamicPartitionsDefinition(name=names.batches_partitions)
    upstream_keys = {n: translator.get_asset_key(u) for n, u in registry.upstreams.items()}
    pipeline_keys = {n: translator.get_asset_key(p) for n, p in registry.pipelines.items()}
    # Each pipeline gets the freshness policy of the settings (Dagster's freshness daemon
    # evaluates it), attached to its spec here rather than in its @asset.
    pipeline_assets = [
        with_freshness(
            build_pipeline_asset(p, registry, translator, partitions_def, names, settings),
            settings.health,
        )
        for p in registry.pipelines.values()
    ]
    retention_checks = build_retention_checks(registry, upstream_keys, names=names)
    retention_jobs, retention_schedules = build_retention_schedule(
        [k for c in retention_checks for k in c.check_keys if k.name == RETENTION_CHECK],
        settings.health,
        names,
    )
    job = define_asset_job(
        names.batch_job,
        # Without the checks on the pipelines (watermark_stuck_batch): the coordinator
        # reports those; a batch run executes the pipelines alone.
        selection=AssetSelection.assets(*pipeline_keys.values()).without_checks(),
        description="Runs the pipelines of one batch partition (one process, one JVM).",
    )
    observe_job = define_asset_job(
        names.observe_job,
        selection=AssetSelection.assets(*upstream_keys.values()).without_checks(),
        description="Observes every upstream's Delta version (no JVM). The coordinator sensor "
        "observes them on each tick; this job does it on demand.",
    )
    defs = Definitions(
        assets=[build_upstream_assets(registry, translator, observer, names), *pipeline_assets],
        asset_checks=[
            *retention_checks,
            *build_continuity_checks(registry, upstream_keys, observer, names),
            *build_health_checks(
                registry,
                upstream_keys=upstream_keys,
                pipeline_keys=pipeline_keys,
                observer=observer,
                settings=settings.health,
                policy=settings.retry_policy,
                names=names,
            ),
        ],
        jobs=[
            job,
            observe_job,
            build_replay_job(registry, pipeline_keys, names, settings.retry_policy),
            *retention_jobs,
        ],
        schedules=retention_schedules,
        sensors=[
            build_coordinator_sensor(
                registry=registry,
                observer=observer,
                job=job,
                observe_job=observe_job,
                partitions_def=partitions_def,
                upstream_keys=upstream_keys,
                pipeline_keys=pipeline_keys,
                settings=settings,
                names=names,
            ),
            build_finalizer_sensor(
                registry=registry,
                observer=observer,
                upstream_keys=upstream_keys,
                pipeline_keys=pipeline_keys,
                settings=settings,
                names=names,
            ),
        ],
        resources={
            names.spark_resource: with_s3_settings(spark, registry),
            names.store_resource: WatermarkStoreResource(
                control_root=control_root, storage_options=dagster_values(storage_options)
            ),
            names.registry_resource: registry,
            # Downstream assets load a pipeline's target through it
            # (docs/reading-targets.md); pipeline assets write without it.
            names.targets_io_manager: PipelineTargetIOManager(
                targets={p.name: p.target for p in registry.pipelines.values()},
                storage_options={
                    p.name: dagster_values(p.storage_options) or {}
                    for p in registry.pipelines.values()
                    if p.storage_options
                },
            ),
        },
        executor=in_process_executor,
    )
    # The finalizer's consumers are the registry's; the graph the UI shows and backfills
    # follow must say the same (a translator or a merge could make them differ).
    check_consumers(registry, defs.resolve_all_asset_specs(), upstream_keys)
    return location_of(defs, name)


def with_s3_settings(spark: SparkSessionResource, registry: Registry) -> SparkSessionResource:
    """``spark`` with the settings Spark needs for the registry's tables on S3 (s3a for
    ``s3://``, endpoint, region, each table's storage options per bucket; see
    :mod:`watermark_dagster.runtime.storage`) under its own ``conf``, which wins. A registry
    with no table on S3 gets ``spark`` back unchanged, so its sessions never load
    hadoop-aws; a registry with a database upstream also gets the setting that loads its
    JDBC drivers (:mod:`watermark_dagster.runtime.jdbc`). Credentials stay in the
    environment, or are per-bucket settings whose values are environment references
    (``EnvVar``): Dagster records only the names."""
    tables = [
        (f"upstream '{u.name}'", u.path, u.storage_options) for u in registry.upstreams.values()
    ]
    tables += [
        (f"pipeline '{p.name}' target", p.target, p.storage_options)
        for p in registry.pipelines.values()
        if p.warehouse is None
    ]
    s3 = spark_s3_settings(tables)
    s3.update(
        spark_jdbc_settings(
            [u.name for u in registry.upstreams.values() if isinstance(u, DatabaseUpstream)]
            + [p.name for p in registry.pipelines.values() if p.warehouse is not None]
        )
    )
    if not s3:
        return spark
    fields = {name: getattr(spark, name) for name in type(spark).model_fields}
    return type(spark)(**{**fields, "conf": {**(dagster_values(s3) or {}), **spark.conf}})


class LocationOptions(TypedDict, total=False):
    """The keyword arguments of :func:`build_location` after the registry."""

    control_root: Required[str]
    spark: SparkSessionResource | None
    settings: WatermarkSettings | None
    translator: WatermarkTranslator | None
    storage_options: StorageOptions | None
    name: str | None


def build_definitions(registry: Registry, **options: Unpack[LocationOptions]) -> Definitions:
    """The ``Definitions`` of :func:`build_location`'s code location (same arguments).

    Example:
        >>> defs = build_definitions(registry, control_root="/lake/_watermark")
    """
    return build_location(registry, **options).definitions


def locations_in(defs: Any) -> dict[str | None, WatermarkLocation]:
    """Every location in ``defs``, by name (None for the unprefixed one): a
    :class:`WatermarkLocation` as it is, or the ``Definitions`` of one or several (built by
    :func:`build_location`, merged, or loaded from components)."""
    if isinstance(defs, WatermarkLocation):
        return {defs.name: defs}
    resources = (defs.resources if isinstance(defs, Definitions) else None) or {}
    found: dict[str | None, WatermarkLocation] = {}
    for key, registry in resources.items():
        try:
            prefix = prefix_of_registry_key(key)
        except ValueError:
            continue
        names = LocationNames(prefix)
        store = resources.get(names.store_resource)
        spark = resources.get(names.spark_resource)
        if (
            isinstance(registry, Registry)
            and isinstance(store, WatermarkStoreResource)
            and isinstance(spark, SparkSessionResource)
        ):
            found[prefix] = WatermarkLocation(
                registry=registry,
                store_resource=store,
                spark_resource=spark,
                definitions=defs,
                names=names,
            )
    return found


def location_of(defs: Any, name: str | None = None) -> WatermarkLocation:
    """The location behind ``defs``: a :class:`WatermarkLocation` as it is, or the
    ``Definitions`` of one (built by :func:`build_definitions` or :func:`build_location`,
    merges included). When ``defs`` holds several (components), ``name`` picks one; the
    only one is taken when ``name`` is None.

    Raises:
        ConfigurationError: ``defs`` is neither, so it carries no registry; or it holds no
            location named ``name``, or several and no name was given.
    """
    if isinstance(defs, WatermarkLocation) and name in (None, defs.name):
        return defs
    found = locations_in(defs)
    if not found:
        raise ConfigurationError(
            f"{type(defs).__name__} was not built by watermark_dagster's build_location or "
            "build_definitions, so it carries no registry of upstreams and pipelines.",
            fix="point --defs at a module:attribute holding build_location(...) or "
            "build_definitions(...).",
        )
    if name in found:
        return found[name]
    listed = sorted(str(n) for n in found)
    if name is None and len(found) == 1:
        return next(iter(found.values()))
    if name is None:
        raise ConfigurationError(
            f"These definitions hold {len(found)} watermark locations ({listed}); which one "
            "is meant is ambiguous.",
            fix="name one (location_of(defs, name), HeadlessRunner(..., name=...)), or point "
            "at one component's definitions.",
        )
    raise ConfigurationError(
        f"These definitions hold no watermark location named {name!r}; they hold {listed}.",
        fix="use one of those names (the component's name: attribute).",
    )
