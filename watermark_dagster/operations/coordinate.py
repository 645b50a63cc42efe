"""The coordinator's and the finalizer's use cases: look and plan, resume, finalize.

Shared by the sensors, the headless runner and `watermark plan`. Each returns a typed
result the adapters turn into run requests, skip reasons and log lines; the rules are in
:mod:`watermark_dagster.core`.
"""

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.pipeline import WriteMode
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.finalizing import FinalizeStep, finalize_step
from watermark_dagster.core.observations import RegistryObservation
from watermark_dagster.core.outcomes import succeeded_pipelines
from watermark_dagster.core.ranges import CursorPosition
from watermark_dagster.core.records import (
    Batch,
    BatchStatus,
    CheckpointStatus,
    Watermark,
    WatermarkHow,
)
from watermark_dagster.core.resuming import (
    BatchRunFacts,
    ResumeStep,
    RetryPolicy,
    RunDeath,
    resume_step,
    unfinished_pipelines,
)
from watermark_dagster.errors import (
    BatchStateError,
    ReloadHeldError,
    TerminalError,
    UpstreamSchemaChangedError,
    UpstreamUnreadableError,
)
from watermark_dagster.observe.observer import Observer, observe_registry, starting_points
from watermark_dagster.read.database_schema import columns_changed
from watermark_dagster.read.preflight import next_range_unreadable
from watermark_dagster.store import WatermarkStore

StartingPoints = Mapping[str, tuple[int | None, CursorPosition | None, str]]


@dataclass(frozen=True)
class Look:
    """One observation ready for planning, and the starting points it set (or would set)."""

    observation: RegistryObservation
    started: StartingPoints
    reloads_owed: tuple[str, ...] = ()
    """Pipelines owed a reload in full after a forced change's abandon (see
    :func:`reloads_after_abandon`); a plan reloads those it can and carries the others."""


def look_before_planning(
    registry: Registry,
    observer: Observer,
    store: WatermarkStore,
    *,
    actor: str,
    preview: bool = False,
    now: datetime | None = None,
    check_ranges: bool = True,
) -> Look:
    """Observe, apply ``start_from`` to upstreams that never had a watermark, observe again,
    and block the upstreams whose next range can no longer be read (see
    :func:`block_unreadable_ranges`).

    Args:
        registry: the upstreams and the pipelines that read them.
        observer: reads each upstream's table or cursor source.
        store: the watermark store the committed watermarks come from and the starting
            points are written to.
        actor: who is recorded as setting the starting points.
        preview: record nothing; the starting points are applied to a copy of the
            committed watermarks only (``watermark plan --dry-run``).
        now: the time ``start_from`` points are resolved against (default: the current
            time).
        check_ranges: check the next ranges; off while a batch is open (the plan previewed
            comes after it, from watermarks not yet committed).
    """
    now = now or datetime.now(UTC)
    marks = dict(store.committed())
    pending = [u for u, w in marks.items() if w.pending_history is not None]
    if pending and not preview:
        # A watermark change whose process died before recording its history row.
        store.flush_pending_history(pending)

    abandoned, owed = reloads_after_abandon(registry, store, marks)
    pinned = landing_pins(registry, store)

    def observe(current: Mapping[str, Watermark]) -> RegistryObservation:
        return observe_registry(
            registry,
            observer,
            {u: w.committed_version for u, w in current.items()},
            marks=current,
            ever_succeeded=lambda p: store.newest_success(p) is not None,
            reload=owed,
            pinned=pinned,
        )

    def ready(found: RegistryObservation, started: StartingPoints) -> Look:
        found = hold_unreloadable(registry, found, owed, abandoned)
        found = block_changed_columns(registry, store, found, marks)
        found = block_unreadable_ranges(registry, found) if check_ranges else found
        return Look(found, started, owed)

    look = observe(marks)
    points = starting_points(registry, look, now)
    if not points:
        return ready(look, {})
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
        return ready(observe(marks), points)
    started = store.initialize_watermarks(points, actor=actor, table_ids=look.table_ids)
    return ready(observe(store.committed()), {n: points[n] for n in started})


def landing_pins(registry: Registry, store: WatermarkStore) -> dict[str, int]:
    """Landing upstream -> the highest file number an open batch pinned (none read when
    the registry has no landing upstream): with the committed watermarks, what each file
    log must still hold (:func:`~watermark_dagster.observe.landing_log.refuse_log_behind`)."""
    landing = {n for n, u in registry.upstreams.items() if isinstance(u, LandingUpstream)}
    if not landing:
        return {}
    pins: dict[str, int] = {}
    for batch in store.open_batches():
        for name, planned in batch.inputs.items():
            if name in landing and planned.snapshot_version is not None:
                pins[name] = max(pins.get(name, 0), planned.snapshot_version)
    return pins


