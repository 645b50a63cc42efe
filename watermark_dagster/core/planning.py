"""Planning decisions: plain Python, no Dagster, Spark or delta-rs.

The sensors turn their context into these typed inputs and act on the answers, so every
rule about what a batch reads lives (and is tested) here; what may advance once it ran is
in :mod:`watermark_dagster.core.finalizing`.
"""

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

from watermark_dagster.core.ranges import CursorPosition, CursorWindow, ReadMode, VersionRange
from watermark_dagster.errors import recreated_error


@dataclass(frozen=True)
class UpstreamPosition:
    """Where one upstream stands when a plan is made.

    Attributes:
        name: the upstream's registry name.
        latest_version: the newest Delta version observed.
        committed_version: the committed watermark, or None when nothing was ever committed.
        max_versions_per_batch: cap on how many versions one batch reads (None: no cap).
        mode: how a range of this upstream is read: CDF, APPEND_ONLY, SNAPSHOT (a
            snapshot-only upstream) or TIMESTAMP (a cursor upstream, which has no versions).
        committed_cursor: for a cursor upstream, the committed cursor position.
        has_new_data: for a cursor upstream, whether its source changed since the last
            committed window (versions say this for the others).
    """

    name: str
    latest_version: int
    committed_version: int | None
    max_versions_per_batch: int | None = None
    mode: ReadMode = ReadMode.CDF
    committed_cursor: CursorPosition | None = None
    has_new_data: bool = False


@dataclass(frozen=True)
class PlannedInput:
    """What one batch pins for one upstream.

    A versioned upstream has a ``range`` (None for a NOOP input) and a
    ``snapshot_version``: the version at which the pipeline sees "the table as of the
    range's end" (the committed version for a NOOP). A cursor upstream has a ``window``
    instead (for a NOOP, the empty window ending at the committed position), and no
    versions.
    """

    upstream: str
    mode: ReadMode
    range: VersionRange | None
    snapshot_version: int | None
    window: CursorWindow | None = None

    def __post_init__(self) -> None:
        if self.window is not None:
            if self.range is not None or self.mode not in (ReadMode.TIMESTAMP, ReadMode.NOOP):
                raise ValueError(f"{self.upstream}: only a cursor input has a window")
            return
        if self.mode is ReadMode.TIMESTAMP:
            raise ValueError(f"{self.upstream}: a TIMESTAMP input needs a window")
        if (self.mode is ReadMode.NOOP) != (self.range is None):
            raise ValueError(f"{self.upstream}: a NOOP input has no range and only a NOOP has none")
        if self.range is not None and self.snapshot_version != self.range.end:
            raise ValueError(f"{self.upstream}: the snapshot of a ranged input is its end version")

    @property
    def is_cursor(self) -> bool:
        """True for an upstream read through a cursor column (no versions)."""
        return self.window is not None

    @property
    def reads(self) -> bool:
        """True when the batch reads something new from this upstream (not NOOP)."""
        return self.mode is not ReadMode.NOOP

    def describe(self) -> str:
        """``CDF [3, 5]``, ``TIMESTAMP (a .. b]``, ``NOOP``: for logs and the command line."""
        if self.mode is ReadMode.NOOP:
            return "NOOP"
        return f"{self.mode.value} {self.window if self.window is not None else self.range}"


@dataclass(frozen=True)
class Plan:
    """A batch plan before it is committed: inputs per upstream and the pipelines to run.

    ``full_load`` names the pipelines that read every upstream as a snapshot in this
    batch and replace their target: first runs (target missing or empty, or an upstream
    with nothing committed), snapshot-only upstreams, and overwrite pipelines.
    """

    inputs: Mapping[str, PlannedInput]
    pipelines: tuple[str, ...]
    full_load: tuple[str, ...] = ()

    @property
    def has_work(self) -> bool:
        """True when at least one pipeline has a non-NOOP input."""
        return bool(self.pipelines)


