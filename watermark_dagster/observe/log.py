"""The one reader of a Delta table's ``_delta_log``: which commits exist, what one did.

Local paths (and ``file://`` URIs) are read with ``os`` directly: listing the log folder is
the cheap look that lets an observation with nothing new skip loading the table. Object
stores go through delta-rs' storage layer, which honours the table's storage options.
"""

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_LOG = "_delta_log"


def is_local(path: str) -> bool:
    """True for a path on this machine (a plain path or a ``file://`` URI)."""
    return "://" not in path or path.startswith("file://")


def local_path(path: str) -> str:
    """A local path without its ``file://`` scheme."""
    return path[len("file://") :] if path.startswith("file://") else path


def commit_file(version: int) -> str:
    """The log file of ``version``, relative to the table: ``_delta_log/<20 digits>.json``."""
    return f"{_LOG}/{version:020d}.json"


def latest_local_version(path: str) -> int | None:
    """Newest commit version in a local table's ``_delta_log`` (None if there is none).

    One directory listing, no file opened: the fast path of every observation.
    """
    latest = None
    try:
        with os.scandir(os.path.join(local_path(path), _LOG)) as entries:
            for entry in entries:
                m = _COMMIT_FILE.match(entry.name)
                if m:
                    v = int(m.group(1))
                    if latest is None or v > latest:
                        latest = v
    except FileNotFoundError:
        return None
    return latest


@dataclass(frozen=True)
class DeltaLog:
    """The commit log of the Delta table at ``path``.

    Attributes:
        path: the table's path or URI.
        storage_options: delta-rs storage options for an object store.
    """

    path: str
    storage_options: Mapping[str, str] | None = None

    @property
    def local(self) -> bool:
        """True when the table is on this machine."""
        return is_local(self.path)

    @cached_property
    def _store(self) -> pafs.PyFileSystem:
        options = dict(self.storage_options or {}) or None
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
        table = DeltaTable(self.path, storage_options=dict(self.storage_options or {}) or None)
        return [
            (int(h["version"]), int(h["timestamp"]))
            for h in table.history()
            if "version" in h and "timestamp" in h
        ]
