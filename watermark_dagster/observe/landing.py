"""A look at a landing folder: its new settled files logged and numbered, and its logged
files that changed refused (see :mod:`~watermark_dagster.observe.landing_log`)."""

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.core.observations import Observation
from watermark_dagster.errors import (
    LandingFileChangedError,
    NoFileLandedError,
    UpstreamUnavailableError,
)
from watermark_dagster.observe.landing_files import (
    FileStat,
    list_files,
    stat_files,
    with_digests,
)
from watermark_dagster.observe.landing_log import (
    FileLog,
    LoggedFile,
    LogState,
    refuse_log_behind,
    refuse_moves,
)


def _shown(size: int, mtime_ns: int) -> str:
    return f"size {size}, mtime {LoggedFile(0, '', size, mtime_ns).mtime.isoformat()}"


def _new_content_fix(loaded: bool | None) -> str:
    """How to load a changed file's new content without loading a row twice."""
    if loaded is False:
        return (
            "To load the new content instead, move the file aside and write it under a new "
            "file name (nothing of it was loaded, so nothing is loaded twice), then give the "
            "old number up as for a vanished file."
        )
    return (
        "To load new content, write only the rows not loaded yet under a new file name: a "
        "new name is a new file, loaded once and whole, so an append target would hold "
        "every row it repeats twice (a merge target keeps one row per key)."
    )


def changed_file_error(
    upstream: LandingUpstream,
    logged: LoggedFile,
    now: FileStat | None,
    *,
    loaded: bool | None,
    replay: bool = False,
) -> LandingFileChangedError:
    """The error for a logged file that is gone (``now`` None) or changed. ``loaded``:
    whether a batch already loaded it (None: unknown, found by a look or a batch's read);
    ``replay``: found by a replay, which re-reads files already loaded.

    Every message says what happened to the file's rows, and no fix skips a row that was
    not loaded or loads one twice."""
    recorded = _shown(logged.size, logged.mtime_ns)
    current = "gone" if now is None else _shown(now.size, now.mtime_ns)
    when = {True: " after it was loaded", False: " before its batch loaded it", None: ""}[loaded]
    what = "disappeared" if now is None else "changed"
    name, number = upstream.name, logged.ordinal
    back = "put it back exactly as recorded (same size and modification time)"
    if replay:
        rows = "The replay reads exactly the files it pinned, so nothing was written."
        fix = f"{back} and replay again, or replay a range without file {number}."
    elif loaded is True:
        rows = "Its rows were loaded as recorded and stay; its new content is not loaded."
        fix = f"{back}. {_new_content_fix(True)}"
    elif loaded is False:
        rows = "Nothing is loaded from it."
        fix = f"{back}. {_new_content_fix(False)}"
    else:
        rows = (
            f"If it was loaded already (file {number} at or below the committed watermark "
            f"of '{name}', see `watermark get -t {name} --show-files`), its rows stay as "
            "loaded and its new content is not loaded; if not, nothing is loaded from it, "
            "or from any later file, until it is back."
        )
        fix = f"{back}. {_new_content_fix(None)}"
    if now is None and not replay:
        fix = (
            f"{back}, then retry (`watermark run --retry`). To give its rows up instead: "
            f"when it is the open batch's first file (file {number} = the committed "
            f"watermark + 1), `watermark set -t {name} --version {number} --force` abandons "
            "the batch and skips only it (the batch's later files are planned again); when "
            "files before it wait in the same batch, moving the watermark past it would skip "
            "them too, so put it back."
        )
    return LandingFileChangedError(
        f"{upstream.owner}: landing file {logged.path!r} (file {number}) {what}{when} "
        f"(recorded: {recorded}; now: {current}). {rows}",
        upstream=name,
        versions=f"file {number}",
        fix=fix,
    )


def check_unchanged(
    upstream: LandingUpstream,
    files: Iterable[LoggedFile],
    *,
    loaded: bool | None,
    replay: bool = False,
) -> None:
    """Fail on the first of ``files`` that is gone or no longer the file recorded
    (``loaded`` and ``replay``: see :func:`changed_file_error`).

    Raises:
        LandingFileChangedError: naming the file, what was recorded and what is there now.
    """
    files = list(files)
    now = stat_files(upstream, [f.path for f in files])
    for logged in files:
        found = now[logged.path]
        if found is None or (found.size, found.mtime_ns) != (logged.size, logged.mtime_ns):
            raise changed_file_error(upstream, logged, found, loaded=loaded, replay=replay)


