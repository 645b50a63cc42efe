"""Building a code location's ``Definitions`` from a registry."""

from dagster import (
    AssetSelection,
    Definitions,
    DynamicPartitionsDefinition,
    define_asset_job,
    in_process_executor,
)

from watermark_dagster.config.registry import Registry
from watermark_dagster.dagster_defs.assets import (
    BATCHES_PARTITIONS_NAME,
    WatermarkTranslator,
    build_pipeline_asset,
    build_upstream_assets,
)
from watermark_dagster.dagster_defs.checks import build_continuity_checks, build_retention_checks
from watermark_dagster.dagster_defs.resources import SparkSessionResource, WatermarkStoreResource
from watermark_dagster.dagster_defs.sensors import (
    WatermarkSettings,
    build_coordinator_sensor,
    build_finalizer_sensor,
)
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.observe.observer import Observer

BATCH_JOB = "watermark_batch_job"
# Definitions metadata key naming the registry a code location was built from.
REGISTRY_METADATA_KEY = "watermark/registry"
# token -> registry; Definitions are immutable records that hold no extra attributes, so
# the registry is found through a token stored in their metadata (which survives merges).
_REGISTRIES: dict[str, Registry] = {}


def build_definitions(
    registry: Registry,
    *,
    control_root: str,
    spark: SparkSessionResource | None = None,
    settings: WatermarkSettings | None = None,
    translator: WatermarkTranslator | None = None,
    storage_options: dict[str, str] | None = None,
) -> Definitions:
    """Everything a watermark code location needs, from its registry.

    Upstreams become observable source assets, pipelines batch-partitioned assets selected
    by one job, and the coordinator and finalizer sensors drive them. The in-process
    executor runs all pipelines of a run in one process: one JVM per run, not per asset.

    Args:
        registry: the upstreams and pipelines.
        control_root: where the control tables live.
        spark: the Spark resource (default: local[*] with Delta).
        settings: sensor and batching settings.
        translator: asset keys and groups.
        storage_options: delta-rs storage options for the control root.

    Example:
        >>> defs = build_definitions(registry, control_root="/lake/_watermark")
    """
    if not registry.pipelines:
        raise ConfigurationError(
            "The registry has no pipeline; there is nothing to run.",
            fix="declare at least one pipeline with @pipeline(...).",
        )
    settings = settings or WatermarkSettings()
    translator = translator or WatermarkTranslator()
    observer = Observer()
    partitions_def = DynamicPartitionsDefinition(name=BATCHES_PARTITIONS_NAME)
    upstream_keys = {n: translator.upstream_asset_key(u) for n, u in registry.upstreams.items()}
    pipeline_keys = {n: translator.pipeline_asset_key(p) for n, p in registry.pipelines.items()}
    pipeline_assets = [
        build_pipeline_asset(p, registry, translator, partitions_def)
        for p in registry.pipelines.values()
    ]
    job = define_asset_job(
        BATCH_JOB,
        selection=AssetSelection.assets(*pipeline_keys.values()),
        description="Runs the pipelines of one batch partition (one process, one JVM).",
    )
    return Definitions(
        assets=[build_upstream_assets(registry, translator, observer), *pipeline_assets],
        asset_checks=[
            *build_retention_checks(registry, upstream_keys),
            *build_continuity_checks(registry, upstream_keys, observer),
        ],
        jobs=[job],
        sensors=[
            build_coordinator_sensor(
                registry=registry,
                observer=observer,
                job=job,
                partitions_def=partitions_def,
                upstream_keys=upstream_keys,
                pipeline_keys=pipeline_keys,
                settings=settings,
            ),
            build_finalizer_sensor(
                registry=registry,
                observer=observer,
                upstream_keys=upstream_keys,
                pipeline_keys=pipeline_keys,
                settings=settings,
            ),
        ],
        resources={
            "spark": spark or SparkSessionResource(),
            "watermark_store": WatermarkStoreResource(
                control_root=control_root, storage_options=storage_options
            ),
        },
        executor=in_process_executor,
        metadata={REGISTRY_METADATA_KEY: _remember(registry)},
    )


def _remember(registry: Registry) -> str:
    token = f"registry-{id(registry):x}"
    _REGISTRIES[token] = registry
    return token


def registry_of(defs: Definitions) -> Registry:
    """The registry a code location built by :func:`build_definitions` was made from.

    Raises:
        ConfigurationError: ``defs`` was not built by :func:`build_definitions` in this process.
    """
    token = defs.metadata.get(REGISTRY_METADATA_KEY)
    registry = _REGISTRIES.get(str(getattr(token, "value", token)))
    if registry is None:
        raise ConfigurationError(
            "These Definitions were not built by watermark_dagster's build_definitions, so "
            "they carry no registry of upstreams and pipelines.",
            fix="point --defs at a module:attribute built with build_definitions(...).",
        )
    return registry
