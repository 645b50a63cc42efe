"""What the command line shows about batches, read from the control tables: which open
batches the coordinator gave up resubmitting (stuck), and why."""

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from watermark_dagster.core.records import Batch, BatchStatus, CheckpointStatus
from watermark_dagster.core.resuming import RESUME_HINT

if TYPE_CHECKING:
    from watermark_dagster.store import WatermarkStore

# The coordinator's own advice when a stuck batch's history row carries no fix.
STUCK_FIX = f"fix the cause, then {RESUME_HINT}."


def stuck_batches(store: "WatermarkStore", batches: Sequence[Batch]) -> dict[str, dict[str, Any]]:
    """Batch id -> why it is stuck, for open batches the coordinator gave up resubmitting.

    A batch is stuck when the coordinator recorded ``BATCH_STUCK`` for it (its failed runs
    or its runs that died reached the maximum, or a pipeline failed with an error retrying
    cannot fix) and no pipeline attempt started after that. The reason is the recorded
    error, else the last failed attempt's, else the coordinator's own reason (the deaths it
    counted); the fix is the recorded one, else the one the reason names, else
    re-executing the partition.
    """
    open_ids = {b.batch_id for b in batches if b.status is BatchStatus.PLANNED}
    if not open_ids:
        return {}
    found: dict[str, dict[str, Any]] = {}
    # One bucket per open batch is read, not the whole history.
    rows = [r for batch_id in sorted(open_ids) for r in store.history(batch_id=batch_id)]
    for row in sorted(rows, key=lambda r: r["at"]):
        if row["event"] != "BATCH_STUCK":
            continue
        detail: object = json.loads(row["detail"]) if row.get("detail") else {}
        fields = cast("dict[str, Any]", detail) if isinstance(detail, dict) else {}
        found[row["batch_id"]] = {"at": row["at"], **fields}
    stuck: dict[str, dict[str, Any]] = {}
    for batch_id, detail in found.items():
        attempts = store.checkpoints(batch_id=batch_id)
        if any(c.started_at > detail["at"] for c in attempts):
            continue  # re-executed since: running or failing again, not given up
        failed = [c for c in attempts if c.status is CheckpointStatus.FAILED and c.error]
        if detail.get("cause") == "deaths":
            # Its runs died: no error of theirs to show, the recorded reason names the deaths.
            reason = detail.get("reason")
        else:
            reason = (
                detail.get("message")
                or (failed[-1].error if failed else None)
                or detail.get("reason")  # never none: the coordinator's own words
            )
        fix = detail.get("fix")
        if fix is None and reason and " Fix: " in reason:
            # The error names its own fix (our errors end with it): that is the advice.
            reason, fix = reason.rsplit(" Fix: ", 1)
        stuck[batch_id] = {
            "since": f"{detail['at']:%Y-%m-%d %H:%M:%S}",
            "failed_runs": detail.get("failed_runs"),
            "deaths": detail.get("deaths") or [],
            "pipelines": detail.get("pipelines"),
            "terminal": detail.get("terminal"),
            "reason": reason,
            "fix": fix or STUCK_FIX,
        }
    return stuck
