"""The ``watermark_warehouse_lag`` check: whether a warehouse target lags its lake input.

It fails (severity ERROR) when the warehouse cannot be read, holds no load while its lake
input has rows, or when a lake input is ahead of the version the warehouse's last load
pinned by more than ``lag_max_versions`` versions or with an oldest unloaded commit older
than ``lag_max_seconds`` (the ``watermark_lag`` limits). The versions come from the state
row in the warehouse itself, not from the control tables
(:func:`~watermark_dagster.operations.warehouse.warehouse_status`). It runs from the UI
(:func:`~watermark_dagster.dagster_defs.checks.build_health_checks`).
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from dagster import AssetCheckExecutionContext, AssetCheckKey, AssetKey

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.observations import Observation
from watermark_dagster.dagster_defs.check_family import CheckFamily, Verdict, checks_on
from watermark_dagster.dagster_defs.health import HealthSettings
from watermark_dagster.dagster_defs.health_lag import CommitTimes, lag_result, measure_lag
from watermark_dagster.dagster_defs.names import WAREHOUSE_CHECKS_OP, LocationNames
from watermark_dagster.dagster_defs.resources import WatermarkStoreResource
from watermark_dagster.errors import UpstreamUnavailableError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.warehouse import (
    WarehouseLoad,
    WarehouseStatus,
    warehouse_status,
)

WAREHOUSE_CHECK = "watermark_warehouse_lag"


def warehouse_lag_result(
    status: WarehouseStatus,
    observed: Mapping[str, Observation],
    now: datetime,
    committed_at: Callable[[str, int], datetime | None],
    settings: HealthSettings,
) -> tuple[bool, str, dict[str, Any]]:
    """``(passed, description, metadata)`` of one warehouse target's lag check, from its
    status and a look at each lake input (``observed``, by upstream)."""
    meta: dict[str, Any] = {"pipeline": status.pipeline, "table": status.table}
    where = f"Warehouse table {status.table} ('{status.pipeline}')"
    if status.state is WarehouseLoad.UNREACHABLE:
        return False, f"{where} could not be read: {status.error}", meta
    if status.position is not None:
        meta["batch_id"] = status.batch_id
    if status.state is WarehouseLoad.BEHIND:
        meta["succeeded"] = status.succeeded
        return (
            False,
            f"{where} records batch {status.batch_id}, but the control tables record "
            f"'{status.pipeline}' succeeded on the newer batch {status.succeeded}: its state "
            "row was restored or edited. `watermark verify` compares its rows with a recompute.",
            meta,
        )
    failures: list[str] = []
    lines: list[str] = []
    for upstream, obs in sorted(observed.items()):
        loaded = status.loaded_versions.get(upstream)
        lag = measure_lag(obs, loaded, now, lambda v, u=upstream: committed_at(u, v))
        passed, _, description, lag_meta = lag_result(lag, settings)
        meta[f"{upstream}/loaded_version"] = loaded
        meta[f"{upstream}/lake_version"] = obs.latest_version
        lines.append(description)
        if not passed:
            failures.append(upstream)
        del lag_meta
    if status.position is None and any(o.latest_version >= 0 for o in observed.values()):
        return False, f"{where} holds no load yet; its lake input has versions.", meta
    if failures:
        return False, f"{where} lags its lake input: " + " ".join(lines), meta
    return True, f"{where} is within the limits of its lake input: " + " ".join(lines), meta


def warehouse_family(
    registry: Registry,
    pipeline_keys: Mapping[str, AssetKey],
    observer: Observer,
    settings: HealthSettings,
    commit_times: CommitTimes,
    names: LocationNames,
) -> CheckFamily[str]:
    """The ``watermark_warehouse_lag`` checks of the pipelines with a warehouse target, run
    from the UI (the ``watermark_warehouse_checks`` op)."""

    def evaluate(
        context: AssetCheckExecutionContext, selected: Sequence[tuple[AssetCheckKey, str]]
    ) -> Iterator[Verdict]:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        store = watermark_store.get_store()
        now = datetime.now(UTC)
        for key, name in selected:
            pipeline = registry.pipelines[name]
            observed: dict[str, Observation] = {}
            try:
                for u in pipeline.upstreams:
                    observed[u] = observer.observe(registry.upstreams[u])
            except UpstreamUnavailableError as e:
                yield key, False, str(e), {"pipeline": name, **e.metadata()}
                continue
            status = warehouse_status(store, pipeline)
            yield (
                key,
                *warehouse_lag_result(
                    status, observed, now, lambda u, v: commit_times.get(u, v, registry), settings
                ),
            )

    loads = [p for p in pipeline_keys if registry.pipelines[p].warehouse is not None]
    return CheckFamily(
        op=WAREHOUSE_CHECKS_OP,
        description="Whether each warehouse target keeps up with its lake input.",
        subjects=checks_on(WAREHOUSE_CHECK, pipeline_keys, loads, lambda p: p),
        describe=lambda p: (
            f"Fails when the warehouse table '{p}' loads cannot be read, holds no load, or "
            "lags its lake input beyond the watermark_lag limits (from its own state row)."
        ),
        evaluate=evaluate,
    )


__all__ = ["WAREHOUSE_CHECK", "warehouse_family", "warehouse_lag_result"]
