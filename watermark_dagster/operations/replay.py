"""Running an applied version range of one upstream through its pipelines again.

:func:`plan_replay` checks a request and says what a replay would do (nothing written);
:func:`run_replay` records the REPLAY batch, has it executed and ends it.
:func:`plan_backfill_replay` and :func:`start_backfill_replay` do the same for every range
of one applied batch through one pipeline: what a backfill of its partition runs. The store pins
the range, pins the other upstreams where the scheduled batch that applied the range's
end pinned them, and gives the batch that batch's position, so newer rows in the targets
are left alone (I5); no committed watermark moves.

Executing a batch is the caller's: a :class:`BatchExecutor` (the command line hands in the
headless Dagster runner, so the replay's materializations show in the UI).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.core.records import (
    Batch,
    BatchKind,
    BatchStatus,
    Checkpoint,
    CheckpointStatus,
    default_actor,
)
from watermark_dagster.errors import UsageError, replay_refused

if TYPE_CHECKING:
    from watermark_dagster.config.landing import LandingUpstream
    from watermark_dagster.config.pipeline import Pipeline
    from watermark_dagster.config.registry import Registry
    from watermark_dagster.read.inputs import UpstreamInput
    from watermark_dagster.store import WatermarkStore


class BatchExecutor(Protocol):
    """Runs ``pipelines`` on the batch ``batch_id``; returns the error of each failed run
    (``None`` when a run failed without one), empty when every run succeeded."""

    def __call__(self, batch_id: str, pipelines: Sequence[str]) -> Sequence[str | None]:
        """Run the pipelines; the errors of the runs that failed."""
        ...


@dataclass(frozen=True)
class ReplayPlan:
    """A checked replay request: ``range`` of ``upstream``, read in ``mode``, through
    ``pipelines`` (merge pipelines that read it); ``committed`` is the upstream's
    committed watermark, which the replay leaves as it is."""

    upstream: str
    range: VersionRange
    mode: ReadMode
    pipelines: tuple[str, ...]
    committed: int


@dataclass(frozen=True)
class ReplayResult:
    """A replay as run: its batch, how it ended and each pipeline's finished attempts."""

    plan: ReplayPlan
    batch: Batch
    status: BatchStatus
    error: str | None
    checkpoints: tuple[Checkpoint, ...]
    actor: str

    @property
    def failed(self) -> bool:
        """True when a run of the replay failed."""
        return self.status is BatchStatus.FAILED


def _refuse_non_merge(registry: "Registry", chosen: Sequence[str], fix: str) -> None:
    """Refuse pipelines that do not merge: a replay only re-applies changes to a merge
    target (its rows carry the batch position that guards newer state)."""
    from watermark_dagster.config.pipeline import WriteMode

    refused = {
        p: WriteMode(registry.pipelines[p].write).value
        for p in chosen
        if registry.pipelines[p].write is not WriteMode.MERGE
    }
    if refused:
        raise UsageError(
            f"pipeline(s) {sorted(refused)} write with {sorted(set(refused.values()))}: a replay "
            "can only re-apply changes to a merge target (an append target has the rows "
            "already and Delta would skip them; an overwrite target would go back in time). "
            f"{fix}",
            pipeline=sorted(refused)[0],
        )


def _refuse_reloading(
    registry: "Registry",
    upstream: str,
    rng: VersionRange,
    mode: ReadMode,
    pipelines: Sequence[str],
    *,
    batch_id: str | None = None,
) -> None:
    """Refuse, before anything is recorded, a replay that could not re-apply ``rng`` as
    changes: an append-only range with commits that update or delete rows (it would be
    read as a snapshot, i.e. a reload at an old position), or a pipeline whose target does
    not exist (a replay never creates one). Reads the logs with delta-rs; no JVM.

    Raises:
        ReplayRefusedError: naming the commits or the target, with the fix.
    """
    from watermark_dagster.config.landing import LandingUpstream
    from watermark_dagster.errors import replay_refused
    from watermark_dagster.read.append_log import scan_appends
    from watermark_dagster.write.commits import target_exists

    table = registry.upstreams[upstream]
    if isinstance(table, LandingUpstream):
        _refuse_landing_unreadable(table, rng, batch_id)
    elif mode is ReadMode.APPEND_ONLY:
        changed = scan_appends(registry.upstreams[upstream], rng).data_changes
        if changed:
            listed = ", ".join(f"v{v} {op}" for v, op in changed[:5])
            raise replay_refused(
                pipelines[0],
                batch_id,
                f"upstream '{upstream}' has no change data feed, and commit(s) {listed} in "
                f"the range {rng} update or delete rows, so the range could only be read as "
                "a snapshot",
                upstream=upstream,
            )
    for name in pipelines:
        pipeline = registry.pipelines[name]
        if not target_exists(pipeline):
            raise replay_refused(
                name,
                batch_id,
                f"its target {pipeline.target} does not exist",
                upstream=upstream,
            )


