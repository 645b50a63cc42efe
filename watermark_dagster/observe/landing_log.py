"""A landing upstream's file log: every file it ever took, numbered once, in a Delta table.

The log is the landing folder's version history. A file is appended to it, with the next
number, its size and its modification time, the first time a look sees it settled; it is
never renumbered, rewritten or removed. The numbers are the upstream's versions: a batch
pins the inclusive range of numbers it loads exactly as it pins Delta versions, inside the
plan's own atomic commit, so the log needs no batch id and holds nothing a crash could
leave half-pinned (a file logged by a look that died before planning is simply the next
plan's). Appends are compare-and-swap commits (delta-rs' own retries off): two looks at
once cannot give two files one number, or one file two numbers.

A file is known by its path, size and modification time. A new path with the size and
modification time of a logged file that is gone from its logged path is that file moved
(to an archive prefix the pattern takes, or a writer's ``x.tmp`` renamed ``x.csv``): the
log refuses it, so its rows are never loaded a second time under a new number.

Reads cost what changed: a look at a local log whose version did not move lists its
``_delta_log`` folder and reads no row (:attr:`FileLog.rows_read` counts the rows read).
"""

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.schema import Field, PrimitiveType

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.errors import (
    CommitConflictError,
    LandingFileChangedError,
    LandingLogBehindError,
    UpstreamUnavailableError,
    reset_command,
)
from watermark_dagster.observe.landing_files import (
    FileStat,
    content_digests,
    stat_files,
    with_digests,
)
from watermark_dagster.observe.log import is_local, latest_local_version