def plan_batch(
    positions: Iterable[UpstreamPosition],
    pipeline_inputs: Mapping[str, Sequence[str]],
    *,
    bootstrap: Iterable[str] = (),
    overwrite: Iterable[str] = (),
    frozen: Collection[str] = (),
) -> Plan:
    """Plan the next batch from where each upstream stands.

    A versioned upstream with nothing committed is read as a SNAPSHOT of its latest version
    (the first-run load: no need for a change feed back to version 0). Otherwise its range
    starts right after the committed watermark and ends at the latest version, capped by
    ``max_versions_per_batch``, read in the upstream's mode. A cursor upstream gets the
    window that starts at its committed position; the end is pinned at the first read.
    Upstreams with nothing new, or that no pipeline reads, get a NOOP input; pipelines
    whose inputs are all NOOP are left out unless they need a first load.

    Args:
        positions: one position per upstream that pipelines read.
        pipeline_inputs: pipeline name -> names of the upstreams it reads.
        bootstrap: pipelines whose target is missing or empty: they load a snapshot of
            every upstream they read and create their target, even if nothing changed.
        overwrite: pipelines that replace their target whenever they run.
        frozen: upstreams that also feed a pipeline left out of this plan (its other
            upstreams are blocked or unavailable): they are planned NOOP, read as of their
            committed watermark, so they cannot advance past changes that pipeline has not
            applied (I1).

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

    inputs = {
        name: _plan_input(by_name[name], name in consumed and name not in frozen)
        for name in sorted(by_name)
    }
    first_loads = set(bootstrap) & set(pipeline_inputs)
    pipelines = tuple(
        sorted(
            p
            for p, ups in pipeline_inputs.items()
            if p in first_loads or any(inputs[u].reads for u in ups)
        )
    )
    full_load = tuple(
        p
        for p in pipelines
        if p in first_loads
        or p in set(overwrite)
        or any(inputs[u].mode is ReadMode.SNAPSHOT for u in pipeline_inputs[p])
    )
    return Plan(inputs=inputs, pipelines=pipelines, full_load=full_load)


def _plan_input(pos: UpstreamPosition, consumed: bool) -> PlannedInput:
    name = pos.name
    if pos.mode is ReadMode.TIMESTAMP:
        start = pos.committed_cursor
        if consumed and (pos.has_new_data or start is None):
            return PlannedInput(name, ReadMode.TIMESTAMP, None, None, CursorWindow(start))
        return PlannedInput(name, ReadMode.NOOP, None, None, CursorWindow(start, start))
    committed = pos.committed_version
    found = (
        None
        if committed is None
        else recreation_found(
            pos.latest_version,
            None,
            floor=committed,
            reference=f"its committed watermark {committed}",
        )
    )
    if found is not None:
        raise recreated_error(
            name,
            found,
            "Nothing can be planned for it.",
            versions=f"latest={pos.latest_version}, committed={committed}",
        )
    if committed is None:
        if not consumed:
            return PlannedInput(name, ReadMode.NOOP, None, pos.latest_version)
        rng = VersionRange(0, pos.latest_version)
        return PlannedInput(name, ReadMode.SNAPSHOT, rng, rng.end)
    start = committed + 1
    if not consumed or start > pos.latest_version:
        return PlannedInput(name, ReadMode.NOOP, None, committed)
    end = pos.latest_version
    if pos.max_versions_per_batch is not None and pos.mode is not ReadMode.SNAPSHOT:
        end = min(end, start + pos.max_versions_per_batch - 1)
    return PlannedInput(name, pos.mode, VersionRange(start, end), end)


_RECHECK = "|recheck@"


def cursor_state(source_state: str | None, recheck_at: int | None) -> str | None:
    """The source state recorded with a committed cursor position: the source's state,
    plus when rows held back by the lag pass it (µs since the epoch)."""
    if recheck_at is None:
        return source_state
    return f"{source_state or ''}{_RECHECK}{recheck_at}"


def delta_source_version(source_state: str | None) -> int | None:
    """The Delta version in a cursor source's observed state (``v12`` -> 12), or None for
    a source that is not a Delta table (a folder's fingerprint, or no state)."""
    if source_state is None:
        return None
    base = source_state.partition(_RECHECK)[0]
    if len(base) > 1 and base[0] == "v" and base[1:].isdigit():
        return int(base[1:])
    return None


def cursor_has_new_data(committed_state: str | None, state: str | None, now: datetime) -> bool:
    """Whether a cursor upstream may hold rows its committed position has not read: its
    source changed, its state is unknown, or rows held back by the lag have passed it."""
    if committed_state is None or state is None:
        return True
    base, _, recheck = committed_state.partition(_RECHECK)
    if base != state:
        return True
    return bool(recheck) and now.timestamp() * 1_000_000 >= int(recheck)


class CommittedMark(Protocol):
    """What planning needs of a committed watermark row."""

    @property
    def committed_version(self) -> int | None:
        """The Delta version processed through, or None when nothing is committed."""
        ...

    @property
    def committed_cursor(self) -> CursorPosition | None:
        """A cursor upstream's position read through, or None when nothing is committed."""
        ...

    @property
    def source_state(self) -> str | None:
        """The cursor source's state recorded with the position (see :func:`cursor_state`)."""
        ...


def with_committed(
    position: UpstreamPosition,
    mark: CommittedMark | None,
    source_state: str | None,
    now: datetime | None = None,
) -> UpstreamPosition:
    """``position`` with the committed watermark ``mark`` (None: nothing committed)."""
    if mark is None:
        return replace(position, committed_version=None, committed_cursor=None, has_new_data=True)
    return replace(
        position,
        committed_version=mark.committed_version,
        committed_cursor=mark.committed_cursor,
        has_new_data=cursor_has_new_data(mark.source_state, source_state, now or datetime.now(UTC)),
    )


def plan_from_committed(
    positions: Iterable[UpstreamPosition],
    marks: Mapping[str, CommittedMark],
    source_states: Mapping[str, str | None],
    pipeline_inputs: Mapping[str, Sequence[str]],
    *,
    bootstrap: Iterable[str] = (),
    overwrite: Iterable[str] = (),
    frozen: Collection[str] = (),
) -> Plan:
    """:func:`plan_batch` of ``positions`` as observed, each starting at its committed
    watermark in ``marks`` (absent: nothing committed) and, for a cursor upstream, new
    when its observed ``source_states`` entry differs from the committed one (see
    :func:`with_committed`). The coordinator calls it inside the store's compare-and-swap,
    previews with the watermarks they read."""
    fresh = [with_committed(p, marks.get(p.name), source_states.get(p.name)) for p in positions]
    return plan_batch(
        fresh, pipeline_inputs, bootstrap=bootstrap, overwrite=overwrite, frozen=frozen
    )


def batch_is_due(last_planned_at: datetime | None, now: datetime, min_interval: timedelta) -> bool:
    """True when at least ``min_interval`` has passed since the previous batch was planned."""
    return last_planned_at is None or now - last_planned_at >= min_interval


_BATCH_ID = re.compile(r"b(\d+)")


def prunable_batch_partitions(
    partition_keys: Iterable[str], *, newest_seq: int, keep: int, held: Collection[str] = ()
) -> list[str]:
    """The batch partitions among ``partition_keys`` to delete from Dagster: those of
    batches older than the newest ``keep`` sequence numbers up to ``newest_seq`` (a key is
    beyond retention when its sequence is at most ``newest_seq - keep``), never one in
    ``held`` (open batches, batches a run is in flight for) and never a key that is not a
    batch id. ``keep`` 0 keeps every partition. Keys come back in the order given.

    Pruning only shortens Dagster's partition list: the batches, their ranges and their
    history stay in the control tables, and so do the runs and materializations in Dagster.
    """
    if keep <= 0:
        return []
    floor = newest_seq - keep
    return [
        key
        for key in partition_keys
        if (found := _BATCH_ID.fullmatch(key)) is not None
        and int(found.group(1)) <= floor
        and key not in held
    ]


def recreation_found(
    latest_version: int,
    table_id: str | None,
    *,
    floor: int,
    reference: str,
    expected_table_id: str | None = None,
) -> str | None:
    """What shows that a table was dropped and recreated at its path, or None.

    The one rule, for planning, observation and the read path alike: a table still
    continues from ``reference`` (a committed watermark, a planned range) when its table id
    is the one recorded then (unknown ids pass) and it has at least ``floor`` as a version.
    A new table at the path may have fewer, as many or more versions, so the id decides
    first; the version count catches tables whose id was never recorded.

    Args:
        latest_version: the table's newest version now.
        table_id: its table id now (None or empty: unknown).
        floor: the version it must have reached.
        reference: names what it must continue from, e.g. ``"its committed watermark 5"``.
        expected_table_id: the id recorded with ``reference`` (None or empty: unknown).

    Returns:
        The finding, phrased to follow "was dropped and recreated: " in
        :func:`~watermark_dagster.errors.recreated_error`.
    """
    if expected_table_id and table_id and table_id != expected_table_id:
        return (
            f"its table id is {table_id}, not {expected_table_id} as when {reference} was recorded"
        )
    if latest_version < floor:
        return f"it is at version {latest_version}, below {reference}"
    return None