def _refuse_landing_unreadable(
    upstream: "LandingUpstream", rng: VersionRange, batch_id: str | None
) -> None:
    """Refuse a replay of landing files ``rng`` that cannot be read as they were loaded: a
    landing folder's versions are its file log's numbers (appends by nature, never a Delta
    log of its own), so what a replay needs is each pinned file, logged and unchanged.

    Raises:
        UpstreamUnreadableError: the file log does not hold every number of ``rng``.
        LandingFileChangedError: a pinned file is gone or changed, named.
    """
    from watermark_dagster.errors import UpstreamUnreadableError, reset_command
    from watermark_dagster.observe.landing import check_unchanged
    from watermark_dagster.observe.landing_log import FileLog

    files = FileLog(upstream).files_in(rng)
    if [f.ordinal for f in files] != list(range(max(rng.start, 1), rng.end + 1)):
        raise UpstreamUnreadableError(
            f"{upstream.owner}: its file log {upstream.log_location} holds {len(files)} of "
            f"the files {rng} the replay{f' of batch {batch_id}' if batch_id else ''} needs. "
            "Nothing was written.",
            upstream=upstream.name,
            versions=f"files {rng}",
            fix=f"restore the file log, or run `{reset_command(upstream.name)}` to load the "
            "folder again from the start.",
        )
    check_unchanged(upstream, files, loaded=True, replay=True)


def _strategy_written(store: "WatermarkStore", pipeline: str, batch_id: str) -> str | None:
    """The strategy ``pipeline``'s write of ``batch_id`` used, as its ``PIPELINE_SUCCEEDED``
    history row records it, measured or not (a retry whose write Delta skipped records the
    rewrite its commit shows, without seconds); None: not recorded, e.g. a recovered run
    or a full load."""
    from watermark_dagster.store import codec

    for row in store.history(batch_id=batch_id):
        if row.get("event") != "PIPELINE_SUCCEEDED" or row.get("pipeline") != pipeline:
            continue
        strategy = codec.strategy_written(row)
        if strategy is not None:
            return str(strategy)
    return None


def _refuse_inside_full(
    store: "WatermarkStore",
    registry: "Registry",
    upstream: str,
    rng: VersionRange,
    mode: ReadMode,
    pipelines: Sequence[str],
) -> None:
    """Refuse a replay whose range ends inside its origin batch's range (it would write
    just below that batch's position) for a pipeline that wrote the origin batch with the
    ``full`` strategy, or with one not recorded.

    ``full`` writes only the rows whose value differs, so a key the batch's range touched
    but whose value ended where it started keeps an older ``_wm_seq``, and a replay placed
    at the origin's position minus one could overwrite it with a value from inside the
    range (I5). The incremental strategy rewrites every key the range touched, ``rewrite``
    every key of the target, and a hand-written transform is incremental. A replay up to
    the origin's end writes at the origin's own position and is not refused.

    Raises:
        ReplayRefusedError: naming the batch, its range, the strategy and the range to ask.
    """
    from watermark_dagster.core.replay import plan_replay as plan_positions
    from watermark_dagster.errors import BatchStateError, ReplayRefusedError

    try:
        batches = sorted(store.batches(), key=lambda b: b.seq)  # oldest first
        positions = plan_positions(batches, upstream, rng, mode=mode, upstreams=())
    except BatchStateError:
        return  # no completed batch applied the end: the store refuses it when recorded
    origin = positions.origin
    whole = origin.inputs[upstream].range
    if whole is None or positions.order_seq == origin.seq:
        return
    for name in pipelines:
        if not registry.pipelines[name].chooses_strategy or name in origin.full_load:
            continue  # a load in full stamps every row with the batch's position
        strategy = _strategy_written(store, name, origin.batch_id)
        if strategy in ("incremental", "maintain", "rewrite"):
            continue  # each stamps every key it wrote with the batch's position
        how = f"the {strategy} strategy" if strategy else "a strategy not recorded"
        raise ReplayRefusedError(
            f"Pipeline '{name}': the replay of {upstream} {rng} ends inside batch "
            f"{origin.batch_id} ({upstream} {whole}), which {name} wrote with {how}: it "
            "rewrote only the rows whose value changed, so a row the batch's range touched "
            "and left as it was keeps an older position, and a replay placed just below the "
            "batch could overwrite it with a value from inside the range. Nothing was written.",
            pipeline=name,
            upstream=upstream,
            batch_id=origin.batch_id,
            fix=f"replay up to the batch's end: `watermark replay -t {upstream} "
            f"--from-version {rng.start} --to-version {whole.end}`.",
        )


