"""The pipelines' time-window freshness policy (:func:`with_freshness`), which Dagster's
freshness daemon evaluates.
"""

from datetime import timedelta

from dagster import AssetsDefinition, AssetSpec, FreshnessPolicy, apply_freshness_policy

from watermark_dagster.dagster_defs.health import HealthSettings


def with_freshness(asset: AssetsDefinition, settings: HealthSettings) -> AssetsDefinition:
    """``asset`` with a time-window freshness policy: it fails when the asset has not been
    materialized for ``freshness_fail_after_seconds`` (unchanged when that is 0)."""
    if not settings.freshness_fail_after_seconds:
        return asset
    policy = FreshnessPolicy.time_window(
        fail_window=timedelta(seconds=settings.freshness_fail_after_seconds)
    )

    def attach(spec: AssetSpec) -> AssetSpec:
        return apply_freshness_policy(spec, policy)

    return asset.map_asset_specs(attach)
