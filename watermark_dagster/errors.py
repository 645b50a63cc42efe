"""The errors watermark-dagster raises.

Two families, because operators react to them differently:

* :class:`TerminalError` — retrying will not help (a gap, a recreated table, bad
  configuration). The message names the value at fault and ends with the fix.
* :class:`RetryableError` — a concurrent writer won the commit, or storage blinked. The
  caller retries; the store does so itself a bounded number of times.

Every error carries the table, batch and range it concerns as attributes, so the Dagster
boundary can turn it into a ``Failure`` whose metadata the UI shows.
"""

from typing import Any


class WatermarkError(Exception):
    """Base class of every error raised by watermark-dagster."""

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


class TerminalError(WatermarkError):
    """Retrying will not help; an operator has to act."""


class RetryableError(WatermarkError):
    """A transient condition; the same call may succeed later."""


class ConfigurationError(TerminalError):
    """The registry or a resource is configured wrongly (raised when definitions load)."""


class UpstreamUnavailableError(TerminalError):
    """An upstream path does not exist or is not a Delta table."""


class UpstreamRecreatedError(TerminalError):
    """An upstream's latest version fell below the committed one: it was dropped and recreated."""


class WatermarkGapError(TerminalError):
    """An advance would skip versions that some consumer has not applied (invariant I1)."""


class WatermarkRegressionError(TerminalError):
    """An automatic advance would move a committed watermark backwards (invariant I2)."""


class BatchStateError(TerminalError):
    """A batch is not in the state an operation needs (unknown, already completed, abandoned)."""


class CommitConflictError(RetryableError):
    """Another writer committed to a control table first and retries ran out."""


class UpstreamUnreadableError(TerminalError):
    """A batch's range can no longer be read: log versions or change files were removed
    (log cleanup, VACUUM), or the change data feed was off for part of the range."""


class UpstreamDataChangedError(TerminalError):
    """An APPEND_ONLY range holds commits that update or delete rows."""


class UpstreamSchemaChangedError(TerminalError):
    """An upstream's schema changed incompatibly inside a batch's range."""