def landing_floor(store: WatermarkStore, name: str) -> int:
    """The highest file number landing upstream ``name``'s control root committed or an
    open batch pinned: what its file log must still hold."""
    mark = store.committed().get(name)
    pins = [
        planned.snapshot_version
        for batch in store.open_batches()
        if (planned := batch.inputs.get(name)) is not None and planned.snapshot_version
    ]
    return max([mark.committed_version or 0 if mark else 0, *pins])


def reloads_after_abandon(
    registry: Registry, store: WatermarkStore, marks: Mapping[str, Watermark]
) -> tuple[str | None, tuple[str, ...]]:
    """The newest scheduled batch's id and the pipelines the next plan owes a reload in
    full (:func:`~watermark_dagster.core.reloads.reloads_due`): those a batch could not
    plan yet, and, when a forced change abandoned the newest batch, those whose target
    holds rows of it that the committed watermarks do not cover. A pipeline holds the
    batch when it succeeded (or was recovered) for it, or when its target records the
    batch's write: a run the forced change could not fence (its target did not exist yet)
    wrote it late. This is how a plan reconciles from the targets' own records.

    Reads the newest scheduled batch; only while it is an abandoned one also its
    checkpoints and the logs of its unfinished pipelines' targets.
    """
    from watermark_dagster.core.reloads import reloads_due
    from watermark_dagster.write.fences import applied_by_target

    newest = store.newest_scheduled()
    if newest is None:
        return None, ()
    holding: set[str] = set()
    if newest.status is BatchStatus.ABANDONED:
        holding = set(succeeded(store, newest))
        for name in newest.pipelines:
            pipeline = registry.pipelines.get(name)
            if name in holding or pipeline is None:
                continue
            evidence = applied_by_target(
                pipeline,
                newest.batch_id,
                newest.write_seq,
                root=store.root_id(),
                attempts=store.checkpoints(batch_id=newest.batch_id, pipeline=name),
            )
            if evidence is not None:
                holding.add(name)
    owed = reloads_due(
        newest,
        holding,
        marks,
        registry.pipeline_inputs(),
        reloading=reloading_anyway(registry, marks),
    )
    return newest.batch_id, owed


def reloading_anyway(registry: Registry, marks: Mapping[str, Watermark]) -> frozenset[str]:
    """Pipelines whose next batch reloads them in full whatever they owe: overwrite
    pipelines, and readers of a versioned upstream with nothing committed (read as a
    snapshot: after `watermark reset`)."""

    def unread(upstream: str) -> bool:
        mark = marks.get(upstream)
        return (
            not registry.upstreams[upstream].is_cursor
            and mark is not None
            and mark.committed_version is None
        )

    return frozenset(
        name
        for name, pipeline in registry.pipelines.items()
        if pipeline.write is WriteMode.OVERWRITE or any(unread(u) for u in pipeline.upstreams)
    )


def hold_unreloadable(
    registry: Registry, look: RegistryObservation, owed: Collection[str], batch_id: str | None
) -> RegistryObservation:
    """``look`` with the upstreams of each pipeline that owes a reload it cannot have
    blocked: some of its upstreams start from somewhere other than the beginning, so a
    reload from snapshots would load what the pipeline was told to skip. Planning it as
    usual would read the abandoned batch's changes into its target a second time; blocked,
    the operator chooses with ``watermark reset``."""
    held = [p for p in owed if p in look.runnable and p not in look.bootstrap]
    found: dict[str, TerminalError] = {}
    for name in held:
        upstreams = look.runnable[name]
        resets = " and ".join(f"`watermark reset -t {u}`" for u in upstreams)
        for upstream in upstreams:
            found[upstream] = ReloadHeldError(
                f"Pipeline '{name}' owes a reload in full (newest batch {batch_id}): a "
                "forced change abandoned a batch whose rows its target holds beyond what the "
                f"committed watermarks of {list(upstreams)} cover. It cannot be reloaded "
                "from the beginning, because its upstreams do not all start there. Nothing "
                "is planned for these upstreams.",
                pipeline=name,
                upstream=upstream,
                batch_id=batch_id,
                fix=f"{resets}: the next batch loads each as a snapshot, and its readers "
                f"reload {registry.pipelines[name].target} and their other targets in full.",
            )
    return look.with_blocked(found)


