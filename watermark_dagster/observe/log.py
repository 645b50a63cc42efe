"""The one reader of a Delta table's ``_delta_log``: which commits exist, what one did.

Local paths (and ``file://`` URIs) are read with ``os`` directly: listing the log folder is
the cheap look that lets an observation with nothing new skip loading the table, and
:func:`replay_local_log` reads a table's protocol and metadata from only the commit files
it needs (those after a known snapshot, or after the newest checkpoint). Object stores go
through delta-rs' storage layer, which honours the table's storage options.
"""

import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler

from watermark_dagster.config.secrets import StorageOptions, resolved_options
from watermark_dagster.errors import RetryableError

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_LOG = "_delta_log"
# A single-file checkpoint. Multi-part and UUID-named (v2) checkpoints are not read here:
# a table whose only usable checkpoint is one of those is loaded with delta-rs instead.
_CHECKPOINT_SUFFIX = ".checkpoint.parquet"


def is_local(path: str) -> bool:
    """True for a path on this machine (a plain path or a ``file://`` URI)."""
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    """A local path without its ``file://`` scheme."""
    return path[len("file://") :] if path.startswith("file://") else path


def commit_file(version: int) -> str:
    """The log file of ``version``, relative to the table: ``_delta_log/<20 digits>.json``."""
    return f"{_LOG}/{version:020d}.json"


def list_local_log(path: str) -> list[str] | None:
    """The file names in a local table's ``_delta_log`` (None: there is no such folder).

    One directory listing, no file opened: the fast path of every observation.
    """
    try:
        return os.listdir(os.path.join(local_path(path), _LOG))
    except (FileNotFoundError, NotADirectoryError):
        return None


def _is_commit(name: str) -> bool:
    return len(name) == 25 and name.endswith(".json") and name[:20].isdigit()


def latest_commit(names: Sequence[str] | None) -> int | None:
    """The newest commit version among a log folder's file names (None: no commit)."""
    # Commit names are zero-padded to 20 digits, so the greatest name is the newest.
    newest = max((n for n in names or () if _is_commit(n)), default=None)
    return None if newest is None else int(newest[:20])


def oldest_commit(names: Sequence[str] | None) -> int | None:
    """The oldest commit version among a log folder's file names (None: no commit): the
    versions before it were removed by log cleanup, or never existed."""
    oldest = min((n for n in names or () if _is_commit(n)), default=None)
    return None if oldest is None else int(oldest[:20])


def latest_local_version(path: str) -> int | None:
    """Newest commit version in a local table's ``_delta_log`` (None if there is none).

    One directory listing, no file opened.
    """
    return latest_commit(list_local_log(path))


