"""Commit history arithmetic: which version was current at a point in time."""

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def version_at(commits: Iterable[tuple[int, int]], at: datetime) -> int | None:
    """The newest version committed at or before ``at``.

    Setting the watermark there makes the next batch start with the first commit after
    ``at``. Commit timestamps need not grow with versions (clock skew between writers);
    as in Delta's own time travel, a commit whose timestamp is not after its predecessor's
    counts as one millisecond after it.

    Args:
        commits: ``(version, commit timestamp in epoch milliseconds)`` pairs, any order.
        at: a timezone-aware instant.

    Returns:
        The version, or None when every known commit is after ``at``.
    """
    limit_ms = (at - _EPOCH) // timedelta(milliseconds=1)  # exact, no float rounding
    newest = None
    previous: int | None = None
    for version, ts in sorted(commits):
        adjusted = ts if previous is None else max(ts, previous + 1)
        if adjusted > limit_ms:
            break
        newest, previous = version, adjusted
    return newest
