"""Planning and finalizing decisions: plain Python, no Dagster, Spark or delta-rs.

The sensors turn their context into these typed inputs and act on the answers, so every
rule about ranges, gaps and what may advance lives (and is tested) here.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.errors import (
    UpstreamRecreatedError,
    WatermarkGapError,
    WatermarkRegressionError,
)


@dataclass(frozen=True)
class UpstreamPosition:
    """Where one upstream stands when a plan is made.

    Attributes:
        name: the upstream's registry name.
        latest_version: the newest Delta version observed.
        committed_version: the committed watermark, or None when nothing was ever committed.
        max_versions_per_batch: cap on how many versions one batch reads (None: no cap).
    """

    name: str
    latest_version: int
    committed_version: int | None
    max_versions_per_batch: int | None = None


@dataclass(frozen=True)
class PlannedInput:
    """What one batch pins for one upstream.

    ``range`` is None for a NOOP input. ``snapshot_version`` is the version at which the
    pipeline sees "the table as of the range's end" (the committed version for a NOOP).
    """

    upstream: str
    mode: ReadMode
    range: VersionRange | None
    snapshot_version: int

    def __post_init__(self) -> None:
        if (self.mode is ReadMode.NOOP) != (self.range is None):
            raise ValueError(f"{self.upstream}: a NOOP input has no range and only a NOOP has none")
        if self.range is not None and self.snapshot_version != self.range.end:
            raise ValueError(f"{self.upstream}: the snapshot of a ranged input is its end version")


@dataclass(frozen=True)
class Plan:
    """A batch plan before it is committed: inputs per upstream and the pipelines to run."""

    inputs: Mapping[str, PlannedInput]
    pipelines: tuple[str, ...]

    @property
    def has_work(self) -> bool:
        """True when at least one pipeline has a non-NOOP input."""
        return bool(self.pipelines)


def plan_batch(
    positions: Iterable[UpstreamPosition],
    pipeline_inputs: Mapping[str, Sequence[str]],
) -> Plan:
    """Plan the next batch from where each upstream stands.

    Ranges start right after the committed watermark (version 0 when nothing was
    committed) and end at the latest version, capped by ``max_versions_per_batch``.
    Upstreams with nothing new, or that no pipeline reads, get a NOOP input; pipelines whose
    inputs are all NOOP are left out.

    Args:
        positions: one position per upstream that pipelines read.
        pipeline_inputs: pipeline name -> names of the upstreams it reads.

    Returns:
        The plan; ``plan.has_work`` is False when there is nothing to do.

    Raises:
        UpstreamRecreatedError: an upstream's latest version is below its committed one.
    """
    by_name = {p.name: p for p in positions}
    consumed = {u for inputs in pipeline_inputs.values() for u in inputs}
    missing = sorted(consumed - by_name.keys())
    if missing:
        raise ValueError(f"no position given for upstream(s) {missing}")

    inputs: dict[str, PlannedInput] = {}
    for name in sorted(by_name):
        pos = by_name[name]
        committed = pos.committed_version
        if committed is not None and pos.latest_version < committed:
            raise UpstreamRecreatedError(
                f"Upstream '{name}' is at version {pos.latest_version}, below its committed "
                f"watermark {committed}: the table was dropped and recreated or restored.",
                upstream=name,
                versions=f"latest={pos.latest_version}, committed={committed}",
                fix=f"check the table, then run `watermark reset -t {name}` to reload it.",
            )
        start = 0 if committed is None else committed + 1
        if name not in consumed or start > pos.latest_version:
            snapshot = pos.latest_version if committed is None else committed
            inputs[name] = PlannedInput(name, ReadMode.NOOP, None, snapshot)
            continue
        end = pos.latest_version
        if pos.max_versions_per_batch is not None:
            end = min(end, start + pos.max_versions_per_batch - 1)
        inputs[name] = PlannedInput(name, ReadMode.CDF, VersionRange(start, end), end)

    pipelines = tuple(
        sorted(
            p
            for p, ups in pipeline_inputs.items()
            if any(inputs[u].mode is not ReadMode.NOOP for u in ups)
        )
    )
    return Plan(inputs=inputs, pipelines=pipelines)


def batch_is_due(last_planned_at: datetime | None, now: datetime, min_interval: timedelta) -> bool:
    """True when at least ``min_interval`` has passed since the previous batch was planned."""
    return last_planned_at is None or now - last_planned_at >= min_interval


class AdvanceDecision(StrEnum):
    """What the finalizer should do with one upstream's committed watermark."""

    ADVANCE = "ADVANCE"
    ALREADY_DONE = "ALREADY_DONE"


