"""What a pipeline applied: the one definition of "succeeded", and which batch it may apply.

Plain Python over the store's records, no I/O.

**Succeeded.** A pipeline succeeded for a batch when one of its ``pipeline_checkpoints``
rows for that batch id has status SUCCESS. The pipeline's run writes that row itself,
right after its target commit, in the same process: so a SUCCESS row never exists without
the target write, and the only gap is the other way round (a process killed between the
two), which the batch's retry closes without a second effect, because it writes at the
same position (merge: per-row source versions; append: the Delta transaction version of
the batch). The finalizer (advance), the coordinator (what to request again), the command
line (advance-before-abandon, ``verify``) and the I5 rule read this one fact. A Dagster
materialization of the batch partition is what the same run reports to Dagster *after*
recording the row; it is display, not evidence.
"""

from collections.abc import Callable, Iterable

from watermark_dagster.core.records import Batch, BatchKind, Checkpoint, CheckpointStatus


def has_succeeded(checkpoint: Checkpoint) -> bool:
    """True when this attempt succeeded: its target write is committed."""
    return checkpoint.status is CheckpointStatus.SUCCESS


def succeeded_pipelines(batch_id: str, checkpoints: Iterable[Checkpoint]) -> frozenset[str]:
    """The pipelines that succeeded for batch ``batch_id``: those with a SUCCESS
    checkpoint for it (rows of other batches are ignored).

    Args:
        batch_id: the batch (its id is also the Dagster partition key).
        checkpoints: checkpoint rows, e.g. ``store.checkpoints(batch_id=batch_id)``.
    """
    return frozenset(c.pipeline for c in checkpoints if c.batch_id == batch_id and has_succeeded(c))


def superseded_by(batch: Batch, newest_applied: Callable[[], Batch | None]) -> Batch | None:
    """I5: the newer batch that makes applying ``batch`` unsafe for a pipeline, else None.

    A pipeline may apply a SCHEDULED batch unless it already succeeded for a SCHEDULED batch
    with a higher sequence number (``newest_applied``): a backfill of an older batch must not
    overwrite what newer batches wrote, nor bring back rows they deleted, and the target
    already holds the older batch's effects. A REPLAY writes at the position of the batch it
    re-reads, so it is never superseded (its writes cannot overwrite newer rows).

    Args:
        batch: the batch about to be applied.
        newest_applied: returns the SCHEDULED batch with the highest sequence the pipeline
            succeeded for (by :func:`has_succeeded`), None before its first; only called
            when the answer matters (not for a replay), as it reads the pipeline's history.
    """
    if batch.kind is BatchKind.REPLAY:
        return None
    newest = newest_applied()
    if newest is None or newest.kind is not BatchKind.SCHEDULED or newest.seq <= batch.seq:
        return None
    return newest