def block_changed_columns(
    registry: Registry,
    store: WatermarkStore,
    look: RegistryObservation,
    marks: Mapping[str, Watermark],
) -> RegistryObservation:
    """``look`` with the database upstreams whose columns changed incompatibly since the
    batch that committed their position blocked (a column dropped, renamed or retyped:
    :func:`~watermark_dagster.read.database_schema.columns_changed`), so no batch is planned
    on them; the run checks again before it reads."""
    found: dict[str, TerminalError] = {}
    for name, obs in look.observed.items():
        upstream = registry.upstreams.get(name)
        if not isinstance(upstream, DatabaseUpstream):
            continue
        committed = committed_fingerprint(store, marks.get(name), name)
        error = columns_changed(upstream, committed, obs.schema_fingerprint)
        if error is not None:
            found[name] = error
    return look.with_blocked(found)


def committed_fingerprint(
    store: WatermarkStore, mark: Watermark | None, upstream: str, running: str | None = None
) -> str | None:
    """The schema fingerprint the batch that committed ``upstream``'s position recorded
    (None: nothing committed by a batch, or that batch is ``running`` or gone)."""
    if mark is None or not mark.batch_id or mark.batch_id == running:
        return None
    try:
        return store.get_batch(mark.batch_id).schema_fingerprints.get(upstream)
    except BatchStateError:
        return None


def block_unreadable_ranges(registry: Registry, look: RegistryObservation) -> RegistryObservation:
    """``look`` with the upstreams whose next range can no longer be read blocked (see
    :meth:`RegistryObservation.with_blocked`): commits gone from the log, or change files
    vacuumed (:func:`~watermark_dagster.read.preflight.next_range_unreadable`). Planning it
    would give a batch that fails and sticks; refused here, it shows as BLOCKED with its fix
    and nothing is planned for it. Ranges that every reader loads as a snapshot are not
    read, so not checked."""
    plan = look.plan()
    full = set(plan.full_load)
    found: dict[str, TerminalError] = {}
    for name, planned in sorted(plan.inputs.items()):
        readers = [p for p in plan.pipelines if name in look.runnable[p]]
        if not planned.reads or all(p in full for p in readers):
            continue
        upstream = registry.upstreams[name]
        error = next_range_unreadable(upstream, look.observed[name], planned)
        if error is not None:
            found[name] = error
    return look.with_blocked(found)


def unreadable_next_ranges(
    registry: Registry, observer: Observer, store: WatermarkStore
) -> dict[str, UpstreamUnreadableError | UpstreamSchemaChangedError]:
    """Upstream -> why its next range can no longer be read, for the surfaces that show it
    outside a coordinator tick (``watermark list``/``get``, the continuity check run by
    hand), and the database upstreams whose columns changed incompatibly; empty while a
    batch is open (the next range comes after it). Records nothing."""
    if store.open_batch() is not None:
        return {}
    look = look_before_planning(registry, observer, store, actor="preview", preview=True)
    blocked = look.observation.blocked.items()
    return {
        n: e
        for n, e in blocked
        if isinstance(e, UpstreamUnreadableError | UpstreamSchemaChangedError)
    }


def plan_next(store: WatermarkStore, look: Look, *, actor: str) -> tuple[Batch | None, bool]:
    """Plan the next batch from ``look`` (see :meth:`WatermarkStore.create_batch`); the
    reloads it owes and cannot plan are carried in the batch."""
    obs = look.observation
    return store.create_batch(
        obs.positions,
        obs.runnable,
        actor=actor,
        table_ids=obs.table_ids,
        schema_fingerprints=obs.schema_fingerprints,
        source_states=obs.source_states,
        locations=obs.locations,
        bootstrap=obs.bootstrap,
        overwrite=obs.overwrite,
        reloads_owed=look.reloads_owed,
        frozen=obs.frozen,
    )


def succeeded(store: WatermarkStore, batch: Batch) -> frozenset[str]:
    """The pipelines that succeeded for ``batch``: its SUCCESS checkpoints
    (:func:`watermark_dagster.core.outcomes.succeeded_pipelines`). Reads one batch's rows."""
    return succeeded_pipelines(batch.batch_id, store.checkpoints(batch_id=batch.batch_id))


def unfinished(store: WatermarkStore, batch: Batch, known: Collection[str]) -> list[str]:
    """The pipelines of ``batch`` still to run (among the declared ``known`` ones)."""
    return unfinished_pipelines(batch.pipelines, succeeded(store, batch), known)


