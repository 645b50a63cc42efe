"""Observing upstream Delta tables without a JVM: the I/O side of an observation.

A table with no new commit costs one listing of its ``_delta_log`` folder (local paths);
only when the version moved is the table loaded with delta-rs to read its metadata (CDF
flag, table id, schema fingerprint), and the result is cached per version. What the
observations mean (read modes, recreated tables, first loads, start points) is decided
in :mod:`watermark_dagster.core.observations`.
"""

import hashlib
import os
import threading
from collections.abc import Callable, Mapping
from datetime import datetime

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from watermark_dagster.config.pipeline import Pipeline, WriteMode
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import CursorUpstream, Upstream
from watermark_dagster.core.observations import (
    Observation,
    RegistryObservation,
    StartPoint,
    TargetState,
    needs_first_load,
    read_mode_of,
    recreation,
    starting_point,
    version_committed_by,
)
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.core.records import Watermark
from watermark_dagster.errors import UpstreamRecreatedError, UpstreamUnavailableError
from watermark_dagster.observe.log import DeltaLog, is_local, latest_local_version, local_path


class Observer:
    """Observes upstreams, caching metadata per (path, version). Thread-safe."""

    def __init__(self) -> None:
        self._cache: dict[str, Observation] = {}
        self._targets: dict[tuple[str, int], bool] = {}
        self._lock = threading.Lock()

    def target_state(self, pipeline: Pipeline) -> TargetState:
        """Whether the pipeline's target is missing, empty (no data file) or filled, for
        the first-load rule (cached per target version)."""
        path = pipeline.target
        options = dict(pipeline.storage_options or {}) or None
        if is_local(path):
            version = latest_local_version(path)
            if version is None:
                return TargetState.MISSING
            with self._lock:
                known = self._targets.get((path, version))
            if known is not None:
                return TargetState.EMPTY if known else TargetState.FILLED
        try:
            dt = DeltaTable(path, storage_options=options)
        except TableNotFoundError:
            return TargetState.MISSING
        empty = len(dt.file_uris()) == 0
        with self._lock:
            self._targets[(path, dt.version())] = empty
        return TargetState.EMPTY if empty else TargetState.FILLED

    def _observe_cursor(self, upstream: CursorUpstream) -> Observation:
        """A cursor upstream: its state is its Delta version and id, or for a folder of
        files a fingerprint of their names, sizes and modification times."""
        path = upstream.path
        if upstream.format == "delta":
            version = latest_local_version(path) if is_local(path) else None
            if version is None and is_local(path):
                raise self._unavailable(upstream, "no Delta log found there")
            if version is None:
                dt = DeltaTable(path, storage_options=dict(upstream.storage_options or {}) or None)
                version = dt.version()
            state = f"v{version}"
        elif is_local(path):
            root = local_path(path)
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
        if isinstance(upstream, CursorUpstream):
            return self._observe_cursor(upstream)
        path = upstream.path
        if is_local(path):
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


def observe_registry(
    registry: Registry,
    observer: Observer,
    committed: Mapping[str, int | None],
    *,
    marks: Mapping[str, Watermark] | None = None,
    ever_succeeded: Callable[[str], bool] = lambda _pipeline: False,
) -> RegistryObservation:
    """Observe the consumed upstreams; unavailable ones are reported in ``errors`` and the
    pipelines reading them are left out of ``runnable`` (nothing is planned for them).

    Args:
        registry: the upstreams and the pipelines that read them.
        observer: reads each upstream's table (Delta log or cursor source).
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

    def first_load(pipeline: str) -> bool:
        state = observer.target_state(registry.pipelines[pipeline])
        # Only an empty target needs to know whether the pipeline ever succeeded (a read
        # of the checkpoints), so a tick asks it for no pipeline in the usual case.
        return needs_first_load(state, state == TargetState.EMPTY and ever_succeeded(pipeline))

    bootstrap = tuple(
        p
        for p in runnable
        if all(registry.upstreams[u].start_from == "beginning" for u in runnable[p])
        and first_load(p)
    )
    overwrite = tuple(p for p in runnable if registry.pipelines[p].write is WriteMode.OVERWRITE)
    return RegistryObservation(
        observed, errors, positions, runnable, bootstrap, overwrite, dict(marks), blocked
    )


def starting_points(
    registry: Registry, look: RegistryObservation, now: datetime
) -> dict[str, StartPoint]:
    """Committed positions to record for upstreams that start somewhere other than the
    beginning and have no committed watermark row yet (see
    :func:`~watermark_dagster.core.observations.starting_point`).

    Returns:
        upstream -> ``(version, cursor position, explanation)``; a version of -1 means
        "read from version 0 incrementally" (no snapshot first).
    """
    points: dict[str, StartPoint] = {}
    for name, obs in look.observed.items():
        if name in look.marks:
            continue
        upstream = registry.upstreams[name]
        log = DeltaLog(upstream.path, upstream.storage_options)
        point = starting_point(
            upstream.start_from,
            obs,
            now,
            lambda when, log=log: version_committed_by(log.history(), when),
        )
        if point is not None:
            points[name] = point
    return points
