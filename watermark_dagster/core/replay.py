"""Replay decisions: which versions may be replayed, and where a replay pins the other
upstreams. Plain Python, no Dagster, Spark or delta-rs.

A REPLAY batch re-reads an applied version range of one upstream. It pins the other
upstreams where the scheduled batch that applied the range's end pinned them, and writes
at that batch's position, so a merge target takes nothing older than what it holds (I5).
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import CursorWindow, ReadMode, VersionRange
from watermark_dagster.core.records import Batch, BatchKind, BatchStatus
from watermark_dagster.errors import BatchStateError


def check_replay_range(upstream: str, rng: VersionRange, committed: int | None) -> int:
    """Refuse a replay of versions not applied yet: only versions up to the committed
    watermark can be replayed.

    Args:
        upstream: the upstream to replay.
        rng: the versions to re-read.
        committed: the upstream's committed version (None: nothing committed).

    Returns:
        The committed version, which the range does not go beyond.

    Raises:
        BatchStateError: ``rng`` ends beyond ``committed`` (or nothing is committed); the
            message names the range, the committed watermark and the fix.
    """
    if committed is not None and rng.end <= committed:
        return committed
    raise BatchStateError(
        f"Upstream '{upstream}': the replay range {rng} goes beyond the committed "
        f"watermark {committed}; only applied versions can be replayed.",
        upstream=upstream,
        versions=f"range={rng}, committed={committed}",
        fix=f"replay up to version {committed}, or let the scheduled batches "
        "apply the newer versions.",
    )


@dataclass(frozen=True)
class ReplayPlan:
    """What a REPLAY batch reads and where it writes.

    Attributes:
        origin: the completed scheduled batch that applied the range's end.
        inputs: the replayed range, and the other upstreams pinned as ``origin`` pinned
            them (NOOP inputs), sorted by upstream.
        order_seq: the position the replay writes at in its targets.
    """

    origin: Batch
    inputs: dict[str, PlannedInput]
    order_seq: int


def plan_replay(
    batches: Iterable[Batch],
    upstream: str,
    rng: VersionRange,
    *,
    mode: ReadMode,
    upstreams: Iterable[str],
) -> ReplayPlan:
    """Plan the replay of ``rng`` of ``upstream`` in ``mode``.

    The origin is the newest completed scheduled batch whose range of ``upstream`` holds
    ``rng.end``. Rows it wrote may hold changes after the replay's end when the range
    stops inside the origin's: the replay then ranks just below it.

    Args:
        batches: the recorded batches, oldest first.
        upstream: the upstream whose range is replayed.
        rng: the versions of ``upstream`` to replay.
        mode: the read mode the replay reads ``rng`` in.
        upstreams: every upstream the replayed pipelines read; those the origin did not
            pin are left out.

    Raises:
        BatchStateError: no completed scheduled batch applied ``rng.end``.
    """
    covering = [
        b
        for b in batches
        if b.kind is BatchKind.SCHEDULED
        and b.status is BatchStatus.COMPLETED
        and (done := b.inputs.get(upstream)) is not None
        and done.range is not None
        and done.range.start <= rng.end <= done.range.end
    ]
    if not covering:
        raise BatchStateError(
            f"Upstream '{upstream}': no completed batch applied version {rng.end}, so "
            "there is nothing to pin the other upstreams to.",
            upstream=upstream,
            versions=f"range={rng}",
            fix="list batches with `watermark batches` and pick a range they applied.",
        )
    origin = covering[-1]
    origin_range = origin.inputs[upstream].range
    assert origin_range is not None
    order_seq = origin.seq if rng.end == origin_range.end else origin.seq - 1
    inputs: dict[str, PlannedInput] = {}
    for name in sorted(set(upstreams) | {upstream}):
        if name == upstream:
            inputs[name] = PlannedInput(name, mode, rng, rng.end)
        elif (pinned := origin.inputs.get(name)) is not None:
            inputs[name] = _pinned(pinned)
    return ReplayPlan(origin=origin, inputs=inputs, order_seq=order_seq)


def plan_batch_replay(
    batch: Batch,
    upstreams: Iterable[str],
    *,
    modes: Mapping[str, ReadMode],
    committed: Mapping[str, int | None],
) -> ReplayPlan:
    """Plan the replay of ``batch``'s version ranges of ``upstreams`` (a backfill of an
    applied batch partition): each range ``batch`` pinned is re-read in ``modes[upstream]``,
    the other upstreams stay where ``batch`` pinned them (NOOP), and the replay writes at
    ``batch``'s position, so a merge target takes nothing older than what it holds (I5).

    It is ``watermark replay`` of every one of those ranges at once, with ``batch`` as the
    origin: a first load's snapshot ``[0, v]`` is re-read as the changes of ``[0, v]``.

    Args:
        batch: the batch whose ranges are replayed (scheduled, or a replay itself).
        upstreams: the upstreams the replayed pipeline reads.
        modes: the read mode of each versioned upstream with a range in ``batch``.
        committed: each upstream's committed version.

    Raises:
        BatchStateError: a range goes beyond the committed watermark (the batch is not
            applied yet), or ``batch`` pins no version range for any of ``upstreams``.
    """
    wanted = sorted(u for u in set(upstreams) if u in batch.inputs)
    ranged = [u for u in wanted if batch.inputs[u].range is not None]
    if not ranged:
        raise BatchStateError(
            f"Batch {batch.batch_id} pins no version range of {wanted}: there is nothing "
            "to replay (a cursor window cannot be re-read).",
            batch_id=batch.batch_id,
            fix=f"list its ranges with `watermark batch {batch.batch_id}` and replay a "
            "batch that read versions.",
        )
    inputs: dict[str, PlannedInput] = {}
    for name in wanted:
        planned = batch.inputs[name]
        if planned.range is None:
            inputs[name] = _pinned(planned)
            continue
        check_replay_range(name, planned.range, committed.get(name))
        inputs[name] = PlannedInput(name, modes[name], planned.range, planned.range.end)
    return ReplayPlan(origin=batch, inputs=inputs, order_seq=batch.write_seq)


def _pinned(planned: PlannedInput) -> PlannedInput:
    """Where a replay holds an upstream it does not replay: at the origin's end, read as
    nothing new (an empty window at its end, or a NOOP at its snapshot version)."""
    if planned.window is not None:
        end = planned.window.end
        return PlannedInput(planned.upstream, ReadMode.NOOP, None, None, CursorWindow(end, end))
    return PlannedInput(planned.upstream, ReadMode.NOOP, None, planned.snapshot_version)
