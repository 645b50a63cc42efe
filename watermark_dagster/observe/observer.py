"""Observing upstream Delta tables without a JVM: the I/O side of an observation.

A local table with no new commit costs one listing of its ``_delta_log`` folder. When its
version moved, only the new commit files are read (:func:`~.log.replay_local_log`: the
protocol and metadata they set, the earlier ones carried forward); a table this process has
not seen yet is read from its newest checkpoint and the commits after it. delta-rs loads
the whole table only when the log alone cannot answer (a needed commit file is gone, no
usable checkpoint), for a protocol no delta-rs load has accepted yet in this process (so a
table delta-rs refuses is refused the same way), and for object stores. What the
observations mean (read modes, recreated tables, first loads, start points) is decided in
:mod:`watermark_dagster.core.observations`.
"""

import hashlib
import os
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime

from deltalake import DeltaTable, Schema
from deltalake.exceptions import DeltaError, TableNotFoundError

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.names import quote_table_name
from watermark_dagster.config.pipeline import Pipeline, WriteMode
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream, Upstream
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
from watermark_dagster.core.records import Watermark, WatermarkHow
from watermark_dagster.errors import (
    UpstreamRecreatedError,
    UpstreamUnavailableError,
    missing_table_error,
)
from watermark_dagster.observe.database_state import look_at
from watermark_dagster.observe.landing import observe_landing
from watermark_dagster.observe.landing_log import FileLog
from watermark_dagster.observe.log import (
    DeltaLog,
    Protocol,
    Snapshot,
    TableMetadata,
    is_local,
    latest_commit,
    latest_local_version,
    list_local_log,
    local_path,
    local_stamp,
    oldest_commit,
    replay_local_log,
)
from watermark_dagster.observe.warehouse_state import WarehouseLooks

DEFAULT_WORKERS = 4
"""Threads :meth:`Observer.observe_all` looks at object-store tables and cursor sources
with: they wait on storage, so a few threads hide its latency without crowding the sensor
daemon's other work."""


def _fingerprint(schema_json: str) -> str:
    return hashlib.sha256(schema_json.encode()).hexdigest()[:16]


def _log_schema_fingerprint(schema_string: str) -> str | None:
    """The fingerprint a delta-rs load gives a table whose log holds ``schema_string``: the
    schema parsed and serialized the way delta-rs does (None: delta-rs cannot parse it)."""
    try:
        return _fingerprint(Schema.from_json(schema_string).to_json())
    except ValueError:
        return None


def _cdf_enabled(configuration: Mapping[str, str]) -> bool:
    config = {k.lower(): v for k, v in configuration.items()}
    return str(config.get("delta.enablechangedatafeed", "false")).lower() == "true"


@dataclass(frozen=True)
class _Known:
    """The last observation of a table and the log snapshot it was made from."""

    snapshot: Snapshot
    observation: Observation