def _pipelines(registry: "Registry", upstream: str, wanted: Sequence[str] | None) -> list[str]:
    """The pipelines to replay through, checked: merge pipelines reading ``upstream``."""
    consumers = list(registry.consumers(upstream))
    chosen = list(wanted or consumers)
    unknown = [p for p in chosen if p not in consumers]
    if unknown:
        raise UsageError(
            f"pipeline(s) {unknown} do not read {upstream!r}; pipelines reading it: {consumers}."
        )
    _refuse_non_merge(
        registry,
        chosen,
        f"Leave them out with -p, or rebuild with `watermark reset -t {upstream}`.",
    )
    return sorted(chosen)


def plan_replay(
    store: "WatermarkStore",
    registry: "Registry",
    upstream: str,
    rng: VersionRange,
    *,
    pipelines: Sequence[str] | None = None,
) -> ReplayPlan:
    """Check a replay of ``rng`` of ``upstream`` through ``pipelines`` (default: every
    merge pipeline reading it) and say what it would do. Writes nothing.

    Raises:
        UsageError: a cursor or snapshot-only upstream, a pipeline that does not read it or
            does not merge, or a range the pipelines have not applied yet.
        ReplayRefusedError: the range could only be read as a snapshot, or a target does
            not exist (a replay never reloads or creates a target).
        WatermarkError: the upstream cannot be observed.
    """
    from watermark_dagster.core.observations import read_mode_of
    from watermark_dagster.core.replay import check_replay_range
    from watermark_dagster.observe.observer import Observer

    table = registry.upstreams[upstream]
    if table.is_cursor:
        raise UsageError(f"upstream {upstream!r} is read by a cursor column and has no versions.")
    chosen = _pipelines(registry, upstream, pipelines)
    # The one rule, checked here before anyone is asked to confirm, and again by the store
    # when it records the batch (a scheduled batch cannot un-apply versions meanwhile).
    committed = check_replay_range(upstream, rng, store.committed_versions().get(upstream))
    mode = read_mode_of(table, Observer().observe(table))
    if mode is ReadMode.SNAPSHOT:
        raise UsageError(f"upstream {upstream!r} is snapshot-only: there are no changes to replay.")
    _refuse_reloading(registry, upstream, rng, mode, chosen)
    _refuse_inside_full(store, registry, upstream, rng, mode, chosen)
    return ReplayPlan(
        upstream=upstream, range=rng, mode=mode, pipelines=tuple(chosen), committed=committed
    )


def run_replay(
    store: "WatermarkStore",
    registry: "Registry",
    plan: ReplayPlan,
    *,
    execute: BatchExecutor,
    actor: str | None = None,
    reason: str | None = None,
) -> ReplayResult:
    """Record the REPLAY batch of ``plan``, run it with ``execute`` and end it: COMPLETED
    when every run succeeded, else FAILED with the runs' errors.

    A replay of the same range through the same pipelines that a killed command left open
    (recorded, never ended) is resumed instead of recorded again: its pipelines that
    already succeeded are skipped, the others run (a replay's writes are version-guarded,
    so a write that landed before the kill changes nothing the second time).

    Raises:
        BatchStateError: the store refused the batch (the range is not applied, or no
            completed batch applied its end).
    """
    who = actor or default_actor()
    batch = unfinished_replay(store, plan)
    if batch is None:
        batch = store.create_range_replay(
            plan.upstream,
            plan.range,
            mode=plan.mode,
            pipelines=list(plan.pipelines),
            all_upstreams=sorted(
                {u for p in plan.pipelines for u in registry.pipelines[p].upstreams}
            ),
            actor=who,
            reason=reason,
        )
    fault_point("after_replay_start")
    errors = list(execute(batch.batch_id, plan.pipelines))
    error = "; ".join(e or "run failed" for e in errors) or None
    status = BatchStatus.FAILED if errors else BatchStatus.COMPLETED
    store.set_batch_status(batch.batch_id, status, actor=who, error=error)
    finished = tuple(
        c
        for c in store.checkpoints(batch_id=batch.batch_id)
        if c.status is not CheckpointStatus.RUNNING
    )
    return ReplayResult(
        plan=plan, batch=batch, status=status, error=error, checkpoints=finished, actor=who
    )


def unfinished_replay(store: "WatermarkStore", plan: ReplayPlan) -> Batch | None:
    """The open REPLAY batch that re-reads exactly ``plan`` (its range of its upstream, in
    its mode, through its pipelines), left by a ``watermark replay`` killed before it ended;
    None when there is none."""
    for batch in store.open_batches():
        if batch.kind is not BatchKind.REPLAY or set(batch.pipelines) != set(plan.pipelines):
            continue
        pinned = batch.inputs.get(plan.upstream)
        if pinned is not None and pinned.range == plan.range and pinned.mode is plan.mode:
            return batch
    return None


