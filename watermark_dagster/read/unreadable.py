"""Naming a pinned input Spark could not read (I6): which upstream, which range or
snapshot, why (change files vacuumed, the change data feed off, log versions cleaned up) and
the fix, in place of Spark's raw error."""

import re
from collections.abc import Mapping
from typing import Protocol

from watermark_dagster.config.upstream import Upstream
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.errors import UpstreamUnreadableError, reset_command
from watermark_dagster.read.tables import comparable_location


class _Pinned(Protocol):
    """What this module reads of a :class:`~watermark_dagster.read.inputs.UpstreamInput`
    (which names its own read errors with :func:`unreadable`)."""

    _upstream: Upstream
    mode: ReadMode
    range: VersionRange | None
    snapshot_version: int | None

    @property
    def reads_snapshot(self) -> bool: ...

    @property
    def location(self) -> str: ...

    def describe(self) -> str: ...


_CAUSES = (
    (
        ("DELTA_MISSING_CHANGE_DATA", "change data was not recorded", "CHANGE_DATA_NOT_RECORDED"),
        "the change data feed was off for part of the range",
        "turn the change data feed back on (delta.enableChangeDataFeed = true), then run "
        "`{reset}` to reload the table from a snapshot.",
    ),
    (
        ("FileNotFound", "FILE_NOT_FOUND", "does not exist", "CHANGE_DATA_FILE_NOT_FOUND"),
        "files the range needs were removed (VACUUM)",
        "run `{reset}` to reload the table from a snapshot; to "
        "prevent it, keep delta.deletedFileRetentionDuration longer than your batch delay.",
    ),
    (
        ("VersionNotFound", "Cannot time travel", "VERSIONS_NOT_CONTIGUOUS", "TIME_TRAVEL"),
        "log versions the range needs were cleaned up",
        "run `{reset}` to reload the table from a snapshot; to "
        "prevent it, keep delta.logRetentionDuration longer than your batch delay.",
    ),
)


def unreadable(upstream: Upstream, what: str, error: BaseException) -> BaseException:
    """Turn Spark's failure to read a pinned range into a named, actionable error; other
    failures pass through unchanged.

    The message keeps Spark's own first line without the py4j call noise ("An error
    occurred while calling o59.count.") or the Java class in front of it, and names the
    missing file when Spark's text holds its path.
    """
    text = str(error)
    lines = [line.strip() for line in text.splitlines()]
    meaningful = [
        line.lstrip(": ").strip()
        for line in lines
        if line
        and not re.fullmatch(r"An error occurred while calling [\w$.]+\.?", line)
        and not line.startswith(("at ", "..."))
    ]
    first = meaningful[0] if meaningful else text.strip()
    # "org.apache.spark.SparkException: [FAILED_READ_FILE...] ..." -> "[FAILED_READ_FILE...] ..."
    first = re.sub(r"^(?:[a-z_][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error): ", "", first)[:500]
    path = _missing_path(text)
    for needles, cause, fix in _CAUSES:
        if any(n.lower() in text.lower() for n in needles):
            missing = f"; missing file: {path}" if path else ""
            return UpstreamUnreadableError(
                f"Upstream '{upstream.name}': the batch's read {what} failed because {cause}"
                f"{missing}. Spark: {first} Nothing was written and no watermark moved.",
                upstream=upstream.name,
                versions=what,
                fix=fix.format(reset=reset_command(upstream.name)),
            )
    return error


def _missing_path(text: str) -> str | None:
    """The path of the missing file Spark's error text names, if it names one."""
    for pattern in (
        r"reading file (\S+?)\.? File does not exist",
        r"File (\S+) does not exist",
        r"FileNotFoundException: (?:File )?(\S+)",
    ):
        found = re.search(pattern, text)
        if found:
            return found.group(1).rstrip(".")
    return None


# The errors of a change data feed that name no file: the feed off for part of the range,
# its log versions gone.
_RANGE_CAUSES = (_CAUSES[0], _CAUSES[2])
_RANGE_FILE_MODES = frozenset({ReadMode.APPEND_ONLY, ReadMode.TIMESTAMP})


def unreadable_in_run(inputs: Mapping[str, _Pinned], error: BaseException) -> BaseException:
    """The named error (:func:`unreadable`) of a transform or write whose Spark job failed
    reading a pinned input, or ``error`` itself.

    The rows of a range are first read by the transform or the write: no job counts them
    before (:meth:`~watermark_dagster.read.inputs.UpstreamInput.rows_read` takes the count
    from the log). So those jobs are where a range fails whose change files were removed
    after planning (a VACUUM) or whose change data feed was off for part of it; as do the
    files of a snapshot the batch reads whole (a ``rewrite``, a ``full`` batch, a join
    through another upstream).

    An error naming a missing file is the input's whose location holds it (its range when
    the file is a change file or the input reads no snapshot, else its snapshot). An error
    naming no file is a range's only when it is one of a change data feed's own (the feed
    off, log versions gone) and one input reads a range, or only one such input's location
    is in the error. Anything else (an error of the transform, such as a column that
    cannot be resolved) is ``error`` itself.
    """
    text = str(error)
    path = _missing_path(text)
    live = [i for i in inputs.values() if i.mode is not ReadMode.NOOP]
    if path is None:
        ranged = [i for i in live if i.range is not None and not i.reads_snapshot]
        if not any(n.lower() in text.lower() for needles, _, _ in _RANGE_CAUSES for n in needles):
            return error
        if len(ranged) > 1:
            ranged = [i for i in ranged if comparable_location(i.location) in text]
        if len(ranged) != 1:
            return error
        return unreadable(ranged[0]._upstream, ranged[0].describe(), error)
    where = comparable_location(path)
    read = [i for i in live if where.startswith(comparable_location(i.location).rstrip("/") + "/")]
    if len(read) != 1:
        return error
    [found] = read
    at = found.snapshot_version
    # A change file, or the files an append-only range or a window reads, are the range's.
    reads_range = "/_change_data/" in where or found.mode in _RANGE_FILE_MODES
    what = found.describe() if reads_range or at is None else f"of the snapshot at version {at}"
    return unreadable(found._upstream, what, error)