@dataclass(frozen=True)
class DeltaLog:
    """The commit log of the Delta table at ``path``.

    Attributes:
        path: the table's path or URI.
        storage_options: delta-rs storage options for an object store (environment
            references resolved when the log is opened).
    """

    path: str
    storage_options: StorageOptions | None = None

    @property
    def local(self) -> bool:
        """True when the table is on this machine."""
        return is_local(self.path)

    @cached_property
    def _store(self) -> pafs.PyFileSystem:
        options = resolved_options(self.storage_options)
        return pafs.PyFileSystem(DeltaStorageHandler(self.path, options))

    def versions(self) -> set[int]:
        """Every commit version whose commit file is in the log (empty: no log)."""
        if self.local:
            try:
                names = os.listdir(os.path.join(local_path(self.path), _LOG))
            except FileNotFoundError:
                return set()
        else:
            selector = pafs.FileSelector(_LOG, allow_not_found=True)
            names = [info.base_name for info in self._store.get_file_info(selector)]
        return {int(m.group(1)) for n in names if (m := _COMMIT_FILE.match(n))}

    def latest_version(self) -> int | None:
        """The newest commit version in the log (None: no commit)."""
        if self.local:
            return latest_local_version(self.path)
        return max(self.versions(), default=None)

    def missing(self, versions: Sequence[int]) -> list[int]:
        """Those of ``versions`` whose commit file is not in the log, in the given order.

        One listing of the log for a local table; one lookup per version on an object store
        (a long log is slower to list there than the few files asked about).
        """
        if self.local:
            present = self.versions()
            return [v for v in versions if v not in present]
        infos = self._store.get_file_info([commit_file(v) for v in versions])
        return [
            v
            for v, info in zip(versions, infos, strict=True)
            if info.type == pafs.FileType.NotFound
        ]

    def missing_files(self, paths: Sequence[str]) -> list[str]:
        """Those of the data or change files ``paths`` (as a commit names them: relative to
        the table and URL-encoded) that are not in storage, in the given order. One lookup
        per file; absolute paths (a shallow clone's) are not looked up."""
        relative = [p for p in paths if "://" not in p and not p.startswith("/")]
        if self.local:
            root = local_path(self.path)
            return [p for p in relative if not os.path.exists(os.path.join(root, unquote(p)))]
        infos = self._store.get_file_info([unquote(p) for p in relative])
        return [
            p
            for p, info in zip(relative, infos, strict=True)
            if info.type == pafs.FileType.NotFound
        ]

    def read(self, version: int) -> bytes | None:
        """The raw commit file of ``version`` (None: not in the log)."""
        try:
            if self.local:
                with open(os.path.join(local_path(self.path), commit_file(version)), "rb") as f:
                    return f.read()
            with self._store.open_input_stream(commit_file(version)) as stream:
                return stream.read()
        except FileNotFoundError:
            return None

    def actions(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of the commit ``version``, one dict per line (None: not in the log)."""
        raw = self.read(version)
        if raw is None:
            return None
        return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]

    def modified(self, version: int) -> datetime | None:
        """When the commit file of ``version`` was last written (None: unknown or gone)."""
        if self.local:
            try:
                st = os.stat(os.path.join(local_path(self.path), commit_file(version)))
            except FileNotFoundError:
                return None
            return datetime.fromtimestamp(st.st_mtime, tz=UTC)
        mtime = self._store.get_file_info(commit_file(version)).mtime
        if mtime is None:
            return None
        return mtime if mtime.tzinfo else mtime.replace(tzinfo=UTC)

    def history(self) -> list[tuple[int, int]]:
        """``(version, commit timestamp in epoch milliseconds)`` of every commit delta-rs
        reports (its history follows checkpoints, so it needs a table load)."""
        table = DeltaTable(self.path, storage_options=resolved_options(self.storage_options))
        return [
            (int(h["version"]), int(h["timestamp"]))
            for h in commit_history(table)
            if "version" in h and "timestamp" in h
        ]


# Reads of a history that another writer's commits keep overtaking, before giving up.
_HISTORY_READS = 10


class HistoryOvertakenError(RetryableError):
    """Commits kept landing while a table's history was read (its numbers were unsure)."""


def commit_history(
    table: DeltaTable, newest: int | None = None, *, after: int | None = None
) -> list[dict[str, Any]]:
    """``table``'s commits as delta-rs's history gives them (newest first), each numbered
    by its true ``version``: the newest ``newest`` at the table's loaded version and every
    commit since (all when None), or every one after the version ``after``. The table is
    left at the newest version they include.

    delta-rs numbers a history down from the version the table object was loaded at, but
    lists the commit files from there up to the newest: a commit made since the load would
    shift every number down by one (a label found at the wrong version). So the table is
    brought up to date after the history is read: when that finds a newer commit, the
    history is read again from there.

    Raises:
        HistoryOvertakenError: commits landed during each of ten reads.
    """
    version = table.version()
    if after is None and newest is not None:
        after = version - newest  # the window's floor stays put when the history is read again
    for _ in range(_HISTORY_READS):
        limit = None if after is None else max(0, version - after)
        commits = [dict(c) for c in table.history(limit)] if limit != 0 else []
        table.update_incremental()
        if table.version() == version:
            return commits
        version = table.version()
    raise HistoryOvertakenError(
        f"The Delta table at {table.table_uri} got new commits during each of "
        f"{_HISTORY_READS} reads of its history, so the versions of its commits are unsure.",
        fix="none needed: the work is retried; if the table is written this often all the "
        "time, report it.",
    )


# ------------------------------------------------------------------ protocol and metadata


@dataclass(frozen=True)
class Protocol:
    """A table's ``protocol`` action: the reader and writer versions and features it needs.

    Feature lists are sorted; ``None`` means the action had no such list.
    """

    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...] | None = None
    writer_features: tuple[str, ...] | None = None

    @classmethod
    def of(cls, action: Mapping[str, Any]) -> "Protocol":
        """From a ``protocol`` action as written in the log (commit JSON or checkpoint row)."""

        def features(key: str) -> tuple[str, ...] | None:
            values = action.get(key)
            return None if values is None else tuple(sorted(values))

        return cls(
            int(action["minReaderVersion"]),
            int(action["minWriterVersion"]),
            features("readerFeatures"),
            features("writerFeatures"),
        )


