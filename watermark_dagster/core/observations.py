"""What an observation of the upstreams found, and the rules that read it: plain Python.

The observer (:mod:`watermark_dagster.observe.observer`) does the I/O and returns these
records; which read mode an upstream gets, whether a table was recreated, whether a
pipeline needs a first load and where a new upstream starts are decided here.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple, Protocol

from watermark_dagster.core.commits import version_at
from watermark_dagster.core.planning import (
    Plan,
    UpstreamPosition,
    plan_from_committed,
    recreation_found,
)
from watermark_dagster.core.ranges import CursorPosition, ReadMode
from watermark_dagster.core.records import Watermark
from watermark_dagster.errors import TerminalError, UpstreamRecreatedError, recreated_error


@dataclass(frozen=True)
class Observation:
    """What one look at an upstream found.

    ``oldest_version`` is the oldest commit file still in a local table's log (the listing
    every look makes): the commits before it were removed by log cleanup. None where no
    listing was made (object stores, cursor sources). ``rows_without_cursor`` is a
    database upstream's count of rows whose cursor is NULL (None: not counted).
    """

    upstream: str
    path: str
    latest_version: int
    cdf_enabled: bool
    table_id: str
    schema_fingerprint: str
    state: str | None = None
    oldest_version: int | None = None
    rows_without_cursor: int | None = None

    @property
    def is_cursor(self) -> bool:
        """True for a cursor upstream (no versions: ``latest_version`` is -1)."""
        return self.latest_version < 0


class TargetState(StrEnum):
    """What a pipeline's target holds, as far as a first load is concerned."""

    MISSING = "missing"
    EMPTY = "empty"
    FILLED = "filled"


def needs_first_load(state: str, ever_succeeded: bool) -> bool:
    """Whether a pipeline's next batch loads snapshots and creates its target.

    A missing target always does; an empty one only if the pipeline never succeeded (a
    pipeline whose output is legitimately empty is not reloaded forever).
    """
    return state == TargetState.MISSING or (state == TargetState.EMPTY and not ever_succeeded)


class ModeConfig(Protocol):
    """What the read-mode rule needs of an upstream's configuration."""

    @property
    def mode(self) -> str:
        """The configured read mode's name, such as ``auto``, ``cdf`` or ``snapshot``."""
        ...


def read_mode_of(upstream: ModeConfig, obs: Observation) -> ReadMode:
    """The mode a range of this upstream is read in, from its configured mode (``auto``,
    ``cdf``, ``append_only``, ``snapshot``, ``timestamp``) and its change data feed flag."""
    mode = upstream.mode
    if mode == "timestamp":
        return ReadMode.TIMESTAMP
    if mode == "snapshot":
        return ReadMode.SNAPSHOT
    if mode == "cdf" or (mode == "auto" and obs.cdf_enabled):
        return ReadMode.CDF
    return ReadMode.APPEND_ONLY


def recreation(obs: Observation, mark: Watermark | None) -> UpstreamRecreatedError | None:
    """The error when ``obs`` shows that the table was dropped and recreated since its
    committed watermark ``mark`` was set (see
    :func:`~watermark_dagster.core.planning.recreation_found`). None when the table still
    continues from the watermark, or nothing is committed."""
    if mark is None or obs.is_cursor or mark.committed_version is None:
        return None
    committed = mark.committed_version
    found = recreation_found(
        obs.latest_version,
        obs.table_id,
        floor=committed,
        reference=f"its committed watermark {committed}",
        expected_table_id=mark.table_id,
    )
    if found is None:
        return None
    return recreated_error(
        obs.upstream,
        found,
        "Nothing is planned for it or for the pipelines reading it.",
        versions=f"committed={committed}, latest={obs.latest_version}",
    )


