"""Moving a committed watermark by hand: the use cases behind ``watermark set`` and ``reset``.

A change is previewed first (:func:`preview_change`, which writes nothing), then applied
(:func:`apply_change`) with the preview as the compare-and-swap expectation, so a change
confirmed on an outdated view is refused. The store decides whether an open batch blocks
the change (it refuses unless ``force``). Before a forced change abandons that batch it
fences it (:class:`Fencing`): the batch's in-flight runs are stopped and waited for, then
:func:`recover_applied` records the pipelines whose target already holds the batch (a
run killed before its checkpoint), :func:`fence_batch` makes every other target refuse
the batch's writes from then on, and :func:`advance_finished` commits the upstreams it
already applied everywhere (I4). What a target still holds of the batch beyond that, the
next plan reloads (:func:`~watermark_dagster.operations.coordinate.reloads_after_abandon`).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from watermark_dagster.core.commits import version_at
from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.records import WatermarkChange, WatermarkHow, default_actor
from watermark_dagster.errors import BatchStateError, UsageError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from watermark_dagster.config.registry import Registry
    from watermark_dagster.store import WatermarkStore

LATEST = "latest"


@dataclass(frozen=True)
class TimestampResolution:
    """How a ``--timestamp`` value became a version: the text given, the time it means and
    when the chosen version was committed (ISO 8601, UTC)."""

    timestamp: str
    resolved_time: str
    version_committed_at: str

    def as_dict(self) -> dict[str, str]:
        """The resolution as recorded in history and printed by ``--json``."""
        return {
            "timestamp": self.timestamp,
            "resolved_time": self.resolved_time,
            "version_committed_at": self.version_committed_at,
        }


@dataclass(frozen=True)
class ChangePreview:
    """What a manual change would do now; nothing was written.

    ``expected`` is the store's preview, handed back to :func:`apply_change` so that a
    change whose upstream moved since is refused.
    """

    upstream: str
    how: WatermarkHow
    new: int | None
    actor: str
    expected: WatermarkChange
    open_batch_reads: str | None
    consumers: tuple[str, ...]
    effect: str
    resolved: TimestampResolution | None = None

    @property
    def old(self) -> int | None:
        """The committed version now."""
        return self.expected.old

    @property
    def changed(self) -> bool:
        """False when the watermark is already at the new value (nothing to do)."""
        return self.expected.changed

    @property
    def open_batch(self) -> str | None:
        """The open batch that reads the upstream, if any (a forced change abandons it)."""
        return self.expected.open_batch


@dataclass(frozen=True)
class Fencing:
    """How a forced change makes sure the batch it abandons writes nothing afterwards.

    Attributes:
        stop_runs: stops the batch's in-flight runs (given its id) and returns once they
            ended; raises :class:`~watermark_dagster.errors.BatchStateError`, naming them,
            when some still run (nothing is changed then).
        spark: the session that commits the fences (started only when a target needs one).
    """

    stop_runs: Callable[[str], tuple[str, ...]]
    spark: Callable[[], "SparkSession"]


@dataclass(frozen=True)
class ChangeResult:
    """A manual change as applied: the store's record of it and its effect, recomputed
    from the value it actually replaced."""

    preview: ChangePreview
    change: WatermarkChange
    effect: str
    advanced: tuple[str, ...] = ()
    recovered: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    fenced: tuple[str, ...] = ()
    reloads: tuple[str, ...] = ()
    """Pipelines whose next batch reloads their target in full: they hold rows of the
    abandoned batch that the watermarks do not cover
    (:func:`~watermark_dagster.operations.coordinate.reloads_after_abandon`)."""


def _versions(first: int, last: int) -> str:
    return f"version {first}" if first == last else f"versions {first}..{last}"


def describe_effect(
    upstream: str, old: int | None, new: int | None, consumers: Sequence[str]
) -> str:
    """What the consumers of ``upstream`` will see at the next batch, in one sentence."""
    readers = ", ".join(consumers) or "no pipeline"
    if new is None:
        return (
            f"nothing committed: the next batch loads {upstream} as a snapshot of its latest "
            f"version, and {readers} reload it in full"
        )
    if old is None:
        return f"the next batch reads {upstream} from version {new + 1} ({readers})"
    if new < old:
        return (
            f"the next batch reads {upstream} from version {new + 1}: {readers} re-read "
            f"{_versions(new + 1, old)}, already applied once"
        )
    return (
        f"the next batch reads {upstream} from version {new + 1}: {readers} never read "
        f"{_versions(old + 1, new)}"
    )


def _ms_iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def refuse_cursor(registry: "Registry", upstream: str) -> None:
    """Refuse to set a version on an upstream read through a cursor column.

    Raises:
        UsageError: ``upstream`` has no versions to set.
    """
    if registry.upstreams[upstream].is_cursor:
        raise UsageError(
            f"upstream {upstream!r} is read through a cursor column (mode='timestamp') and has "
            f"no versions to set; `watermark reset -t {upstream}` reads it from the start again."
        )


def requested_version(
    registry: "Registry",
    upstream: str,
    requested: int | Literal["latest"],
    *,
    floor: int | None = None,
) -> int:
    """The version ``requested`` (a version, or ``latest``) means for ``upstream`` now.
    A landing folder's new files are logged first when ``floor`` (what the control root
    committed or pinned) is given; without it (a dry run) they count as numbered the way
    the coordinator's look would number them, and nothing is written.

    Raises:
        UsageError: the version is beyond the table's latest.
        WatermarkError: the table cannot be observed.
    """
    from watermark_dagster.observe.observer import Observer

    latest = Observer().observe(registry.upstreams[upstream], floor=floor).latest_version
    if requested == LATEST:
        return latest
    assert isinstance(requested, int)
    if requested > latest:
        raise UsageError(
            f"--version {requested} is beyond the latest version of upstream {upstream!r} "
            f"({latest}); give a version from 0 to {latest}, or `latest`."
        )
    return requested


def version_at_time(
    registry: "Registry", upstream: str, when: datetime, *, text: str, now: datetime
) -> tuple[int, TimestampResolution]:
    """The newest version of ``upstream`` committed at or before ``when``, and how it was
    found (``text`` is what the operator typed, for messages and history).

    Raises:
        UsageError: ``when`` is in the future or before the oldest commit in the log.
    """
    from watermark_dagster.observe.log import DeltaLog

    if when > now:
        raise UsageError(
            f"--timestamp {text!r} ({when.isoformat()}) is in the future (a time without a "
            "zone is UTC); give a past time, or `--version latest` to skip everything "
            "committed so far."
        )
    table = registry.upstreams[upstream]
    commits = DeltaLog(table.path, table.storage_options).history()
    version = version_at(commits, when)
    if version is None:
        oldest, oldest_ms = min(commits)
        if oldest == 0:
            raise UsageError(
                f"--timestamp {text!r} ({when.isoformat()}) is before the first commit of "
                f"upstream {upstream!r} (version 0 at {_ms_iso(oldest_ms)}): there is no "
                "version to keep. To read the whole table again, use "
                f"`watermark reset -t {upstream}`."
            )
        raise UsageError(
            f"--timestamp {text!r} ({when.isoformat()}) is before the oldest commit left in "
            f"the log of upstream {upstream!r} (version {oldest} at {_ms_iso(oldest_ms)}; "
            f"older entries were cleaned up). Give a later time, or "
            f"`watermark reset -t {upstream}`."
        )
    return version, TimestampResolution(
        timestamp=text,
        resolved_time=when.isoformat(),
        version_committed_at=_ms_iso(dict(commits)[version]),
    )


def preview_change(
    store: "WatermarkStore",
    registry: "Registry",
    upstream: str,
    version: int | None,
    *,
    force: bool,
    actor: str | None = None,
    resolved: TimestampResolution | None = None,
) -> ChangePreview:
    """What moving ``upstream``'s committed watermark to ``version`` (None: reset) would do.

    Writes nothing. When an open batch reads the upstream and ``force`` is False, the
    store's refusal is raised here, before anyone is asked to confirm.

    Raises:
        BatchStateError: an open batch reads the upstream and ``force`` is False.
        TerminalError: the version is not allowed for this kind of change.
    """
    how = WatermarkHow.RESET if version is None else WatermarkHow.MANUAL_SET
    who = actor or default_actor()
    expected = store.preview_watermark(upstream, version, how=how)
    if expected.changed and expected.open_batch is not None and not force:
        # The store owns the rule: with ``expected`` naming this open batch it refuses
        # (BatchStateError), or, if the batch ended meanwhile, refuses as moved.
        # Either way nothing is written.
        store.set_watermark(upstream, version, how=how, actor=who, expected=expected)
    reads = (
        store.get_batch(expected.open_batch).inputs[upstream].describe()
        if expected.open_batch is not None
        else None
    )
    consumers = registry.consumers(upstream)
    return ChangePreview(
        upstream=upstream,
        how=how,
        new=version,
        actor=who,
        expected=expected,
        open_batch_reads=reads,
        consumers=consumers,
        effect=describe_effect(upstream, expected.old, version, consumers),
        resolved=resolved,
    )


def apply_change(
    store: "WatermarkStore",
    registry: "Registry",
    preview: ChangePreview,
    *,
    reason: str | None,
    force: bool,
    fencing: Fencing | None = None,
) -> ChangeResult:
    """Apply a previewed (and confirmed) change, recorded in ``history``.

    With an open batch that reads the upstream (``force``): its in-flight runs are
    stopped and its targets fenced (``fencing``; without it only each run's own check
    before its write guards the batch), the pipelines that already applied it are
    recorded as succeeded, its other upstreams whose consumers all applied it are
    advanced (:func:`advance_finished`), then the store abandons it and moves the
    watermark. ``reloads`` in the result names the pipelines the next batch reloads in
    full: they hold rows of the batch that the watermarks do not cover.

    Raises:
        BatchStateError: an open batch reads the upstream and ``force`` is False, or
            some of its runs did not stop (nothing was changed).
        TerminalError: the upstream moved since ``preview``.
    """
    advanced: tuple[str, ...] = ()
    recovered: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    fenced: tuple[str, ...] = ()
    if preview.open_batch is not None and preview.changed:
        if fencing is not None:
            stopped = fencing.stop_runs(preview.open_batch)
        recovered = recover_applied(store, registry, preview.open_batch, actor=preview.actor)
        if fencing is not None:
            fenced, late = fence_batch(
                store, registry, preview.open_batch, spark=fencing.spark, actor=preview.actor
            )
            recovered += late
            fault_point("after_fence")
        advanced = advance_finished(
            store, registry, preview.open_batch, skip=preview.upstream, actor=preview.actor
        )
    change = store.set_watermark(
        preview.upstream,
        preview.new,
        how=preview.how,
        actor=preview.actor,
        reason=reason,
        force=force,
        expected=preview.expected,
        detail={"resolved": preview.resolved.as_dict()} if preview.resolved else None,
    )
    reloads: tuple[str, ...] = ()
    if change.abandoned:
        from watermark_dagster.operations.coordinate import reloads_after_abandon

        _, reloads = reloads_after_abandon(registry, store, store.committed())
    return ChangeResult(
        preview=preview,
        change=change,
        effect=describe_effect(preview.upstream, change.old, preview.new, preview.consumers),
        advanced=advanced,
        recovered=recovered,
        stopped=stopped,
        fenced=fenced,
        reloads=reloads,
    )


def recover_applied(
    store: "WatermarkStore", registry: "Registry", batch_id: str, *, actor: str
) -> tuple[str, ...]:
    """Before a forced change abandons ``batch_id``: record as succeeded each of its
    pipelines whose run was killed after writing its target and before recording success.

    The target says so itself (:func:`~watermark_dagster.write.fences.applied_by_target`:
    its Delta transaction, or a commit labelled with the batch). Without this, the batch's
    ranges would be read again by the next batch under a new position, and an append
    target would get those rows twice (I4). Each recovery is a SUCCESS checkpoint and a
    ``PIPELINE_RECOVERED`` history row naming the evidence, so :func:`advance_finished`
    then advances the upstreams as the finalizer would.

    Returns the pipelines recovered; none when the batch ended meanwhile.
    """
    from watermark_dagster.core.records import BatchStatus
    from watermark_dagster.operations.coordinate import succeeded
    from watermark_dagster.write.fences import applied_by_target

    batch = store.get_batch(batch_id)
    if batch.status is not BatchStatus.PLANNED:
        return ()
    done = succeeded(store, batch)
    recovered: list[str] = []
    for name in batch.pipelines:
        pipeline = registry.pipelines.get(name)
        if name in done or pipeline is None:
            continue
        evidence = applied_by_target(
            pipeline,
            batch_id,
            batch.write_seq,
            root=store.root_id(),
            attempts=store.checkpoints(batch_id=batch_id, pipeline=name),
        )
        if evidence is None:
            continue
        _record_recovered(store, name, batch_id, evidence, actor=actor)
        recovered.append(name)
    return tuple(recovered)


def _record_recovered(
    store: "WatermarkStore", pipeline: str, batch_id: str, evidence: str, *, actor: str
) -> None:
    from watermark_dagster.core.records import CheckpointStatus

    attempt = store.begin_checkpoint(pipeline, batch_id, run_id=actor)
    store.finish_checkpoint(pipeline, batch_id, attempt, CheckpointStatus.SUCCESS)
    store.record(
        "PIPELINE_RECOVERED",
        actor=actor,
        batch_id=batch_id,
        pipeline=pipeline,
        detail={"attempt": attempt, "evidence": evidence},
    )


def fence_batch(
    store: "WatermarkStore",
    registry: "Registry",
    batch_id: str,
    *,
    spark: Callable[[], "SparkSession"],
    actor: str,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Before a forced change abandons scheduled batch ``batch_id``: fence the target of
    each of its pipelines that has not applied it, so that no write of the batch lands
    there afterwards (:func:`~watermark_dagster.write.fences.fence_target`: an empty
    commit recording the batch's Delta transaction, which every write of the batch
    carries). Without it, a run that passed its own check just before the batch was
    abandoned could still commit, and the next batch would apply the same ranges again
    (an append twice, I4; a merge could bring back keys the next batch deleted, I5).

    A pipeline whose write won the race is recorded as succeeded instead, as
    :func:`recover_applied` does. A replay batch needs no fence: it writes through the
    ``_wm_seq`` guard and never inserts a key, so a late replay write is a replay. Each
    fence is a ``TARGET_FENCED`` history row naming the target's version.

    Returns the pipelines fenced and the pipelines recovered; none when the batch ended
    meanwhile.
    """
    from watermark_dagster.core.records import BatchKind, BatchStatus
    from watermark_dagster.operations.coordinate import succeeded
    from watermark_dagster.write.fences import fence_pipeline

    batch = store.get_batch(batch_id)
    if batch.status is not BatchStatus.PLANNED or batch.kind is BatchKind.REPLAY:
        return (), ()
    done = succeeded(store, batch)
    fenced: list[str] = []
    recovered: list[str] = []
    for name in batch.pipelines:
        pipeline = registry.pipelines.get(name)
        if name in done or pipeline is None:
            continue
        fence = fence_pipeline(
            spark,
            pipeline,
            batch_id,
            batch.write_seq,
            root=store.root_id(),
            attempts=store.checkpoints(batch_id=batch_id, pipeline=name),
        )
        if fence is None:
            continue  # no log to fence: the next plan finds a late write (reloads_after_abandon)
        if fence.applied is not None:
            _record_recovered(store, name, batch_id, fence.applied, actor=actor)
            recovered.append(name)
        elif fence.fenced is not None:
            fenced.append(name)
            if not fence.new:
                continue  # fenced by an interrupted forced change, recorded then
            store.record(
                "TARGET_FENCED",
                actor=actor,
                batch_id=batch_id,
                pipeline=name,
                detail={"target": pipeline.target, "target_version": fence.fenced},
            )
    return tuple(fenced), tuple(recovered)


def advance_finished(
    store: "WatermarkStore", registry: "Registry", batch_id: str, *, skip: str, actor: str
) -> tuple[str, ...]:
    """Before a forced change abandons ``batch_id``, advance its upstreams (but ``skip``)
    whose consumers all succeeded for it: their changes are applied, and re-reading them
    in the next batch would append them twice to an append target (I4).

    Returns the upstreams advanced; none when the batch ended meanwhile.
    """
    from watermark_dagster.core.records import BatchStatus
    from watermark_dagster.operations.coordinate import finalize_step_now

    batch = store.get_batch(batch_id)  # as it is now, not as it was previewed
    if batch.status is not BatchStatus.PLANNED:
        return ()  # a finalizer ended it meanwhile; set_watermark sees the change
    step = finalize_step_now(store, registry, batch)
    advanced: list[str] = []
    for upstream in step.advance:
        if upstream == skip:
            continue
        try:
            store.advance(batch, upstream, actor=actor)
        except BatchStateError:
            break  # the batch ended meanwhile (a finalizer completed it)
        advanced.append(upstream)
    return tuple(advanced)
