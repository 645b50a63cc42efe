"""Observing upstream Delta tables without a JVM.

A table with no new commit costs one listing of its ``_delta_log`` folder (local paths);
only when the version moved is the table loaded with delta-rs to read its metadata (CDF
flag, table id, schema fingerprint), and the result is cached per version.
"""

import hashlib
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from watermark_dagster.config.pipeline import Pipeline, WriteMode
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import Upstream, UpstreamMode
from watermark_dagster.core.commits import version_at
from watermark_dagster.core.planning import Plan, UpstreamPosition, plan_batch, with_committed
from watermark_dagster.core.ranges import ReadMode
from watermark_dagster.errors import (
    UpstreamRecreatedError,
    UpstreamUnavailableError,
    recreated_error,
)

if TYPE_CHECKING:
    from watermark_dagster.core.records import Watermark

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True)
class Observation:
    """What one look at an upstream found."""

    upstream: str
    path: str
    latest_version: int
    cdf_enabled: bool
    table_id: str
    schema_fingerprint: str
    state: str | None = None

    @property
    def is_cursor(self) -> bool:
        """True for a cursor upstream (no versions: ``latest_version`` is -1)."""
        return self.latest_version < 0


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local_path(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def latest_local_version(path: str) -> int | None:
    """Newest commit version in a local table's ``_delta_log`` (None if there is none)."""
    latest = None
    try:
        with os.scandir(os.path.join(_local_path(path), "_delta_log")) as entries:
            for entry in entries:
                m = _COMMIT_FILE.match(entry.name)
                if m:
                    v = int(m.group(1))
                    if latest is None or v > latest:
                        latest = v
    except FileNotFoundError:
        return None
    return latest


class Observer:
    """Observes upstreams, caching metadata per (path, version). Thread-safe."""

    def __init__(self) -> None:
        self._cache: dict[str, Observation] = {}
        self._targets: dict[tuple[str, int], bool] = {}
        self._lock = threading.Lock()

    def target_state(self, pipeline: Pipeline) -> str:
        """``missing``, ``empty`` (no data file) or ``filled``: whether the pipeline's
        target needs a first load (cached per target version)."""
        path = pipeline.target
        options = dict(pipeline.storage_options or {}) or None
        if _is_local(path):
            version = latest_local_version(path)
            if version is None:
                return "missing"
            with self._lock:
                known = self._targets.get((path, version))
            if known is not None:
                return "empty" if known else "filled"
        try:
            dt = DeltaTable(path, storage_options=options)
        except TableNotFoundError:
            return "missing"
        empty = len(dt.file_uris()) == 0
        with self._lock:
            self._targets[(path, dt.version())] = empty
        return "empty" if empty else "filled"

    def _observe_cursor(self, upstream: Upstream) -> Observation:
        """A cursor upstream: its state is its Delta version and id, or for a folder of
        files a fingerprint of their names, sizes and modification times."""
        path = upstream.path
        if upstream.format == "delta":
            version = latest_local_version(path) if _is_local(path) else None
            if version is None and _is_local(path):
                raise self._unavailable(upstream, "no Delta log found there")
            if version is None:
                dt = DeltaTable(path, storage_options=dict(upstream.storage_options or {}) or None)
                version = dt.version()
            state = f"v{version}"
        elif _is_local(path):
            root = _local_path(path)
            if not os.path.exists(root):
                raise self._unavailable(upstream, "the path does not exist")
            digest = hashlib.sha256()
            for folder, dirs, files in sorted(os.walk(root)):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                for name in sorted(files):
                    if name.startswith((".", "_")):
                        continue
                    st = os.stat(os.path.join(folder, name))
                    rel = os.path.relpath(os.path.join(folder, name), root)
                    digest.update(f"{rel}|{st.st_size}|{st.st_mtime_ns}\n".encode())
            state = digest.hexdigest()[:24]
        else:
            # No cheap listing here: read every time (the window decides what is new).
            state = None
        return Observation(upstream.name, path, -1, False, "", "", state)

    def observe(self, upstream: Upstream) -> Observation:
        """Look at one upstream.

        Raises:
            UpstreamUnavailableError: the path does not exist or holds no Delta table.
        """
        if upstream.is_cursor:
            return self._observe_cursor(upstream)
        path = upstream.path
        if _is_local(path):
            version = latest_local_version(path)
            if version is None:
                raise self._unavailable(upstream, "no Delta log found there")
            with self._lock:
                cached = self._cache.get(path)
            if cached is not None and cached.latest_version == version:
                return cached
        try:
            dt = DeltaTable(path, storage_options=dict(upstream.storage_options or {}) or None)
        except TableNotFoundError as e:
            raise self._unavailable(upstream, str(e).splitlines()[0]) from e
        except (DeltaError, OSError) as e:
            raise self._unavailable(upstream, f"{type(e).__name__}: {e}") from e
        metadata = dt.metadata()
        config = {k.lower(): v for k, v in (metadata.configuration or {}).items()}
        fingerprint = hashlib.sha256(dt.schema().to_json().encode()).hexdigest()[:16]
        obs = Observation(
            upstream=upstream.name,
            path=path,
            latest_version=dt.version(),
            cdf_enabled=str(config.get("delta.enablechangedatafeed", "false")).lower() == "true",
            table_id=str(metadata.id),
            schema_fingerprint=fingerprint,
        )
        with self._lock:
            self._cache[path] = obs
        return obs

    @staticmethod
    def _unavailable(upstream: Upstream, why: str) -> UpstreamUnavailableError:
        return UpstreamUnavailableError(
            f"Upstream '{upstream.name}' at {upstream.path!r} is not a readable Delta table "
            f"({why}).",
            upstream=upstream.name,
            fix="check the path in the registry, or create the table; nothing is planned for "
            "it until then.",
        )


def recreation(obs: Observation, mark: "Watermark | None") -> UpstreamRecreatedError | None:
    """The error when ``obs`` shows that the table was dropped and recreated since its
    committed watermark ``mark`` was set: its table id changed (``CREATE OR REPLACE``,
    a drop and a new table at the path, with any number of versions), or it has fewer
    versions than the watermark. None when the table still continues from the watermark,
    or nothing is committed."""
    if mark is None or obs.is_cursor or mark.committed_version is None:
        return None
    committed = mark.committed_version
    versions = f"committed={committed}, latest={obs.latest_version}"
    consequence = "Nothing is planned for it or for the pipelines reading it."
    if mark.table_id and obs.table_id and mark.table_id != obs.table_id:
        return recreated_error(
            obs.upstream,
            f"its table id is {obs.table_id}, but its committed watermark {committed} was set "
            f"on table {mark.table_id}",
            consequence,
            versions=versions,
        )
    if obs.latest_version < committed:
        return recreated_error(
            obs.upstream,
            f"it is at version {obs.latest_version}, below its committed watermark {committed}",
            consequence,
            versions=versions,
        )
    return None


def read_mode_of(upstream: Upstream, obs: Observation) -> ReadMode:
    """The mode a range of this upstream is read in, from its configuration and its
    change data feed flag."""
    mode = upstream.mode
    if mode is UpstreamMode.TIMESTAMP:
        return ReadMode.TIMESTAMP
    if mode is UpstreamMode.SNAPSHOT:
        return ReadMode.SNAPSHOT
    if mode is UpstreamMode.CDF or (mode is UpstreamMode.AUTO and obs.cdf_enabled):
        return ReadMode.CDF
    return ReadMode.APPEND_ONLY


@dataclass(frozen=True)
class RegistryObservation:
    """One look at every upstream a registry's pipelines read, ready for planning.

    Attributes:
        observed: upstream -> what was seen.
        errors: upstream -> why it cannot be planned (missing, not Delta, recreated).
        blocked: upstream -> the error of those among ``errors`` that were dropped and
            recreated since their watermark was committed: they stay blocked until an
            operator resets them (the error's fix).
        positions: where each observed upstream stands.
        runnable: pipeline -> upstreams, for pipelines whose upstreams were all observed.
        bootstrap: pipelines whose target is missing or empty (their next batch loads
            snapshots), among those whose upstreams all start from the beginning.
        overwrite: pipelines that replace their target on every run.
    """

    observed: Mapping[str, Observation]
    errors: Mapping[str, str]
    positions: tuple[UpstreamPosition, ...]
    runnable: Mapping[str, tuple[str, ...]]
    bootstrap: tuple[str, ...] = ()
    overwrite: tuple[str, ...] = ()
    marks: Mapping[str, "Watermark"] = field(default_factory=dict)
    blocked: Mapping[str, UpstreamRecreatedError] = field(default_factory=dict)

    @property
    def table_ids(self) -> dict[str, str | None]:
        """upstream -> table id (None for cursor upstreams)."""
        return {n: o.table_id or None for n, o in self.observed.items()}

    @property
    def schema_fingerprints(self) -> dict[str, str | None]:
        """upstream -> schema fingerprint."""
        return {n: o.schema_fingerprint or None for n, o in self.observed.items()}

    @property
    def source_states(self) -> dict[str, str | None]:
        """upstream -> source state of cursor upstreams."""
        return {n: o.state for n, o in self.observed.items() if o.is_cursor}

    def plan(self) -> Plan:
        """The plan these observations and committed positions give (for previews; the
        coordinator plans inside the store's compare-and-swap)."""
        positions = [
            with_committed(p, self.marks.get(p.name), self.source_states.get(p.name))
            for p in self.positions
        ]
        return plan_batch(
            positions, self.runnable, bootstrap=self.bootstrap, overwrite=self.overwrite
        )


def observe_registry(
    registry: Registry,
    observer: Observer,
    committed: Mapping[str, int | None],
    *,
    marks: Mapping[str, "Watermark"] | None = None,
    ever_succeeded: Callable[[str], bool] = lambda _pipeline: False,
) -> RegistryObservation:
    """Observe the consumed upstreams; unavailable ones are reported in ``errors`` and the
    pipelines reading them are left out of ``runnable`` (nothing is planned for them).

    Args:
        committed: upstream -> committed version.
        marks: the committed watermark rows; with them an upstream whose table id differs
            from the one its watermark was committed on (dropped and recreated) is reported
            in ``errors`` instead of being planned.
        ever_succeeded: whether a pipeline succeeded on some batch before. A missing
            target always needs a first load; an empty one only if the pipeline never ran
            (a pipeline whose output is legitimately empty is not reloaded forever).
    """
    marks = marks or {}
    observed: dict[str, Observation] = {}
    errors: dict[str, str] = {}
    blocked: dict[str, UpstreamRecreatedError] = {}
    for upstream in registry.consumed_upstreams():
        try:
            obs = observer.observe(upstream)
        except UpstreamUnavailableError as e:
            errors[upstream.name] = str(e)
            continue
        recreated = recreation(obs, marks.get(upstream.name))
        if recreated is not None:
            errors[upstream.name] = str(recreated)
            blocked[upstream.name] = recreated
            continue
        observed[upstream.name] = obs
    positions = tuple(
        UpstreamPosition(
            name=name,
            latest_version=obs.latest_version,
            committed_version=committed.get(name),
            max_versions_per_batch=registry.upstreams[name].max_versions_per_batch,
            mode=read_mode_of(registry.upstreams[name], obs),
        )
        for name, obs in observed.items()
    )
    runnable = {
        p: ups for p, ups in registry.pipeline_inputs().items() if all(u in observed for u in ups)
    }
    bootstrap = tuple(
        p
        for p in runnable
        if all(registry.upstreams[u].start_from == "beginning" for u in runnable[p])
        and _needs_first_load(observer.target_state(registry.pipelines[p]), p, ever_succeeded)
    )
    overwrite = tuple(p for p in runnable if registry.pipelines[p].write is WriteMode.OVERWRITE)
    return RegistryObservation(
        observed, errors, positions, runnable, bootstrap, overwrite, dict(marks), blocked
    )


def _needs_first_load(state: str, pipeline: str, ever_succeeded: Callable[[str], bool]) -> bool:
    return state == "missing" or (state == "empty" and not ever_succeeded(pipeline))


def version_committed_by(upstream: Upstream, when: datetime) -> int:
    """The newest version committed at or before ``when`` (-1: none; the first commit
    came later), with commit timestamps made monotonic as Delta's time travel does."""
    dt = DeltaTable(upstream.path, storage_options=dict(upstream.storage_options or {}) or None)
    commits = [
        (int(h["version"]), int(h["timestamp"]))
        for h in dt.history()
        if "version" in h and "timestamp" in h
    ]
    found = version_at(commits, when)
    return -1 if found is None else found


def starting_points(
    registry: Registry, look: RegistryObservation, now: datetime
) -> dict[str, tuple[int | None, tuple | None, str]]:
    """Committed positions to record for upstreams that start somewhere other than the
    beginning and have no committed watermark row yet.

    Returns:
        upstream -> ``(version, cursor position, explanation)``; a version of -1 means
        "read from version 0 incrementally" (no snapshot first).
    """
    points: dict[str, tuple[int | None, tuple | None, str]] = {}
    for name, obs in look.observed.items():
        upstream = registry.upstreams[name]
        start = upstream.start_from
        if start == "beginning" or name in look.marks:
            continue
        if obs.is_cursor:
            when = now if start == "latest" else start
            if not isinstance(when, datetime):
                continue
            micros = int(when.timestamp() * 1_000_000)
            points[name] = (None, (micros,), f"start_from={start!s}: rows after {when.isoformat()}")
        elif start == "latest":
            points[name] = (
                obs.latest_version,
                None,
                f"start_from=latest: after v{obs.latest_version}",
            )
        elif isinstance(start, int):
            v = min(start, obs.latest_version + 1) - 1
            points[name] = (v, None, f"start_from={start}: read from version {v + 1}")
        elif isinstance(start, datetime):
            v = version_committed_by(upstream, start)
            points[name] = (v, None, f"start_from={start.isoformat()}: read from version {v + 1}")
    return points