def settled(files: Iterable[FileStat], settle_seconds: float, now_ns: int) -> list[FileStat]:
    """The files last modified at least ``settle_seconds`` before ``now_ns``."""
    limit = now_ns - int(settle_seconds * 1e9)
    return [f for f in files if f.mtime_ns <= limit]


@dataclass(frozen=True)
class FolderLook:
    """What a look found in a landing folder beside its log's ``state``: the settled files
    the log does not hold (``new``, oldest first: the order they are numbered in) and the
    files still settling, with every logged file checked unchanged."""

    state: LogState
    new: list[FileStat]
    settling: list[FileStat]

    @property
    def latest(self) -> int:
        """The highest file number once ``new`` is logged."""
        return self.state.latest + len(self.new)


def look_at_folder(upstream: LandingUpstream, state: LogState) -> FolderLook:
    """List the folder against the log's ``state``; writes nothing.

    Raises:
        UpstreamUnavailableError: the folder does not exist or cannot be listed.
        LandingFileChangedError: a logged file changed (size or modification time), or a
            new path is a logged file moved.
    """
    try:
        listed = list_files(upstream)
    except FileNotFoundError:
        raise UpstreamUnavailableError(
            f"{upstream.owner}: the landing folder {upstream.path} does not exist.",
            upstream=upstream.name,
            fix="create it, or fix the upstream's path.",
        ) from None
    except OSError as e:  # an object store that refused the listing
        raise UpstreamUnavailableError(
            f"{upstream.owner}: the landing folder {upstream.path} could not be listed "
            f"({type(e).__name__}: {e}).",
            upstream=upstream.name,
            fix="check the path and the upstream's storage_options (credentials, endpoint).",
        ) from e
    known: Mapping[str, LoggedFile] = state.by_path
    for found in listed:
        logged = known.get(found.path)
        if logged is not None and (logged.size, logged.mtime_ns) != (found.size, found.mtime_ns):
            raise changed_file_error(upstream, logged, found, loaded=None)
    unlogged = [f for f in listed if f.path not in known]
    new = sorted(
        settled(unlogged, upstream.settle_seconds, time.time_ns()),
        key=lambda f: (f.mtime_ns, f.path),
    )
    new = with_digests(upstream, new)
    refuse_moves(upstream, state, new)
    chosen = {f.path for f in new}
    return FolderLook(state, new, [f for f in unlogged if f.path not in chosen])


def observe_landing(
    upstream: LandingUpstream, log: FileLog, *, record: bool = True, floor: int | None = None
) -> Observation:
    """Look at a landing folder: log its new settled files, and report its version (the
    highest file number) and its file log's table id (a log dropped and recreated is a
    recreated table).

    Files are numbered only by a look that knows what its control root pinned (``floor``:
    the highest file number committed or pinned by an open batch; the coordinator's look).
    With ``record`` False (a read-only command) or no ``floor`` (a Dagster observation, a
    health check) nothing is written, not even the log: the new files count as numbered
    the way the coordinator's look would number them.

    Raises:
        UpstreamUnavailableError: the folder does not exist or cannot be listed.
        NoFileLandedError: no file landed yet (the upstream waits; nothing is wrong).
        LandingFileChangedError: a logged file changed (size or modification time).
        LandingLogBehindError: the log holds fewer files than ``floor``, the highest
            number the control root pinned (:func:`refuse_log_behind`).
    """
    # The log is created by its first files only: the folder is listed first (by default
    # the log lives inside it, and creating it would create a missing folder).
    state = log.state(create=False) or LogState("", 0)
    if floor:
        refuse_log_behind(upstream, log, state, floor)
    if record and floor is not None and state.table_id:
        # Files logged before content digests get theirs, so a move of one is known.
        state = log.fill_digests() or state
    look = look_at_folder(upstream, state)
    latest = look.latest
    if look.new and record and floor is not None:
        state = log.register(look.new, floor=floor)
        latest = state.latest
    if latest == 0:
        raise NoFileLandedError(
            f"{upstream.owner}: no file has landed in {upstream.path} yet"
            + (f" ({len(look.settling)} still settling)" if look.settling else "")
            + f" matching {upstream.pattern!r}.",
            upstream=upstream.name,
            fix="wait for the first file; its pipelines are planned once one is there.",
        )
    return Observation(upstream.name, upstream.path, latest, False, state.table_id, "")