def record_deaths(
    store: WatermarkStore, batch: Batch, deaths: Sequence[RunDeath], *, actor: str
) -> None:
    """Record in history (``RUN_DIED``) that runs of ``batch`` died, with how: a death is
    a crash, not a failure, and the history is where an operator looks for why."""
    for death in deaths:
        store.record(
            "RUN_DIED",
            actor=actor,
            batch_id=batch.batch_id,
            detail={"run_id": death.run_id, "how": death.how},
        )


def resume_batch(
    store: WatermarkStore,
    batch: Batch,
    runs: BatchRunFacts,
    *,
    known: Collection[str],
    policy: RetryPolicy,
    actor: str,
    now: float | None = None,
    stuck_recorded: str | None = None,
    retry: bool = False,
) -> ResumeStep:
    """Decide what to do with the open ``batch`` (the coordinator's tick once a batch is
    open): wait for a run in flight, leave it to the finalizer, request its unfinished
    pipelines again, or stop it as stuck.

    A stuck batch is recorded in history (``BATCH_STUCK``) once per stuck state: not when
    ``stuck_recorded`` (the caller's memory of the last one recorded) equals the step's
    ``stuck_key``.

    Args:
        store: the watermark store the batch and its checkpoints live in.
        batch: the open batch.
        runs: the batch partition's runs.
        known: the pipelines the code location declares.
        policy: the failed runs and deaths after which the batch is stuck, and the
            backoff after a death.
        actor: who is recorded in history for a stuck batch.
        now: the time the backoff after a death is measured against (None: no backoff).
        stuck_recorded: the ``stuck_key`` last recorded as ``BATCH_STUCK``, if any.
        retry: request the unfinished pipelines whatever the failed runs.
    """
    todo = [] if runs.in_flight and not retry else unfinished(store, batch, known)
    if todo and not retry and runs.terminal is None and runs.failed >= policy.max_attempts:
        # Stuck by its failures: the reason names the newest one's error (a read of the
        # batch's checkpoints, once the attempts are spent, not on every tick before).
        failed = [
            c
            for c in store.checkpoints(batch_id=batch.batch_id)
            if c.status is CheckpointStatus.FAILED and c.error
        ]
        if failed:
            newest = max(failed, key=lambda c: c.started_at)
            runs = replace(runs, last_error=newest.error)
    step = resume_step(batch.batch_id, todo, runs, policy=policy, now=now, retry=retry)
    if step.is_stuck and step.stuck_key != stuck_recorded:
        detail: dict[str, Any] = {
            "failed_runs": runs.failed,
            "deaths": [{"run_id": d.run_id, "how": d.how} for d in runs.deaths],
            "cause": (
                "terminal"
                if runs.terminal is not None
                else "failures"
                if runs.failed >= policy.max_attempts
                else "deaths"
            ),
            "pipelines": list(step.pipelines),
            "reason": step.reason,
            "terminal": runs.terminal is not None,
        }
        if runs.terminal is not None:
            detail.update(error=runs.terminal.error, message=runs.terminal.message)
        store.record("BATCH_STUCK", actor=actor, batch_id=batch.batch_id, detail=detail)
    return step


def finalize_step_now(store: WatermarkStore, registry: Registry, batch: Batch) -> FinalizeStep:
    """Which upstreams of ``batch`` may advance now, and which still wait: consumers are
    :meth:`Registry.consumers`, succeeded is :func:`succeeded`. The finalizer and a forced
    manual change (which advances what is applied before it abandons the batch) both
    decide with this."""
    consumers = {u: registry.consumers(u) for u in batch.inputs}
    return finalize_step(
        batch.inputs, batch.advanced, consumers, batch.pipelines, succeeded(store, batch)
    )


def finalize_batch(
    store: WatermarkStore,
    batch: Batch,
    *,
    registry: Registry,
    actor: str,
    on_advance: Callable[[str], None] = lambda _upstream: None,
) -> FinalizeStep:
    """Advance every upstream of ``batch`` whose consumers all succeeded, then complete
    the batch when none is left waiting (the finalizer sensor's work; safe to repeat).

    Consumers are :meth:`Registry.consumers` (the asset graph is built from, and checked
    against, the same registry); succeeded is :func:`succeeded`.

    Args:
        store: the watermark store the batch lives in.
        batch: the batch to finalize.
        registry: the definition of each upstream's consumers.
        actor: who is recorded as advancing the watermarks and completing the batch.
        on_advance: called after each upstream advanced.
    """
    step = finalize_step_now(store, registry, batch)
    store.advance_many(batch, list(step.advance), actor=actor)
    for upstream in step.advance:
        on_advance(upstream)
    if step.complete:
        fault_point("before_batch_complete")
        store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor=actor)
    return step
