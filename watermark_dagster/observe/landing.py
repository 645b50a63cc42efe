"""A look at a landing folder: its new settled files logged and numbered, and its logged
files that changed refused (see :mod:`~watermark_dagster.observe.landing_log`)."""

import time
from collections.abc import Iterable, Mapping

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.core.observations import Observation
from watermark_dagster.errors import LandingFileChangedError, UpstreamUnavailableError
from watermark_dagster.observe.landing_files import FileStat, list_files, stat_files
from watermark_dagster.observe.landing_log import FileLog, LoggedFile


def _shown(size: int, mtime_ns: int) -> str:
    return f"size {size}, mtime {LoggedFile(0, '', size, mtime_ns).mtime.isoformat()}"


def changed_file_error(
    upstream: LandingUpstream, logged: LoggedFile, now: FileStat | None, *, loaded: bool | None
) -> LandingFileChangedError:
    """The error for a logged file that is gone (``now`` None) or changed. ``loaded``:
    whether a batch already loaded it (None: unknown, found by a look)."""
    recorded = _shown(logged.size, logged.mtime_ns)
    current = "gone" if now is None else _shown(now.size, now.mtime_ns)
    when = {True: "after it was loaded", False: "before its batch loaded it", None: ""}[loaded]
    what = "disappeared" if now is None else "changed"
    fix = (
        "put it back exactly as recorded (same size and modification time), or move it aside "
        "and write its content under a new file name: a new name is a new file, loaded once."
        if now is not None
        else "put it back exactly as recorded (same size and modification time); its rows "
        f"are not loaded until it is there. To give its rows up, abandon the batch and move "
        f"the watermark past file {logged.ordinal} (`watermark set -t {upstream.name} "
        f"--version {logged.ordinal} --force`)."
    )
    return LandingFileChangedError(
        f"{upstream.owner}: landing file {logged.path!r} (file {logged.ordinal}) {what} "
        f"{when}{' ' if when else ''}(recorded: {recorded}; now: {current}). Nothing is "
        "loaded from it.".replace("  ", " "),
        upstream=upstream.name,
        versions=f"file {logged.ordinal}",
        fix=fix,
    )


def check_unchanged(
    upstream: LandingUpstream, files: Iterable[LoggedFile], *, loaded: bool | None
) -> None:
    """Fail on the first of ``files`` that is gone or no longer the file recorded.

    Raises:
        LandingFileChangedError: naming the file, what was recorded and what is there now.
    """
    files = list(files)
    now = stat_files(upstream, [f.path for f in files])
    for logged in files:
        found = now[logged.path]
        if found is None or (found.size, found.mtime_ns) != (logged.size, logged.mtime_ns):
            raise changed_file_error(upstream, logged, found, loaded=loaded)


def settled(files: Iterable[FileStat], settle_seconds: float, now_ns: int) -> list[FileStat]:
    """The files last modified at least ``settle_seconds`` before ``now_ns``."""
    limit = now_ns - int(settle_seconds * 1e9)
    return [f for f in files if f.mtime_ns <= limit]


def observe_landing(upstream: LandingUpstream, log: FileLog) -> Observation:
    """Look at a landing folder: log its new settled files, and report its version (the
    highest file number) and its file log's table id (a log dropped and recreated is a
    recreated table).

    Raises:
        UpstreamUnavailableError: the folder does not exist or cannot be listed, or no file
            landed yet.
        LandingFileChangedError: a logged file changed (size or modification time).
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
    state = log.state()
    assert state is not None
    known: Mapping[str, LoggedFile] = state.by_path
    for found in listed:
        logged = known.get(found.path)
        if logged is not None and (logged.size, logged.mtime_ns) != (found.size, found.mtime_ns):
            raise changed_file_error(upstream, logged, found, loaded=None)
    new = settled(
        (f for f in listed if f.path not in known), upstream.settle_seconds, time.time_ns()
    )
    if new:
        state = log.register(new)
    if state.latest == 0:
        raise UpstreamUnavailableError(
            f"{upstream.owner}: no file has landed in {upstream.path} yet"
            + (f" ({len(listed)} still settling)" if listed else "")
            + f" matching {upstream.pattern!r}.",
            upstream=upstream.name,
            fix="wait for the first file; its pipelines are planned once one is there.",
        )
    return Observation(upstream.name, upstream.path, state.latest, False, state.table_id, "")