@dataclass(frozen=True)
class BackfillReplayPlan:
    """A checked replay of ``batch``'s ranges through ``pipeline``: each upstream in
    ``modes`` is re-read over the range ``batch`` pinned, in that mode."""

    batch: Batch
    pipeline: str
    modes: Mapping[str, ReadMode]


def plan_backfill_replay(
    store: "WatermarkStore", registry: "Registry", batch: Batch, pipeline: str
) -> BackfillReplayPlan:
    """Check the replay a backfill of ``batch``'s partition runs for ``pipeline`` (a batch
    the pipeline already applied, or one a newer batch superseded). Writes nothing and
    starts no JVM (upstreams are observed with delta-rs).

    Raises:
        UsageError: the pipeline does not merge (an overwrite target would go back to the
            batch's snapshot, an append target holds the rows already), or an upstream is
            snapshot-only.
        BatchStateError: a range is beyond the committed watermark, or the batch pins no
            version range for the pipeline.
        WatermarkError: an upstream cannot be observed.
    """
    from watermark_dagster.core.observations import read_mode_of
    from watermark_dagster.core.replay import check_replay_range
    from watermark_dagster.observe.observer import Observer

    reads = registry.pipelines[pipeline].upstreams
    _refuse_non_merge(
        registry,
        [pipeline],
        f"Batch {batch.batch_id} is not replayed and nothing was written; to rebuild the "
        "target from the current upstreams, materialize the newest batch partition or run "
        "`watermark reset` on its upstreams.",
    )
    committed = store.committed_versions()
    modes: dict[str, ReadMode] = {}
    for name in sorted(reads):
        planned = batch.inputs.get(name)
        if planned is None or planned.range is None:
            continue
        check_replay_range(name, planned.range, committed.get(name))
        table = registry.upstreams[name]
        mode = read_mode_of(table, Observer().observe(table))
        if mode is ReadMode.SNAPSHOT:
            raise UsageError(
                f"upstream {name!r} is snapshot-only: there are no changes to replay for "
                f"batch {batch.batch_id}; nothing was written.",
                upstream=name,
                batch_id=batch.batch_id,
            )
        _refuse_reloading(registry, name, planned.range, mode, [pipeline], batch_id=batch.batch_id)
        modes[name] = mode
    return BackfillReplayPlan(batch=batch, pipeline=pipeline, modes=modes)


def start_backfill_replay(
    store: "WatermarkStore",
    registry: "Registry",
    plan: BackfillReplayPlan,
    *,
    actor: str | None = None,
    reason: str | None = None,
) -> Batch:
    """Record the REPLAY batch of ``plan`` (PLANNED); the caller runs its pipeline and
    ends it with ``store.set_batch_status``.

    Raises:
        BatchStateError: the store refused it (see ``WatermarkStore.create_backfill_replay``).
    """
    return store.create_backfill_replay(
        plan.batch.batch_id,
        pipeline=plan.pipeline,
        upstreams=list(registry.pipelines[plan.pipeline].upstreams),
        modes=plan.modes,
        actor=actor or default_actor(),
        reason=reason,
    )


def refuse_reloading_replay(
    pipeline: "Pipeline", batch: Batch, inputs: "Mapping[str, UpstreamInput]", *, full_load: bool
) -> None:
    """A replay re-applies its range's changes through the version-guarded MERGE, or
    nothing: one whose range would be read as a snapshot (an append-only range that changed
    rows, ``on_data_change="snapshot"``), that the batch loads fully, or whose target does
    not exist, is refused before anything is written (I1, I5: a reload at the replay's old
    position would overwrite the newer rows, and a target created by a replay would hold
    its range alone, never reloaded).

    Raises:
        ReplayRefusedError: naming why, with the fix.
    """
    from watermark_dagster.write.commits import target_exists

    snapshots = sorted(u for u, i in inputs.items() if i.reads_snapshot)
    why = None
    if snapshots:
        why = (
            f"upstream(s) {snapshots} would be read as a snapshot (commits in the range "
            "update or delete rows, and there is no change data feed to read them as changes)"
        )
    elif full_load:
        why = "the batch loads the pipeline fully from snapshots"
    elif not target_exists(pipeline):
        why = f"its target {pipeline.target} does not exist"
    if why is not None:
        upstream = snapshots[0] if snapshots else next(iter(pipeline.upstreams), None)
        raise replay_refused(pipeline.name, batch.batch_id, why, upstream=upstream)
