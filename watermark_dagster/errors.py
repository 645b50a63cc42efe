"""The errors watermark-dagster raises.

Two families, because operators react to them differently:

* :class:`TerminalError` — retrying will not help (a gap, a recreated table, bad
  configuration). The message names the value at fault and ends with the fix.
* :class:`RetryableError` — a concurrent writer won the commit, or storage blinked. The
  caller retries; the store does so itself a bounded number of times.

:class:`UsageError`, a terminal error, is a command-line input or request the ``watermark``
command refuses (a bad flag value, an unconfirmed change); nothing was written.

Every error carries the table, batch and range it concerns as attributes, so the Dagster
boundary can turn it into a ``Failure`` whose metadata the UI shows.
"""

from typing import Any


class WatermarkError(Exception):
    """Base class of every error raised by watermark-dagster.

    ``str(error)`` is the message followed by ``Fix: <fix>``; ``reason`` is the message
    alone and ``fix`` the fix alone, for output that shows them apart.
    """

    def __init__(
        self,
        message: str,
        *,
        upstream: str | None = None,
        pipeline: str | None = None,
        batch_id: str | None = None,
        versions: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.reason = message
        self.upstream = upstream
        self.pipeline = pipeline
        self.batch_id = batch_id
        self.versions = versions
        self.fix = fix
        full = message if fix is None else f"{message} Fix: {fix}"
        super().__init__(full)

    def metadata(self) -> dict[str, Any]:
        """The error's attributes, for Dagster metadata and ``--json`` output."""
        fields = {
            "upstream": self.upstream,
            "pipeline": self.pipeline,
            "batch_id": self.batch_id,
            "versions": self.versions,
            "fix": self.fix,
        }
        return {k: v for k, v in fields.items() if v is not None}


# Where a stack begins in an error's text: Spark's JVM stack (a captured Spark error, or
# Py4J's "at ..." frames) and a Python traceback.
_STACKS = ("\nJVM stacktrace:", "\n\tat ", "\n    at ", "\nTraceback (most recent call last)")


def one_line(text: str) -> str:
    """An error's text as one line: the stack Spark's errors carry in their text (JVM
    frames, a Python traceback) cut off, whitespace folded."""
    for marker in _STACKS:
        text = text.split(marker, 1)[0]
    return " ".join(text.split())


def error_line(error: BaseException, *, limit: int = 2000) -> str:
    """One line naming ``error`` for tables and control-table rows: its type and message
    (with the fix, for one of ours), without its stack (that stays in the run's log)."""
    line = one_line(str(error))
    return f"{type(error).__name__}: {line}"[:limit] if line else type(error).__name__


class TerminalError(WatermarkError):
    """Retrying will not help; an operator has to act."""


class RetryableError(WatermarkError):
    """A transient condition; the same call may succeed later."""


class UsageError(TerminalError):
    """A ``watermark`` command refused its input or a write; nothing was written (exit 2).

    The message names the value at fault and ends with the fix.
    """


class ConfigurationError(TerminalError):
    """The registry or a resource is configured wrongly (raised when definitions load)."""


class DeclaredSqlError(ConfigurationError):
    """A declared pipeline's SQL was refused; ``sql_line`` is the line of the SQL text at
    fault (1-based), so a registry file can point at its own line."""

    def __init__(self, message: str, *, sql_line: int | None, **attrs: str | None) -> None:
        super().__init__(message, **attrs)
        self.sql_line = sql_line


class UpstreamUnavailableError(TerminalError):
    """An upstream path does not exist or is not a Delta table, or no catalog table has the
    upstream's name."""


class NoFileLandedError(UpstreamUnavailableError):
    """No file has landed in a landing folder yet: its pipelines wait for the first one
    (``watermark run`` is idle, not failed)."""


class LandingLogBehindError(UpstreamUnavailableError):
    """A landing upstream's file log holds fewer files than its control root pinned (put
    back from an older copy): numbering new files would give loaded files' numbers to
    others, so nothing is logged or loaded."""


class LandingFileChangedError(UpstreamUnavailableError):
    """A landing folder's file changed (size or modification time) or disappeared after its
    file log recorded it: its content was, or is to be, loaded as recorded."""


class UpstreamRecreatedError(TerminalError):
    """An upstream's latest version fell below the committed one: it was dropped and recreated."""


class ReloadHeldError(TerminalError):
    """A pipeline owes a reload in full after a forced change abandoned a batch it
    applied, and cannot have it automatically: its upstreams start from somewhere other
    than the beginning. Its upstreams are held until an operator resets them."""


class WatermarkGapError(TerminalError):
    """An advance would skip versions that some consumer has not applied (invariant I1)."""


class WatermarkRegressionError(TerminalError):
    """An automatic advance would move a committed watermark backwards (invariant I2)."""


class BatchStateError(TerminalError):
    """A batch is not in the state an operation needs (unknown, already completed, abandoned)."""


class TargetBoundElsewhereError(TerminalError):
    """A pipeline's target records a write this control root did not schedule: another
    root's (a new or reset root over targets another root wrote), or this root's own at a
    position ahead of the batch (a root restored from an older copy). Nothing was skipped
    or written: taking the batch as already applied would drop its changes."""


class CommitConflictError(RetryableError):
    """Another writer committed to a control table first and retries ran out."""


class UpstreamUnreadableError(TerminalError):
    """A batch's range can no longer be read: log versions or change files were removed
    (log cleanup, VACUUM), or the change data feed was off for part of the range."""


class UpstreamDataChangedError(TerminalError):
    """An APPEND_ONLY range holds commits that update or delete rows."""


class UpstreamSchemaChangedError(TerminalError):
    """An upstream's schema changed incompatibly inside a batch's range."""


class QueryRefusedError(TerminalError):
    """Spark's analyzer refused a query of a pipeline's run (a column, table or path that
    is not there): the same query is refused on every retry."""


class ReplayRefusedError(TerminalError):
    """A replay or backfill that could not re-apply its range as changes through the
    version-guarded MERGE (it would reload the target, or create it); nothing was written."""


def replay_refused(
    pipeline: str, batch_id: str | None, why: str, *, upstream: str | None = None
) -> ReplayRefusedError:
    """The error of a replay that would have to reload or create ``pipeline``'s target:
    ``why`` says what makes it so."""
    rebuild = (
        f"`{reset_command(upstream)}` reloads the target from the upstream's current version"
        if upstream
        else "a reset of the pipeline's upstream reloads the target from its current version"
    )
    return ReplayRefusedError(
        f"Pipeline '{pipeline}': the replay{f' of batch {batch_id}' if batch_id else ''} "
        f"cannot re-apply its range as changes: {why}. A replay only merges the changes of "
        "its pinned range, version-guarded, into an existing target; it never reloads or "
        "creates one (a reload at an old position would overwrite the newer rows). Nothing "
        "was written.",
        pipeline=pipeline,
        batch_id=batch_id,
        upstream=upstream,
        fix=(
            f"to rebuild the target from the upstreams as they are now, {rebuild}; to make "
            "such ranges replayable in future, enable the upstream's change data feed "
            "(delta.enableChangeDataFeed = true)."
        ),
    )


def reset_command(upstream: str, *, force: bool = True) -> str:
    """The command that recovers an upstream whose committed watermark no longer applies
    (the table was recreated, or the range it needs was cleaned up): forget the watermark,
    abandon the open batch that reads the table (``--force``; without it the command
    refuses while a batch is open), reload it from a snapshot."""
    return f"watermark reset -t {upstream}{' --force' if force else ''}"


def recreated_fix(upstream: str) -> str:
    """The fix of every :class:`UpstreamRecreatedError`, wherever it is detected."""
    return (
        f"check that the table now at the path of '{upstream}' is the one to follow, then run "
        f"`{reset_command(upstream)}`: its watermark is forgotten (an open batch reading it is "
        f"abandoned) and every pipeline reading '{upstream}' reloads it from a snapshot."
    )


def recreated_error(
    upstream: str,
    found: str,
    consequence: str,
    *,
    versions: str | None = None,
    batch_id: str | None = None,
) -> UpstreamRecreatedError:
    """The error for an upstream that was dropped and recreated at the same path.

    Planning, observation and the read path detect it in different ways; they all build it
    here, so the message has one shape and the fix is one and the same command.

    Args:
        upstream: the upstream's name.
        found: what shows it, e.g. ``"its table id is X, but ..."``.
        consequence: what happens because of it, e.g. ``"Nothing is planned for it."``.
        versions: the versions concerned, for metadata.
        batch_id: the batch concerned, if any.
    """
    return UpstreamRecreatedError(
        f"Upstream '{upstream}' was dropped and recreated: {found}. Its versions no longer "
        f"continue from the committed watermark. {consequence}",
        upstream=upstream,
        batch_id=batch_id,
        versions=versions,
        fix=recreated_fix(upstream),
    )


def missing_table_error(upstream: str, table: str) -> UpstreamUnavailableError:
    """The error for an upstream named by catalog table when no table had that name as the
    code location loaded: like a path that does not exist, it blocks only the pipelines
    reading the upstream.

    Args:
        upstream: the upstream's name.
        table: its catalog name, quoted as Spark reads it (`` `sales`.`orders` ``).
    """
    return UpstreamUnavailableError(
        f"Upstream '{upstream}': catalog table {table} does not exist (no table had that name "
        "when the code location loaded). Nothing is planned for it until then.",
        upstream=upstream,
        fix=f"create {table} (or correct the name in the registry, or give the table's "
        "location as path), then reload the code location: catalog names are resolved when "
        "it loads.",
    )