@dataclass(frozen=True)
class TableMetadata:
    """What an observation needs of a table's ``metaData`` action.

    Attributes:
        table_id: the table's id (a new one when the table is replaced or recreated).
        schema_string: the table's schema as the log stores it (Delta's JSON form).
        configuration: the table properties, as written.
    """

    table_id: str
    schema_string: str
    configuration: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, action: Mapping[str, Any]) -> "TableMetadata":
        """From a ``metaData`` action; a checkpoint stores the configuration map as pairs."""
        config = action.get("configuration") or {}
        if not isinstance(config, Mapping):
            config = dict(config)
        return cls(str(action["id"]), str(action["schemaString"]), dict(config))


@dataclass(frozen=True)
class FileStamp:
    """Which file a path held when it was read: device, inode, size, modification time.

    A table dropped and recreated at the same path has new commit files, so the stamp of
    the commit a snapshot was taken at tells whether that snapshot still describes the log.
    """

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> "FileStamp":
        """From an ``os.stat``/``os.fstat`` result."""
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class Snapshot:
    """A table's protocol and metadata as of one version.

    Attributes:
        version: the commit version they hold at.
        protocol: the protocol in force at ``version``.
        metadata: the metadata in force at ``version``.
        stamp: the commit file of ``version`` as it was read (None: not known, e.g. an
            object store); a later replay starts from this snapshot only if it matches.
    """

    version: int
    protocol: Protocol
    metadata: TableMetadata
    stamp: FileStamp | None = None


class ReplayCounts:
    """How many commit files and checkpoints replays have read in this process, for tests
    and the benchmark (mechanisms, not timings). Thread-safe."""

    def __init__(self) -> None:
        self.commits = 0
        self.checkpoints = 0
        self._lock = threading.Lock()

    def add(self, *, commits: int = 0, checkpoints: int = 0) -> None:
        """Count files read."""
        with self._lock:
            self.commits += commits
            self.checkpoints += checkpoints


REPLAY_COUNTS = ReplayCounts()


def local_stamp(path: str, version: int) -> FileStamp | None:
    """The stamp of a local table's commit file ``version`` (None: the file is gone)."""
    try:
        return FileStamp.of(os.stat(os.path.join(local_path(path), commit_file(version))))
    except FileNotFoundError:
        return None


def _commit_actions(
    root: str, version: int
) -> tuple[Protocol | None, TableMetadata | None, FileStamp] | None:
    """The protocol and metadata a local commit file sets (None each if it sets neither),
    with the file's stamp; None if the file is gone."""
    try:
        with open(os.path.join(root, commit_file(version)), "rb") as f:
            stamp = FileStamp.of(os.fstat(f.fileno()))
            raw = f.read()
    except FileNotFoundError:
        return None
    REPLAY_COUNTS.add(commits=1)
    protocol = metadata = None
    # Most commits only add and remove files: parse just the lines that can hold one of
    # the two actions (every action is one JSON object on its own line).
    if b'"protocol"' not in raw and b'"metaData"' not in raw:
        return None, None, stamp
    for line in raw.splitlines():
        if b'"protocol"' not in line and b'"metaData"' not in line:
            continue
        action = json.loads(line)
        if "protocol" in action:
            protocol = Protocol.of(action["protocol"])
        if "metaData" in action:
            metadata = TableMetadata.of(action["metaData"])
    return protocol, metadata, stamp