@dataclass(frozen=True)
class RegistryObservation:
    """One look at every upstream a registry's pipelines read, ready for planning.

    Attributes:
        observed: upstream -> what was seen.
        errors: upstream -> why it cannot be planned (missing, not Delta, recreated, its
            next range unreadable).
        blocked: upstream -> the error of those among ``errors`` that stay blocked until an
            operator acts (the error's fix): dropped and recreated since their watermark
            was committed, or whose next range can no longer be read (see
            :meth:`with_blocked`).
        positions: where each observed upstream stands.
        runnable: pipeline -> upstreams, for pipelines whose upstreams were all observed.
        bootstrap: pipelines whose target is missing or empty (their next batch loads
            snapshots), among those whose upstreams all start from the beginning.
        overwrite: pipelines that replace their target on every run.
        pipeline_inputs: every registered pipeline -> the upstreams it reads (runnable or
            not); empty when not given (then nothing is :attr:`frozen`).
    """

    observed: Mapping[str, Observation]
    errors: Mapping[str, str]
    positions: tuple[UpstreamPosition, ...]
    runnable: Mapping[str, tuple[str, ...]]
    bootstrap: tuple[str, ...] = ()
    overwrite: tuple[str, ...] = ()
    marks: Mapping[str, Watermark] = field(default_factory=dict[str, Watermark])
    blocked: Mapping[str, TerminalError] = field(default_factory=dict[str, TerminalError])
    pipeline_inputs: Mapping[str, tuple[str, ...]] = field(
        default_factory=dict[str, tuple[str, ...]]
    )

    @property
    def frozen(self) -> frozenset[str]:
        """Upstreams that also feed a pipeline left out of ``runnable`` (another of its
        upstreams is unavailable or blocked): planned NOOP, so they do not advance past
        changes that pipeline has not applied (I1)."""
        return frozenset(
            u for p, ups in self.pipeline_inputs.items() if p not in self.runnable for u in ups
        )

    @property
    def table_ids(self) -> dict[str, str | None]:
        """Upstream -> table id (None for cursor upstreams)."""
        return {n: o.table_id or None for n, o in self.observed.items()}

    @property
    def schema_fingerprints(self) -> dict[str, str | None]:
        """Upstream -> schema fingerprint."""
        return {n: o.schema_fingerprint or None for n, o in self.observed.items()}

    @property
    def locations(self) -> dict[str, str | None]:
        """Upstream -> the location it was observed at (a catalog table's resolved one)."""
        return {n: o.path for n, o in self.observed.items()}

    @property
    def source_states(self) -> dict[str, str | None]:
        """Upstream -> source state of cursor upstreams."""
        return {n: o.state for n, o in self.observed.items() if o.is_cursor}

    def with_blocked(self, blocked: Mapping[str, TerminalError]) -> "RegistryObservation":
        """These observations with the upstreams of ``blocked`` refused as a recreated one
        is: nothing is planned for them or for the pipelines reading them. They stay in
        ``observed`` (their table was seen, its lag is real) and join ``errors`` and
        ``blocked``."""
        if not blocked:
            return self
        runnable = {p: ups for p, ups in self.runnable.items() if not blocked.keys() & set(ups)}
        return replace(
            self,
            errors={**self.errors, **{n: str(e) for n, e in blocked.items()}},
            positions=tuple(p for p in self.positions if p.name not in blocked),
            runnable=runnable,
            bootstrap=tuple(p for p in self.bootstrap if p in runnable),
            overwrite=tuple(p for p in self.overwrite if p in runnable),
            blocked={**self.blocked, **blocked},
        )

    def plan(self) -> Plan:
        """The plan these observations and committed positions give (for previews; the
        coordinator plans inside the store's compare-and-swap)."""
        return plan_from_committed(
            self.positions,
            self.marks,
            self.source_states,
            self.runnable,
            bootstrap=self.bootstrap,
            overwrite=self.overwrite,
            frozen=self.frozen,
        )


def version_committed_by(commits: Iterable[tuple[int, int]], when: datetime) -> int:
    """The newest version committed at or before ``when`` among ``commits`` (``(version,
    epoch milliseconds)`` pairs), -1 when the first commit came later: a start point
    "read from version 0 incrementally"."""
    found = version_at(commits, when)
    return -1 if found is None else found


class StartPoint(NamedTuple):
    """The committed position recorded for an upstream that does not start from the
    beginning: a version (-1: read from version 0 incrementally, no snapshot first) or a
    cursor position, and why."""

    version: int | None
    cursor: CursorPosition | None
    why: str


def starting_point(
    start: str | int | datetime,
    obs: Observation,
    now: datetime,
    version_by: Callable[[datetime], int],
) -> StartPoint | None:
    """Where an upstream with no committed watermark row starts, from its ``start_from``
    (None: from the beginning, nothing to record).

    Args:
        start: ``"beginning"``, ``"latest"``, a version or a timestamp.
        obs: what its observation found.
        now: the moment "latest" means for a cursor upstream.
        version_by: the newest version committed by a moment (see
            :func:`version_committed_by`); called only for a timestamp start.
    """
    if start == "beginning":
        return None
    if obs.is_cursor:
        when = now if start == "latest" else start
        if not isinstance(when, datetime):
            return None
        micros = int(when.timestamp() * 1_000_000)
        return StartPoint(None, (micros,), f"start_from={start!s}: rows after {when.isoformat()}")
    if start == "latest":
        latest = obs.latest_version
        return StartPoint(latest, None, f"start_from=latest: after v{latest}")
    if isinstance(start, int):
        v = min(start, obs.latest_version + 1) - 1
        return StartPoint(v, None, f"start_from={start}: read from version {v + 1}")
    if isinstance(start, datetime):
        v = version_by(start)
        return StartPoint(v, None, f"start_from={start.isoformat()}: read from version {v + 1}")
    return None
