"""What a range's commits changed, from their log entries alone: how many change rows its
change data feed holds (:func:`range_change_rows`), and how many bytes
(:func:`commit_change_bytes`).

A batch reports the rows it read from each upstream. For a change data feed range the log
already says it: each commit's ``commitInfo`` carries the operation's own metrics, and a
commit that changed no data (a compaction, a property change, a schema change) holds no
change row. So the count costs no Spark job, where counting the feed is a job of its own
per upstream before the transform runs (``benchmarks.jobs``: 6 jobs per pipeline).

Only what the feed is known to hold is read from the metrics; anything else makes the
range unknown (None) and the caller counts the rows instead:

* an append (``WRITE`` or ``STREAMING UPDATE`` in mode ``Append``, or a write that created
  the table, by Delta's or delta-rs's metric): one insert per row written;
* a ``MERGE``: one row per insert and delete, two per update (the pre- and post-image);
* an ``UPDATE``: two per row updated; a ``DELETE`` that names its deleted rows: one each;
* a commit with no data change (no change file, no added or removed file with
  ``dataChange``): none.

An overwrite, a ``DELETE`` of whole files without a row count, a ``RESTORE``, and any
operation not listed above are unknown: their feed depends on rows the metrics do not count.
``tests/spark/test_change_rows.py`` holds each rule to the feed Spark reads.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

_APPENDS = frozenset({"WRITE", "STREAMING UPDATE", "CREATE TABLE AS SELECT"})
_INSERTING_MODES = frozenset({"append", "errorifexists", "ignore"})


def _metric(metrics: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = metrics.get(name)
        if value is None:
            continue
        try:
            return int(value)
        except (TypeError, ValueError):
            return None
    return None


def _changes_data(actions: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the commit wrote change files or added or removed data files."""
    for action in actions:
        if "cdc" in action:
            return True
        for kind in ("add", "remove"):
            body = action.get(kind)
            if isinstance(body, Mapping):
                fields = cast("Mapping[str, Any]", body)
                if fields.get("dataChange") is not False:
                    return True
    return False


def commit_change_rows(actions: Sequence[Mapping[str, Any]]) -> int | None:
    """The change rows one commit adds to its table's change data feed, by its log actions
    (see the module's rules); None when the log does not say."""
    if not _changes_data(actions):
        return 0
    info: Mapping[str, Any] = {}
    for action in actions:
        body = action.get("commitInfo")
        if isinstance(body, Mapping):
            info = cast("Mapping[str, Any]", body)
    operation = str(info.get("operation") or "")
    metrics = cast("Mapping[str, Any]", info.get("operationMetrics") or {})
    parameters = cast("Mapping[str, Any]", info.get("operationParameters") or {})
    if operation in _APPENDS:
        mode = str(parameters.get("mode") or parameters.get("outputMode") or "")
        # ErrorIfExists and Ignore commit only when they create the table: inserts alone.
        if operation != "CREATE TABLE AS SELECT" and mode.lower() not in _INSERTING_MODES:
            return None
        return _metric(metrics, "numOutputRows", "num_added_rows")
    if operation == "MERGE":
        counts = [
            _metric(metrics, n)
            for n in ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
        ]
        if any(c is None for c in counts):
            return None
        inserted, updated, deleted = cast("list[int]", counts)
        return inserted + 2 * updated + deleted
    if operation == "UPDATE":
        updated = _metric(metrics, "numUpdatedRows")
        return None if updated is None else 2 * updated
    if operation == "DELETE":
        return _metric(metrics, "numDeletedRows")
    return None


def range_change_rows(commits: Iterable[Sequence[Mapping[str, Any]] | None]) -> int | None:
    """The change rows of a range's commits (each commit's actions, None for one not in the
    log): their sum, or None when any commit's count is unknown."""
    total = 0
    for actions in commits:
        if actions is None:
            return None
        rows = commit_change_rows(actions)
        if rows is None:
            return None
        total += rows
    return total


def commit_change_bytes(actions: Sequence[Mapping[str, Any]]) -> int:
    """The bytes one commit changed, by its log actions: the sizes of its change data files
    when it wrote any (an UPDATE, DELETE or MERGE with the change data feed on rewrites
    whole files, but only its change files hold changed rows), else of the files it added
    and removed with ``dataChange`` (an append, a delete of whole files, a rewrite without
    change data). Compactions (``dataChange: false``) change nothing."""

    def sizes(kind: str, *, data_change_only: bool) -> int:
        total = 0
        for action in actions:
            body = action.get(kind)
            if not isinstance(body, Mapping):
                continue
            fields = cast("Mapping[str, Any]", body)
            if data_change_only and fields.get("dataChange") is False:
                continue
            total += int(fields.get("size") or 0)
        return total

    change_data = sizes("cdc", data_change_only=False)
    if change_data:
        return change_data
    return sizes("add", data_change_only=True) + sizes("remove", data_change_only=True)
