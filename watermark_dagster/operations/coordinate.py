"""The coordinator's look before it plans, shared by the sensor and `watermark plan`.

It observes every upstream, records where upstreams configured with ``start_from`` begin
(or, for a preview, only pretends to), and returns what planning needs.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.observations import RegistryObservation
from watermark_dagster.core.planning import FinalizeStep, finalize_step
from watermark_dagster.core.ranges import CursorPosition
from watermark_dagster.core.records import Batch, BatchStatus, Watermark, WatermarkHow
from watermark_dagster.observe.observer import Observer, observe_registry, starting_points
from watermark_dagster.store import WatermarkStore

StartingPoints = Mapping[str, tuple[int | None, CursorPosition | None, str]]


@dataclass(frozen=True)
class Look:
    """One observation ready for planning, and the starting points it set (or would set)."""

    observation: RegistryObservation
    started: StartingPoints


def look_before_planning(
    registry: Registry,
    observer: Observer,
    store: WatermarkStore,
    *,
    actor: str,
    preview: bool = False,
    now: datetime | None = None,
) -> Look:
    """Observe, apply ``start_from`` to upstreams that never had a watermark, observe again.

    Args:
        preview: record nothing; the starting points are applied to a copy of the
            committed watermarks only (``watermark plan --dry-run``).
    """
    now = now or datetime.now(UTC)
    marks = dict(store.committed())
    pending = [u for u, w in marks.items() if w.pending_history is not None]
    if pending and not preview:
        # A watermark change whose process died before recording its history row.
        store.flush_pending_history(pending)

    def observe(current: Mapping[str, Watermark]) -> RegistryObservation:
        return observe_registry(
            registry,
            observer,
            {u: w.committed_version for u, w in current.items()},
            marks=current,
            ever_succeeded=lambda p: store.newest_success(p) is not None,
        )

    look = observe(marks)
    points = starting_points(registry, look, now)
    if not points:
        return Look(look, {})
    if preview:
        for name, (version, cursor, _) in points.items():
            marks[name] = Watermark(
                upstream=name,
                committed_version=version,
                batch_id=None,
                how=WatermarkHow.START_FROM,
                updated_at=now,
                actor=actor,
                committed_cursor=cursor,
                table_id=look.table_ids.get(name),
            )
        return Look(observe(marks), points)
    started = store.initialize_watermarks(points, actor=actor, table_ids=look.table_ids)
    return Look(observe(store.committed()), {n: points[n] for n in started})


def plan_next(store: WatermarkStore, look: Look, *, actor: str) -> tuple[Batch | None, bool]:
    """Plan the next batch from ``look`` (see :meth:`WatermarkStore.create_batch`)."""
    obs = look.observation
    return store.create_batch(
        obs.positions,
        obs.runnable,
        actor=actor,
        table_ids=obs.table_ids,
        schema_fingerprints=obs.schema_fingerprints,
        source_states=obs.source_states,
        bootstrap=obs.bootstrap,
        overwrite=obs.overwrite,
    )


def finalize_batch(
    store: WatermarkStore,
    batch: Batch,
    *,
    consumers: Mapping[str, Iterable[str]],
    succeeded: Iterable[str],
    actor: str,
    on_advance: Callable[[str], None] = lambda _upstream: None,
) -> FinalizeStep:
    """Advance every upstream of ``batch`` whose consumers all succeeded, then complete
    the batch when none is left waiting (the finalizer sensor's work; safe to repeat).

    Args:
        consumers: upstream -> pipelines that read it (from the asset graph).
        succeeded: pipelines that materialized the batch successfully.
        on_advance: called after each upstream advanced.
    """
    step = finalize_step(batch.inputs, batch.advanced, consumers, batch.pipelines, succeeded)
    for upstream in step.advance:
        store.advance(batch, upstream, actor=actor)
        on_advance(upstream)
    if step.complete:
        fault_point("before_batch_complete")
        store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor=actor)
    return step