def decide_advance(
    upstream: str, committed: int | None, batch_range: VersionRange, batch_id: str
) -> AdvanceDecision:
    """Check that moving ``upstream`` to the end of ``batch_range`` keeps I1 and I2.

    The watermark may only move from ``start - 1`` to ``end``. Finding it already at
    ``end`` means an earlier finalizer advanced it and died before recording the batch:
    the step is done, nothing to repeat.

    Raises:
        WatermarkGapError: the watermark is below ``start - 1``; advancing would skip versions.
        WatermarkRegressionError: the watermark is already past the range (moved by hand).
    """
    current = -1 if committed is None else committed
    if current == batch_range.end:
        return AdvanceDecision.ALREADY_DONE
    if current == batch_range.start - 1:
        return AdvanceDecision.ADVANCE
    versions = f"committed={committed}, batch range={batch_range}"
    if current < batch_range.start - 1:
        raise WatermarkGapError(
            f"Upstream '{upstream}': batch {batch_id} covers {batch_range} but the committed "
            f"watermark is {committed}; advancing would skip versions "
            f"{current + 1}..{batch_range.start - 1}.",
            upstream=upstream,
            batch_id=batch_id,
            versions=versions,
            fix=f"abandon batch {batch_id} so the next plan starts at {current + 1}.",
        )
    raise WatermarkRegressionError(
        f"Upstream '{upstream}': the committed watermark {committed} is already past batch "
        f"{batch_id}'s range {batch_range}; advancing would move it backwards.",
        upstream=upstream,
        batch_id=batch_id,
        versions=versions,
        fix=f"abandon batch {batch_id}; the watermark was moved by hand while it was open.",
    )


@dataclass(frozen=True)
class FinalizeStep:
    """The finalizer's decision for one open batch."""

    advance: tuple[str, ...] = ()
    waiting: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True when no upstream is still waiting for a consumer."""
        return not self.waiting


def finalize_step(
    inputs: Mapping[str, PlannedInput],
    already_advanced: Iterable[str],
    consumers: Mapping[str, Iterable[str]],
    batch_pipelines: Iterable[str],
    succeeded: Iterable[str],
) -> FinalizeStep:
    """Decide which upstreams of an open batch can advance now.

    An upstream advances once every pipeline of the batch that reads it (its consumers in
    the asset graph) has succeeded for the batch. NOOP inputs have nothing to advance.

    Args:
        inputs: the batch's planned inputs per upstream.
        already_advanced: upstreams whose watermark this batch already advanced.
        consumers: upstream -> pipelines that read it, from the asset graph.
        batch_pipelines: the pipelines the batch planned to run.
        succeeded: pipelines that materialized the batch successfully.
    """
    done = set(already_advanced)
    planned = set(batch_pipelines)
    ok = set(succeeded)
    advance: list[str] = []
    waiting: dict[str, tuple[str, ...]] = {}
    for name, planned_input in sorted(inputs.items()):
        if planned_input.mode is ReadMode.NOOP or name in done:
            continue
        pending = sorted((set(consumers.get(name, ())) & planned) - ok)
        if pending:
            waiting[name] = tuple(pending)
        else:
            advance.append(name)
    return FinalizeStep(advance=tuple(advance), waiting=waiting)
