"""Finalizing a batch from Dagster: in the run's last step, and by the finalizer sensor.

A pipeline's run finalizes its batch as soon as its pipeline succeeded: each upstream whose
consumers all succeeded advances, and the batch completes when none waits. So a batch the
daemon launched completes when its last run ends, not at the finalizer sensor's next tick
(up to 5 s later: the sensor daemon's loop). The finalizer sensor stays, as the backstop: a
run killed between its checkpoint and this step, a run that finalized nothing because its
batch's other pipelines were still running in other runs, or a batch whose last pipeline
was skipped. :func:`~watermark_dagster.operations.coordinate.finalize_batch` is safe to
repeat and to race (each advance and the completion are compare-and-swap commits that
find them done), so the run and the sensor may both finalize one batch, in either order.

Both report the same events: an observation of each upstream that advanced (its committed
version) and, once the batch completes, a materialization of the batch partition for each
pipeline it did not need.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from dagster import AssetKey, AssetMaterialization, AssetObservation, DagsterInstance

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.finalizing import FinalizeStep
from watermark_dagster.core.records import Batch
from watermark_dagster.dagster_defs.pipeline_outcomes import nothing_to_do_events
from watermark_dagster.dagster_defs.pruning import Pruning, stale_batch_partitions
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.dagster_defs.upstream_assets import observation_event
from watermark_dagster.errors import UpstreamUnavailableError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import finalize_batch
from watermark_dagster.store import WatermarkStore


@dataclass
class Finalized:
    """What one finalize did: its step, and the events that report it."""

    step: FinalizeStep
    events: list[AssetObservation | AssetMaterialization] = field(default_factory=list)


def finalize_reported(
    store: WatermarkStore,
    batch: Batch,
    *,
    registry: Registry,
    observer: Observer,
    upstream_keys: Mapping[str, AssetKey],
    pipeline_keys: Mapping[str, AssetKey],
    actor: str,
    log: logging.Logger | logging.LoggerAdapter,
) -> Finalized:
    """:func:`~watermark_dagster.operations.coordinate.finalize_batch`, with its events."""
    events: list[AssetObservation | AssetMaterialization] = []

    def advanced(upstream: str) -> None:
        log.info(
            f"batch {batch.batch_id}: advanced {upstream} past {batch.inputs[upstream].describe()}"
        )
        if batch.inputs[upstream].is_cursor:
            return
        try:
            obs = observer.observe(registry.upstreams[upstream])
        except UpstreamUnavailableError as e:
            log.warning(str(e))
            return
        events.append(
            observation_event(obs, upstream_keys[upstream], batch.inputs[upstream].snapshot_version)
        )

    step = finalize_batch(store, batch, registry=registry, actor=actor, on_advance=advanced)
    if step.complete:
        log.info(f"batch {batch.batch_id} completed")
        events += nothing_to_do_events(batch, pipeline_keys)
    return Finalized(step, events)


def after_completion(
    instance: DagsterInstance,
    store: WatermarkStore,
    batch: Batch,
    *,
    settings: WatermarkSettings,
    partitions_name: str,
    log: logging.Logger | logging.LoggerAdapter,
) -> Pruning:
    """What follows a batch's completion: the control tables compacted every
    ``maintain_every_batches`` batches, and the batch partitions beyond retention found
    (:func:`~watermark_dagster.dagster_defs.pruning.stale_batch_partitions`; the caller
    deletes them). A run killed before this leaves them to the next completion."""
    if settings.maintain_every_batches and batch.seq % settings.maintain_every_batches == 0:
        removed = store.maintain()
        log.info(f"control tables compacted: {removed}")
    pruning = stale_batch_partitions(
        instance,
        newest_seq=batch.seq,
        keep=settings.keep_batch_partitions,
        open_batch_ids=lambda: {b.batch_id for b in store.open_batches()},
        partitions_name=partitions_name,
    )
    if pruning.delete:
        log.info(
            f"pruned {len(pruning.delete)} batch partition(s) older than the newest "
            f"{settings.keep_batch_partitions}: {pruning.delete[0]} .. {pruning.delete[-1]}"
            + (f"; kept while open or running: {list(pruning.held)}" if pruning.held else "")
        )
    return pruning