class Observer:
    """Observes upstreams, caching each table's snapshot and observation. Thread-safe: one
    observer is shared by the sensors of a code location.

    Args:
        workers: threads :meth:`observe_all` looks at object-store tables and cursor
            sources with.
        read_only: write nothing, for the commands that only show (``list``, ``get``,
            ``plan --dry-run``): a landing folder's new files count as numbered the way
            the coordinator's look would number them, and are not logged.
    """

    def __init__(self, *, workers: int = DEFAULT_WORKERS, read_only: bool = False) -> None:
        self.read_only = read_only
        self._known: dict[str, _Known] = {}
        # Protocols some delta-rs load of this process accepted: a replayed snapshot with
        # another protocol is checked by a load, which refuses what delta-rs cannot read.
        self._accepted: set[Protocol] = set()
        self._targets: dict[tuple[str, int], bool] = {}
        self._warehouses = WarehouseLooks()
        # Schema string -> fingerprint: many tables share a schema, and a table's schema
        # is carried forward through most commits.
        self._fingerprints: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._workers = max(1, workers)
        self._file_logs: dict[str, FileLog] = {}

    def file_log(self, upstream: LandingUpstream) -> FileLog:
        """The file log of a landing upstream, kept so a look reads only what changed."""
        with self._lock:
            log = self._file_logs.get(upstream.log_location)
            if log is None or log.upstream != upstream:
                log = self._file_logs[upstream.log_location] = FileLog(upstream)
            return log

    def target_state(self, pipeline: Pipeline) -> TargetState:
        """Whether the pipeline's target is missing, empty (no data file) or filled, for
        the first-load rule (cached per target version; a warehouse table is asked)."""
        if pipeline.warehouse is not None:
            return self._warehouses.state(pipeline.warehouse, pipeline.name)
        path = pipeline.target
        options = resolved_options(pipeline.storage_options)
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
        """A cursor upstream: its state is its Delta version and id, for a folder of files
        a fingerprint of their names, sizes and modification times, and for a database
        table its greatest position, with its columns as the schema fingerprint and its
        rows without a cursor value counted (:func:`.database_state.look_at`)."""
        path = upstream.path
        if isinstance(upstream, DatabaseUpstream):
            look = look_at(upstream)
            return Observation(
                upstream.name,
                path,
                -1,
                False,
                "",
                look.fingerprint,
                look.state,
                rows_without_cursor=look.without_cursor,
            )
        elif upstream.format == "delta":
            version = latest_local_version(path) if is_local(path) else None
            if version is None and is_local(path):
                raise self._unavailable(upstream, "no Delta log found there")
            if version is None:
                dt = DeltaTable(path, storage_options=resolved_options(upstream.storage_options))
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

    def observe(self, upstream: Upstream, *, floor: int | None = None) -> Observation:
        """Look at one upstream; ``floor`` is the highest version its control root pinned
        (a landing upstream's file log must hold at least that many files).

        Raises:
            UpstreamUnavailableError: the path does not exist or holds no Delta table, or
                no catalog table had the upstream's name when the code location loaded.
        """
        if upstream.table_parts is not None and not upstream.path.strip():
            # Named by catalog table, and the load found no table of that name
            # (watermark_dagster.runtime.catalog): blocked like a path that does not exist.
            raise missing_table_error(upstream.name, quote_table_name(upstream.table_parts))
        if isinstance(upstream, CursorUpstream):
            return self._observe_cursor(upstream)
        if isinstance(upstream, LandingUpstream):
            return observe_landing(
                upstream, self.file_log(upstream), record=not self.read_only, floor=floor
            )
        path = upstream.path
        if not is_local(path):
            return self._load(upstream, None)
        names = list_local_log(path)
        latest = latest_commit(names)
        if names is None or latest is None:
            raise self._unavailable(upstream, "no Delta log found there")
        # From this look's listing, cached observation or not: log cleanup removes old commit
        # files without a commit of its own.
        oldest = oldest_commit(names)
        with self._lock:
            known = self._known.get(path)
        if known is not None and known.snapshot.version == latest:
            if known.observation.oldest_version == oldest:
                return known.observation
            obs = replace(known.observation, oldest_version=oldest)
            with self._lock:
                self._known[path] = _Known(known.snapshot, obs)
            return obs
        snapshot = replay_local_log(path, names, known.snapshot if known else None)
        if snapshot is None:
            return self._load(upstream, None, oldest)
        with self._lock:
            accepted = snapshot.protocol in self._accepted
        schema_string = snapshot.metadata.schema_string
        if schema_string in self._fingerprints:
            fingerprint = self._fingerprints[schema_string]
        else:
            fingerprint = _log_schema_fingerprint(schema_string)
            with self._lock:
                self._fingerprints[schema_string] = fingerprint
        if not accepted or fingerprint is None:
            return self._load(upstream, snapshot, oldest)
        obs = Observation(
            upstream=upstream.name,
            path=path,
            latest_version=snapshot.version,
            cdf_enabled=_cdf_enabled(snapshot.metadata.configuration),
            table_id=snapshot.metadata.table_id,
            schema_fingerprint=fingerprint,
            oldest_version=oldest,
        )
        with self._lock:
            self._known[path] = _Known(snapshot, obs)
        return obs

    def observe_all(
        self, upstreams: Iterable[Upstream], floors: Mapping[str, int | None] | None = None
    ) -> dict[str, Observation | UpstreamUnavailableError]:
        """Look at many upstreams (``floors``: upstream -> the highest version its control
        root pinned, see :meth:`observe`).

        Local Delta tables are looked at in this thread: a look is a listing and a few small
        file reads, mostly Python work that threads would only contend for. The others
        (object stores, loaded whole by delta-rs; cursor sources) wait on storage, so they
        are looked at on up to ``workers`` threads.

        Returns:
            upstream name -> its observation, or the error saying why it is unavailable,
            in the order given.
        """
        upstreams = list(upstreams)
        floors = floors or {}

        def look(upstream: Upstream) -> Observation | UpstreamUnavailableError:
            return self._observe_or_error(upstream, floors.get(upstream.name))

        found: dict[str, Observation | UpstreamUnavailableError] = {}
        remote: list[Upstream] = []
        for upstream in upstreams:
            if isinstance(upstream, DeltaUpstream) and is_local(upstream.path):
                found[upstream.name] = look(upstream)
            else:
                remote.append(upstream)
        if len(remote) > 1 and self._workers > 1:
            with ThreadPoolExecutor(self._workers, thread_name_prefix="observe") as pool:
                looked = list(pool.map(look, remote))
        else:
            looked = [look(u) for u in remote]
        found.update(zip((u.name for u in remote), looked, strict=True))
        return {u.name: found[u.name] for u in upstreams}

    def _observe_or_error(
        self, upstream: Upstream, floor: int | None = None
    ) -> Observation | UpstreamUnavailableError:
        try:
            return self.observe(upstream, floor=floor)
        except UpstreamUnavailableError as e:
            return e

    def _load(
        self, upstream: Upstream, replayed: Snapshot | None, oldest: int | None = None
    ) -> Observation:
        """Observe by loading the table with delta-rs.

        Args:
            upstream: the upstream to load.
            replayed: the snapshot read from the log, if any; when the load finds the same
                version, delta-rs accepted its protocol, and later replays with that
                protocol need no load.
            oldest: the oldest commit the log listing found (None: not listed).
        """
        path = upstream.path
        try:
            dt = DeltaTable(path, storage_options=resolved_options(upstream.storage_options))
        except TableNotFoundError as e:
            raise self._unavailable(upstream, str(e).splitlines()[0]) from e
        except (DeltaError, OSError) as e:
            raise self._unavailable(upstream, f"{type(e).__name__}: {e}") from e
        metadata = dt.metadata()
        schema_json = dt.schema().to_json()
        configuration = dict(metadata.configuration or {})
        version = dt.version()
        p = dt.protocol()
        protocol = Protocol(
            p.min_reader_version,
            p.min_writer_version,
            None if p.reader_features is None else tuple(sorted(p.reader_features)),
            None if p.writer_features is None else tuple(sorted(p.writer_features)),
        )
        obs = Observation(
            upstream=upstream.name,
            path=path,
            latest_version=version,
            cdf_enabled=_cdf_enabled(configuration),
            table_id=str(metadata.id),
            schema_fingerprint=_fingerprint(schema_json),
            oldest_version=oldest,
        )
        stamp = local_stamp(path, version) if is_local(path) else None
        snapshot = Snapshot(
            version, protocol, TableMetadata(obs.table_id, schema_json, configuration), stamp
        )
        with self._lock:
            self._accepted.add(protocol)
            if replayed is not None and replayed.version == version:
                self._accepted.add(replayed.protocol)
            self._known[path] = _Known(snapshot, obs)
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
    reload: Collection[str] = (),
    pinned: Mapping[str, int] | None = None,
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
        reload: pipelines whose next batch reloads their target whatever it holds (see
            :func:`~watermark_dagster.core.reloads.reloads_due`), among those whose
            upstreams all start from the beginning.
        pinned: upstream -> the highest version an open batch pinned; with ``committed``,
            the floor a landing upstream's file log must reach (put back from an older
            copy, it is refused before it numbers a file).
    """
    marks = marks or {}
    observed: dict[str, Observation] = {}
    errors: dict[str, str] = {}
    blocked: dict[str, UpstreamRecreatedError] = {}
    pinned = pinned or {}
    consumed = registry.consumed_upstreams()
    # What each upstream's control root committed or pinned: a look that knows it numbers
    # a landing folder's new files (and refuses a file log put back from an older copy).
    floors = {u.name: max(committed.get(u.name) or 0, pinned.get(u.name, 0)) for u in consumed}
    for name, obs in observer.observe_all(consumed, floors).items():
        if isinstance(obs, UpstreamUnavailableError):
            errors[name] = str(obs)
            continue
        recreated = recreation(obs, marks.get(name))
        if recreated is not None:
            errors[name] = str(recreated)
            blocked[name] = recreated
            continue
        observed[name] = obs
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

    def set_by_hand(pipeline: str) -> bool:
        # Files 1..N of a landing upstream set by hand count as applied: a pipeline that
        # reads only such upstreams starts after them, its first load too, as with
        # start_from (a snapshot would load them). An owed reload still reads every file.
        return bool(runnable[pipeline]) and all(
            isinstance(registry.upstreams[u], LandingUpstream)
            and (mark := marks.get(u)) is not None
            and mark.how is WatermarkHow.MANUAL_SET
            for u in runnable[pipeline]
        )

    bootstrap = tuple(
        p
        for p in runnable
        if all(registry.upstreams[u].start_from == "beginning" for u in runnable[p])
        and (p in reload or (not set_by_hand(p) and first_load(p)))
    )
    overwrite = tuple(p for p in runnable if registry.pipelines[p].write is WriteMode.OVERWRITE)
    return RegistryObservation(
        observed,
        errors,
        positions,
        runnable,
        bootstrap,
        overwrite,
        dict(marks),
        blocked,
        registry.pipeline_inputs(),
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