LOG_SCHEMA = pa.schema(
    [
        pa.field("ordinal", pa.int64(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("mtime_ns", pa.int64(), nullable=False),
        pa.field("logged_at", pa.timestamp("us", tz="UTC"), nullable=False),
        # A digest of the content's ends, for files on an object store (content_digests).
        pa.field("digest", pa.string()),
    ]
)
_COLUMNS = ["ordinal", "path", "size", "mtime_ns", "digest"]
_CAS = CommitProperties(max_commit_retries=0)
_ATTEMPTS = 30


@dataclass(frozen=True)
class LoggedFile:
    """One file as the log recorded it: its number (from 1), its path relative to the
    landing folder, its size in bytes and its modification time (ns since the epoch)."""

    ordinal: int
    path: str
    size: int
    mtime_ns: int
    digest: str | None = None

    @property
    def mtime(self) -> datetime:
        """The modification time recorded, in UTC."""
        return datetime.fromtimestamp(self.mtime_ns / 1e9, UTC)


@dataclass(frozen=True)
class LogState:
    """The whole log as of one version: its table id and every file, by path."""

    table_id: str
    version: int
    by_path: Mapping[str, LoggedFile] = field(default_factory=dict[str, LoggedFile])

    @property
    def latest(self) -> int:
        """The highest file number (0: no file logged yet; numbers have no gaps)."""
        return max((f.ordinal for f in self.by_path.values()), default=0)


def _files(table: pa.Table) -> list[LoggedFile]:
    return [
        LoggedFile(
            int(r["ordinal"]), str(r["path"]), int(r["size"]), int(r["mtime_ns"]), r.get("digest")
        )
        for r in table.select([c for c in _COLUMNS if c in table.column_names]).to_pylist()
    ]


def _columns(dt: DeltaTable) -> list[str]:
    """The log's columns to read: a log written before digests has none."""
    have = {f.name for f in dt.schema().fields}
    return [c for c in _COLUMNS if c in have]


class FileLog:
    """The file log of one landing upstream (a Delta table at its ``log_location``)."""

    def __init__(self, upstream: LandingUpstream) -> None:
        self.upstream = upstream
        self.uri = upstream.log_location
        self.options = resolved_options(upstream.storage_options, upstream.owner)
        self.rows_read = 0
        self._state: LogState | None = None
        self._undigested: set[int] = set()
        self._lock = threading.Lock()

    @property
    def table_name(self) -> str:
        """The name the log's Delta table is created with: it says whose log it is."""
        return f"watermark_files_{self.upstream.name}"

    def _open(self, *, create: bool) -> DeltaTable | None:
        try:
            return self._owned(DeltaTable(self.uri, storage_options=self.options))
        except TableNotFoundError:
            if not create:
                return None
        try:
            DeltaTable.create(
                self.uri,
                LOG_SCHEMA,
                mode="ignore",
                name=self.table_name,
                storage_options=self.options,
            )
        except DeltaError:
            if not DeltaTable.is_deltatable(self.uri, storage_options=self.options):
                raise
        return self._owned(DeltaTable(self.uri, storage_options=self.options))

    def _owned(self, dt: DeltaTable) -> DeltaTable:
        """``dt`` when it is this upstream's log.

        Raises:
            UpstreamUnavailableError: it is another upstream's log (two upstreams over one
                folder both default to ``<folder>/_watermark_files``): numbered in one log,
                each upstream's batches would read the other's files in its own format.
        """
        name = dt.metadata().name
        if name is None or name == self.table_name:
            return dt
        owner = name.removeprefix("watermark_files_")
        raise UpstreamUnavailableError(
            f"{self.upstream.owner}: its file log {self.uri} is the file log of upstream "
            f"'{owner}' (its table is named {name!r}): two upstreams numbering files in one "
            "log would each read the other's files. Nothing is logged or read.",
            upstream=self.upstream.name,
            fix=f"give '{self.upstream.name}' its own files_log (a folder of its own, e.g. "
            f"{self.upstream.path.rstrip('/')}/_watermark_files_{self.upstream.name}), or, "
            f"if '{owner}' was renamed '{self.upstream.name}', move its log aside and run "
            f"`watermark reset -t {self.upstream.name}` (every file there loads again).",
        )

    def state(self, *, create: bool = True) -> LogState | None:
        """Every file logged, reread only when the log's version moved (None: there is no
        log yet and ``create`` is False)."""
        with self._lock:
            cached = self._state
        if (
            cached is not None
            and is_local(self.uri)
            and latest_local_version(self.uri) == cached.version
        ):
            return cached
        dt = self._open(create=create)
        if dt is None:
            return None
        return self._load(dt)

    def _load(self, dt: DeltaTable) -> LogState:
        with self._lock:
            cached = self._state
        if cached is not None and cached.version == dt.version():
            return cached
        table = dt.to_pyarrow_table(columns=_columns(dt))
        self.rows_read += table.num_rows
        state = LogState(str(dt.metadata().id), dt.version(), {f.path: f for f in _files(table)})
        with self._lock:
            self._state = state
        return state

    def register(self, candidates: Sequence[FileStat], *, floor: int) -> LogState:
        """Append the files of ``candidates`` that the log does not hold, numbered after
        the last one (older modification times first), in one compare-and-swap commit.
        ``floor`` is the highest file number the control root committed or pinned: a log
        holding fewer (put back from an older copy) numbers nothing.

        Raises:
            LandingLogBehindError: the log holds fewer files than ``floor``.
            CommitConflictError: other writers kept winning the commit.
            LandingFileChangedError: a candidate is a logged file moved to a new path
                (nothing is logged).
        """
        for attempt in range(_ATTEMPTS):
            dt = self._open(create=True)
            assert dt is not None
            state = self._load(dt)
            refuse_log_behind(self.upstream, self, state, floor)
            new = sorted(
                (c for c in candidates if c.path not in state.by_path),
                key=lambda c: (c.mtime_ns, c.path),
            )
            if not new:
                return state
            new = with_digests(self.upstream, new)
            refuse_moves(self.upstream, state, new)
            first = state.latest + 1
            now = datetime.now(UTC)
            rows = pa.Table.from_pylist(
                [
                    {
                        "ordinal": first + i,
                        "path": f.path,
                        "size": f.size,
                        "mtime_ns": f.mtime_ns,
                        "logged_at": now,
                        "digest": f.digest,
                    }
                    for i, f in enumerate(new)
                ],
                schema=LOG_SCHEMA,
            )
            try:
                # A log written before digests gains the column (NULL for its files).
                write_deltalake(
                    dt, rows, mode="append", schema_mode="merge", commit_properties=_CAS
                )
            except CommitFailedError:
                time.sleep(min(0.05 * (attempt + 1), 0.5))
                continue
            # Decided on version v with retries off, the commit is v + 1: the new state is
            # known without reading the log back.
            logged = {f.path: f for f in _files(rows)}
            after = LogState(state.table_id, state.version + 1, {**state.by_path, **logged})
            with self._lock:
                self._state = after
            return after
        raise CommitConflictError(
            f"{self.upstream.owner}: could not record new files in its file log {self.uri} "
            f"after {_ATTEMPTS} attempts; other writers kept committing first.",
            upstream=self.upstream.name,
            fix="retry; if it persists, check what else writes to the file log.",
        )

    def fill_digests(self) -> LogState | None:
        """Give the files an older release logged without a content digest theirs, while
        each is still at its logged path with its logged size and modification time, in
        one compare-and-swap commit (the digest column added first, when the log has none):
        a move of such a file is then known by content as any other's. A file already gone
        keeps none (tried once per process). None when there is no log.

        Raises:
            CommitConflictError: other writers kept winning the commit.
        """
        for attempt in range(_ATTEMPTS):
            dt = self._open(create=False)
            if dt is None:
                return None
            state = self._load(dt)
            missing = [
                f
                for f in state.by_path.values()
                if f.digest is None and f.size > 0 and f.ordinal not in self._undigested
            ]
            if not missing:
                return state
            now = stat_files(self.upstream, [f.path for f in missing])
            present = [
                FileStat(f.path, f.size, f.mtime_ns)
                for f in missing
                if (found := now[f.path]) is not None
                and (found.size, found.mtime_ns) == (f.size, f.mtime_ns)
            ]
            digests = {
                path: digest
                for path, digest in content_digests(self.upstream, present).items()
                if digest is not None
            }
            self._undigested.update(f.ordinal for f in missing if f.path not in digests)
            if not digests:
                return state
            if "digest" not in {f.name for f in dt.schema().fields}:
                with contextlib.suppress(DeltaError):  # a concurrent look added it
                    dt.alter.add_columns([Field("digest", PrimitiveType("string"), nullable=True)])
                continue
            ordinals = [f.ordinal for f in missing if f.path in digests]
            source = pa.table(
                {
                    "ordinal": pa.array(ordinals, pa.int64()),
                    "digest": pa.array([digests[f.path] for f in missing if f.path in digests]),
                }
            )
            try:
                (
                    dt.merge(
                        source,
                        predicate="t.ordinal = s.ordinal AND t.digest IS NULL",
                        source_alias="s",
                        target_alias="t",
                        commit_properties=_CAS,
                    )
                    .when_matched_update({"digest": "s.digest"})
                    .execute()
                )
            except CommitFailedError:
                time.sleep(min(0.05 * (attempt + 1), 0.5))
                continue
            return self._load(DeltaTable(self.uri, storage_options=self.options))
        raise CommitConflictError(
            f"{self.upstream.owner}: could not record content digests in its file log "
            f"{self.uri} after {_ATTEMPTS} attempts; other writers kept committing first.",
            upstream=self.upstream.name,
            fix="retry; if it persists, check what else writes to the file log.",
        )

    def files_in(self, rng: VersionRange) -> list[LoggedFile]:
        """The files numbered inside ``rng`` (version 0 holds none), by number; reads only
        those rows.

        Raises:
            TableNotFoundError: the log is gone.
        """
        dt = DeltaTable(self.uri, storage_options=self.options)
        chosen = dt.to_pyarrow_table(
            columns=_columns(dt),
            filters=[("ordinal", ">=", rng.start), ("ordinal", "<=", rng.end)],
        )
        self.rows_read += chosen.num_rows
        return sorted(_files(chosen), key=lambda f: f.ordinal)


def refuse_log_behind(
    upstream: LandingUpstream, log: "FileLog", state: LogState, floor: int
) -> None:
    """Fail when the file log holds fewer files than the control root pinned (``floor``:
    its committed watermark, or an open batch's range end): the log was put back from an
    older copy, and the files it forgot, loaded or pinned under their numbers, would be
    numbered again in another order (one loaded twice, another never).

    Raises:
        LandingLogBehindError: naming the log, both numbers and the fix; nothing is logged.
    """
    if not state.table_id or state.latest >= floor:
        return
    raise LandingLogBehindError(
        f"{upstream.owner}: its file log {log.uri} holds "
        + (f"files 1..{state.latest}" if state.latest else "no file")
        + ", but this "
        f"control root has pinned files up to {floor}: the log was put back from an older "
        "copy (or rewound). Numbering new files now would give the numbers of files "
        "already loaded to others. Nothing is logged or loaded.",
        upstream=upstream.name,
        versions=f"file log at {state.latest}, pinned up to {floor}",
        fix=f"put back the file log that holds files 1..{floor} (its newer copy). If it is "
        f"lost, move {log.uri} aside and run `{reset_command(upstream.name)}`: every file "
        "in the folder is then numbered afresh and its pipelines load the folder again from "
        "the start.",
    )


def refuse_moves(upstream: LandingUpstream, state: LogState, new: Sequence[FileStat]) -> None:
    """Fail when one of ``new`` (paths the log does not hold) is a logged file under a new
    path: in a local folder it has the logged file's size and modification time (gone from
    its logged path, it was moved; still there, it was copied: ``cp -p``, or a move done as
    copy then delete, seen halfway); anywhere, it has the content digest of a logged file
    gone from its logged path (a move that gave the copy a new modification time: an object
    store's, a copy tool without ``-p``). A file of the same content beside the logged one
    with its own modification time is a second delivery. Either
    way its rows are the logged file's, loaded (or pinned) already: not a new file. An
    empty file holds no row to load twice and is never refused (two written in one second
    on an object store share size and modification time, and have no digest).

    Raises:
        LandingFileChangedError: naming both paths, the logged file's number and the fix.
    """
    new = [f for f in new if f.size > 0]
    # On an object store modification times are whole seconds: two small objects written in
    # one second share them, so there the content alone decides.
    local = is_local(upstream.path)
    identities = {(f.size, f.mtime_ns) for f in new if local or not f.digest}
    digests = {f.digest for f in new if f.digest}
    same = [
        f
        for f in state.by_path.values()
        if (f.size, f.mtime_ns) in identities or (f.digest and f.digest in digests)
    ]
    if not same:
        return
    now = stat_files(upstream, [f.path for f in same])
    known: dict[tuple[int, int], LoggedFile] = {}
    moved: dict[str, LoggedFile] = {}
    # A logged file gone from its path is the likelier origin (a move) than one still there.
    for f in sorted(same, key=lambda f: (now[f.path] is not None, f.ordinal)):
        known.setdefault((f.size, f.mtime_ns), f)
        if f.digest and now[f.path] is None:
            moved.setdefault(f.digest, f)
    for found in new:
        logged = known.get((found.size, found.mtime_ns)) if local or not found.digest else None
        if logged is not None:
            raise _moved_error(upstream, found, logged, gone=now[logged.path] is None)
        logged = moved.get(found.digest) if found.digest else None
        if logged is not None:
            raise _moved_error(upstream, found, logged, gone=True, by_content=True)


def _moved_error(
    upstream: LandingUpstream,
    found: FileStat,
    logged: LoggedFile,
    *,
    gone: bool,
    by_content: bool = False,
) -> LandingFileChangedError:
    how = (
        "which is gone from its logged path: it was moved"
        if gone
        else "which is still there: it was copied (a move done as copy then delete looks "
        "like this until the delete)"
    )
    alike = (
        f"the size ({found.size}) and the content (first and last 64 KiB) of {logged.path!r}"
        if by_content
        else f"the size ({found.size}) and modification time ({logged.mtime.isoformat()}) "
        f"of {logged.path!r}"
    )
    same_again = (
        f"If {found.path!r} is meant to load those rows a second time, change its content."
        if by_content
        else f"If {found.path!r} is new content, give it a new modification time (`touch` "
        "it) and it is loaded as a new file."
    )
    return LandingFileChangedError(
        f"{upstream.owner}: landing file {found.path!r} has {alike} (file {logged.ordinal}), "
        f"{how}, and its rows were loaded (or are pinned) already under that number. "
        "Nothing is logged or loaded until it is resolved.",
        upstream=upstream.name,
        versions=f"file {logged.ordinal}",
        fix=(
            f"move it back to {logged.path!r}, or archive it"
            if gone
            else "remove the copy, or keep copies"
        )
        + " where the folder's listing never looks (outside the folder, or under a folder "
        "or name starting with '_' or '.'); write temporary files there too. " + same_again,
    )
