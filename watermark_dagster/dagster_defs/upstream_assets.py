"""The upstreams as Dagster assets: one observable source asset per upstream
(:func:`build_upstream_assets`), observed without a JVM, and the observation events the
sensors report (:func:`observation_event`).
"""

import warnings
from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    BetaWarning,
    Failure,
    MetadataValue,
    ObserveResult,
    multi_observable_source_asset,
)

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.observations import Observation
from watermark_dagster.dagster_defs.names import (
    DEFAULT_NAMES,
    UPSTREAMS_OP,
    LocationNames,
)
from watermark_dagster.dagster_defs.resources import WatermarkStoreResource
from watermark_dagster.dagster_defs.translator import WatermarkTranslator
from watermark_dagster.errors import UpstreamUnavailableError
from watermark_dagster.observe.observer import Observer


def observation_metadata(obs: Observation, committed: int | None) -> dict[str, Any]:
    """What an upstream observation shows: versions, lag, CDF flag, identity."""
    if obs.is_cursor:
        return {"source_state": obs.state or "unknown", "path": MetadataValue.path(obs.path)}
    lag = obs.latest_version - (-1 if committed is None else committed)
    # Numbers stay numbers (the UI plots them); a value that does not exist is left out.
    return {
        "latest_version": obs.latest_version,
        **({"committed_version": committed} if committed is not None else {}),
        "lag_versions": lag,
        "cdf_enabled": obs.cdf_enabled,
        "table_id": obs.table_id,
        "schema_fingerprint": obs.schema_fingerprint,
        "path": MetadataValue.path(obs.path),
    }


def observation_event(obs: Observation, key: AssetKey, committed: int | None) -> AssetObservation:
    """An observation event a sensor can report.

    It carries the table's versions as metadata, not as a Dagster data version: Dagster
    marks a partition "Unsynced" when an upstream's data version differs from the one
    recorded when the partition was materialized. A batch partition's inputs are its pinned
    ranges, which never change (I3), so a newer upstream version is work for a new batch,
    never a reason to re-run a completed one; the upstream's data version therefore stays
    constant and completed batches stay in sync.
    """
    return AssetObservation(asset_key=key, metadata=observation_metadata(obs, committed))


def build_upstream_assets(
    registry: Registry,
    translator: WatermarkTranslator,
    observer: Observer,
    names: LocationNames = DEFAULT_NAMES,
) -> AssetsDefinition:
    """One observable source asset per upstream (observed without a JVM); ``names`` gives
    its op name and the key of the control tables' resource."""
    keys = {translator.get_asset_key(u): u for u in registry.upstreams.values()}
    specs = [
        AssetSpec(
            key=key,
            group_name=translator.get_group_name(u),
            description=translator.get_description(u),
            metadata=translator.get_metadata(u),
            kinds=translator.get_kinds(u),
        )
        for key, u in keys.items()
    ]

    def observe_upstreams(context: AssetExecutionContext) -> Iterator[ObserveResult]:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        committed = watermark_store.get_store().committed_versions()
        for key in context.selected_asset_keys:
            upstream = keys[key]
            try:
                obs = observer.observe(upstream)
            except UpstreamUnavailableError as e:
                context.log.error(str(e))
                raise Failure(description=str(e), metadata=e.metadata()) from e
            # No data version, as for the sensors' observations (see observation_event).
            yield ObserveResult(
                asset_key=key, metadata=observation_metadata(obs, committed.get(upstream.name))
            )

    # multi_observable_source_asset is the current, non-deprecated form; it is marked beta.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        return multi_observable_source_asset(
            specs=specs,
            can_subset=True,
            name=names.of(UPSTREAMS_OP),
            required_resource_keys={names.store_resource},
        )(observe_upstreams)