def _checkpoint_actions(root: str, version: int) -> tuple[Protocol, TableMetadata] | None:
    """The protocol and metadata a single-file checkpoint holds (None: unreadable)."""
    try:
        # ParquetFile rather than read_table: no dataset discovery, about 3x cheaper here.
        with pq.ParquetFile(os.path.join(root, _LOG, f"{version:020d}{_CHECKPOINT_SUFFIX}")) as f:
            table = f.read(columns=["protocol", "metaData"])
    except (OSError, pa.ArrowException, KeyError):
        return None
    REPLAY_COUNTS.add(checkpoints=1)
    found: dict[str, Any] = {}
    for name in ("protocol", "metaData"):
        column = table.column(name)
        rows = column.filter(column.is_valid())
        if len(rows) != 1:  # a checkpoint holds exactly one of each
            return None
        found[name] = rows[0].as_py()
    return Protocol.of(found["protocol"]), TableMetadata.of(found["metaData"])


def _replay_from(
    root: str,
    present: set[int],
    latest: int,
    base: int,
    protocol: Protocol | None,
    metadata: TableMetadata | None,
) -> Snapshot | None:
    """The snapshot at ``latest`` from the state at ``base`` (nothing at -1) and the commit
    files after it, read newest first until both actions are found."""
    if any(v not in present for v in range(base + 1, latest + 1)):
        return None
    new_protocol = new_metadata = None
    stamp = None
    for v in range(latest, base, -1):
        read = _commit_actions(root, v)
        if read is None:  # removed since the listing
            return None
        p, m, s = read
        stamp = stamp or s
        new_protocol, new_metadata = new_protocol or p, new_metadata or m
        if new_protocol is not None and new_metadata is not None:
            break
    protocol, metadata = new_protocol or protocol, new_metadata or metadata
    if stamp is None:  # the base is the newest commit itself (a checkpoint at ``latest``)
        stamp = local_stamp(root, latest)
    if protocol is None or metadata is None or stamp is None:
        return None
    return Snapshot(latest, protocol, metadata, stamp)


def replay_local_log(
    path: str, names: Sequence[str], since: Snapshot | None = None
) -> Snapshot | None:
    """A local table's protocol and metadata at its newest commit, read from the log alone.

    From ``since`` when its commit file is still the one it was taken from (only the
    commits after it are read, newest first, stopping once both a protocol and a metadata
    action are found; a commit with neither carries the earlier ones forward); otherwise
    from the newest single-file checkpoint and the commits after it, or from every commit
    when there is no checkpoint.

    Args:
        path: the table's local path.
        names: the file names of its ``_delta_log`` (one :func:`list_local_log`).
        since: a snapshot taken earlier at a lower version.

    Returns:
        The snapshot, or None when the log alone cannot give it (a needed commit file is
        gone, a checkpoint is unreadable or not single-file): load the table instead.
    """
    root = local_path(path)
    latest = latest_commit(names)
    if latest is None:
        return None
    present = {int(n[:20]) for n in names if _is_commit(n)}
    if (
        since is not None
        and since.version < latest
        and since.stamp is not None
        and local_stamp(path, since.version) == since.stamp
    ):
        return _replay_from(root, present, latest, since.version, since.protocol, since.metadata)
    checkpoints = [
        int(n[:20])
        for n in names
        if len(n) == 20 + len(_CHECKPOINT_SUFFIX)
        and n.endswith(_CHECKPOINT_SUFFIX)
        and n[:20].isdigit()
    ]
    checkpoint = max((v for v in checkpoints if v <= latest), default=None)
    if checkpoint is None:
        return _replay_from(root, present, latest, -1, None, None)
    actions = _checkpoint_actions(root, checkpoint)
    if actions is None:
        return None
    return _replay_from(root, present, latest, checkpoint, *actions)
