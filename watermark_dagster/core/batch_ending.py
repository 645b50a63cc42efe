"""How a batch ends, in plain Python (no Dagster, Spark or delta-rs): the status its rows
add up to (:func:`batch_status`), and which status changes are allowed
(:func:`decide_status_change`).
"""

from collections.abc import Collection

from watermark_dagster.core.records import Batch, BatchKind, BatchStatus
from watermark_dagster.errors import BatchStateError

# Rows of a batch change status together; a mix means a write was cut short, and the
# least finished status is the truth.
_STATUS_PRECEDENCE = (
    BatchStatus.PLANNED,
    BatchStatus.FAILED,
    BatchStatus.ABANDONED,
    BatchStatus.COMPLETED,
)


def batch_status(row_statuses: Collection[BatchStatus]) -> BatchStatus:
    """The status of a batch whose rows have ``row_statuses`` (the least finished)."""
    return next(s for s in _STATUS_PRECEDENCE if s in row_statuses)


def decide_status_change(
    batch: Batch, row_statuses: Collection[BatchStatus], status: BatchStatus
) -> bool:
    """Whether ``batch`` (with rows in ``row_statuses``) is to become ``status``.

    Returns:
        False when every row has ``status`` already (nothing to write), else True.

    Raises:
        BatchStateError: the batch already ended (a batch ends once: a finalizer and a
            `watermark set --force` that both saw it open cannot both end it), or a
            scheduled batch would complete with a ranged upstream not advanced.
    """
    if set(row_statuses) == {status}:
        return False
    if batch.status in (BatchStatus.COMPLETED, BatchStatus.ABANDONED):
        raise BatchStateError(
            f"Batch {batch.batch_id} is already {batch.status.value}; it cannot become "
            f"{status.value}.",
            batch_id=batch.batch_id,
            fix="list it with `watermark batch` and act on the next batch.",
        )
    if status is BatchStatus.COMPLETED and batch.kind is BatchKind.SCHEDULED:
        pending = [u for u in batch.ranged_upstreams if u not in batch.advanced]
        if pending:
            raise BatchStateError(
                f"Batch {batch.batch_id} cannot complete: upstream(s) {pending} not advanced.",
                batch_id=batch.batch_id,
            )
    return True
