"""Writing a batch's output to a pipeline's target: merge, append or overwrite
(:func:`write_target`), decided again when a concurrent writer wins the commit race.

Each write is idempotent, so a batch retried after a crash between the target commit and
its checkpoint changes nothing the second time (I4):

* merge keeps per row the batch position that wrote it and only takes newer changes
  (:mod:`~watermark_dagster.write.merge`);
* every write of a scheduled batch carries a Delta transaction identifier (application
  id = control root and pipeline, version = batch position): a batch whose transaction
  the target already records is not written again (an append or overwrite is not even
  computed: :mod:`~watermark_dagster.write.append_overwrite`);
* a target whose records another control root wrote, or this root ahead of the batch, is
  refused before anything is skipped (:mod:`~watermark_dagster.write.fences`).

A write of a batch a forced change fenced the target against fails
(:mod:`~watermark_dagster.write.fences`).
"""

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import DataFrame, SparkSession

from watermark_dagster.config.pipeline import Pipeline, WriteMode
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.core.records import TargetMark
from watermark_dagster.errors import BatchStateError, RetryableError
from watermark_dagster.frames.delta import existing_target, is_write_conflict
from watermark_dagster.write.append_overwrite import append_or_overwrite
from watermark_dagster.write.commits import UNBOUND_ROOT, WriteResult, labelled_commit, root_prefix
from watermark_dagster.write.fences import (
    check_target_bound,
    evidence_in,
    refuse_fenced,
    transaction_app_id,
)
from watermark_dagster.write.merge import merge_into_target

log = logging.getLogger("watermark_dagster")


# How many times one write is decided again after losing a commit race, and the first
# pause (doubled each time, with jitter): two or three runs replaying into one target
# (a backfill) settle within a few attempts.
CONFLICT_ATTEMPTS = 6
CONFLICT_PAUSE_SECONDS = 0.5


def _conflict_error(
    pipeline: Pipeline, batch_id: str, attempts: int, error: Exception
) -> RetryableError:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return RetryableError(
        f"Pipeline '{pipeline.name}': its write of batch {batch_id} to {pipeline.target} lost "
        f"{attempts} commit races in a row to concurrent writers of the target ({first[:300]}).",
        pipeline=pipeline.name,
        batch_id=batch_id,
        fix="something else writes this target continuously (another job, or many runs of "
        "this pipeline at once); the batch is retried by the coordinator, or re-run the "
        "partition once the other writers are done.",
    )


def _merge_evidence(
    table: RsDeltaTable,
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    root: str,
    *,
    replay: bool,
    first: TargetMark | None = None,
) -> str | None:
    """What shows that a retried MERGE of ``batch_id`` already landed, or None.

    A scheduled batch's write carries the pipeline's Delta transaction at its position, so
    when its labelled commit is older than the commits read, the transaction still shows
    it (:func:`~watermark_dagster.write.fences.evidence_in`; a fence is no evidence). A
    replay writes below the target's transaction: only its own labelled commit shows it.
    """
    if not replay:
        return evidence_in(table, pipeline, batch_id, write_seq, root, since=first)
    version = labelled_commit(table, root_prefix(pipeline.name, batch_id, root))
    if version is None or (first is not None and first.before(version)):
        return None
    return f"the target's version {version}"


def _pause_after_conflict(
    pipeline: Pipeline, batch_id: str, error: Exception, conflicts: int
) -> None:
    """Wait before writing again after the ``conflicts``-th lost commit race (doubled each
    time, with jitter), saying so."""
    pause = CONFLICT_PAUSE_SECONDS * 2 ** (conflicts - 1) * (0.5 + random.random())
    log.warning(
        "pipeline=%s batch=%s: a concurrent writer committed to %s first (%s); "
        "writing again in %.1f s (attempt %d of %d)",
        pipeline.name,
        batch_id,
        pipeline.target,
        type(error).__name__,
        pause,
        conflicts + 1,
        CONFLICT_ATTEMPTS,
    )
    time.sleep(pause)


def target_writer(pipeline: Pipeline) -> "Callable[..., WriteResult]":
    """The function writing ``pipeline``'s batches: :func:`write_target` for a Delta target,
    :func:`~watermark_dagster.write.warehouse.write_warehouse` for a warehouse table (both
    take the same arguments)."""
    if pipeline.warehouse is None:
        return write_target
    from watermark_dagster.write.warehouse import write_warehouse

    return write_warehouse


def write_target(
    spark: SparkSession,
    output: DataFrame,
    pipeline: Pipeline,
    *,
    batch_id: str,
    write_seq: int,
    full_load: bool,
    replay: bool = False,
    retried: bool = False,
    root: str = UNBOUND_ROOT,
    first: TargetMark | None = None,
    known_keys: Sequence[tuple[object, ...]] | None = None,
) -> WriteResult:
    """Write the transform's ``output`` for one batch to the pipeline's target.

    Args:
        spark: the session the write runs in.
        output: the transform's output (changes, or the full table for a full load).
        pipeline: the pipeline whose target is written, with its write mode and keys.
        batch_id: the batch written; it labels the rows and the commit, and names errors.
        write_seq: the batch position the rows carry (``Batch.write_seq``).
        full_load: the batch reloads the pipeline from snapshots: the target is replaced.
        replay: a REPLAY batch: a merge does not insert keys the target lacks.
        retried: an earlier attempt of this batch's write may have committed (a run that
            died after its target commit): a MERGE first looks for its data commit in the
            target's log and makes no second one (an append or overwrite has Delta's
            transaction id for that).
        root: the id of the control root that scheduled the batch
            (:meth:`~watermark_dagster.store.tables.ControlTables.root_id`); it names the
            write's Delta transaction and labels.
        first: the target as the batch's first attempt found it: only what landed after
            it is this batch's write (:class:`~watermark_dagster.core.records.TargetMark`).
        known_keys: the output's keys, one per change, when the driver holds them
            (:class:`~watermark_dagster.read.derive.DerivedOutput`): a MERGE then takes
            its key ranges from them instead of a job of its own.

    Returns:
        What this write committed (``committed`` is False when it committed nothing: an
        empty output, changes older than the target's rows, or an already applied batch).

    Raises:
        TargetBoundElsewhereError: the target records a position this root did not
            schedule (:func:`~watermark_dagster.write.fences.refuse_bound_elsewhere`),
            checked before anything is skipped or written.
    """
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    # A target another control root wrote last: refused before any decision that the batch
    # is already applied. The positions (this root ahead of the batch: restored) are
    # checked by the run (operations/run_pipeline.py), which knows the batch's attempt;
    # direct callers may write an older position on purpose (the _wm_seq guard's tests).
    check_target_bound(pipeline, batch_id, write_seq, root, first_attempt=False, replay=True)

    def write(retried: bool) -> WriteResult:
        if full_load or pipeline.write is not WriteMode.MERGE:
            overwrite = full_load or pipeline.write is WriteMode.OVERWRITE
            return append_or_overwrite(
                spark,
                output,
                pipeline,
                batch_id=batch_id,
                write_seq=write_seq,
                overwrite=overwrite,
                root=root,
            )
        table = existing_target(pipeline.target, options) if retried else None
        if table is not None:
            evidence = _merge_evidence(
                table, pipeline, batch_id, write_seq, root, replay=replay, first=first
            )
            if evidence is not None:
                # One decision per write: the MERGE landed before the crash; doing it again
                # would commit the same changes twice to the target's change feed.
                log.info(
                    "pipeline=%s batch=%s: its MERGE landed already (%s); not merged again",
                    pipeline.name,
                    batch_id,
                    evidence,
                )
                return WriteResult.nothing(table.version(), already_applied=True)
        return merge_into_target(
            spark,
            output,
            target=pipeline.target,
            keys=pipeline.keys,
            batch_seq=write_seq,
            batch_id=batch_id,
            pipeline=pipeline.name,
            storage_options=options,
            partition_by=pipeline.partition_by,
            cluster_by=pipeline.cluster_by,
            insert_missing=not replay,
            # A replay writes below the target's transaction: its _wm_seq guard orders it.
            transaction=None if replay else (transaction_app_id(pipeline, root), write_seq),
            change_feed=pipeline.feed_on_create,
            root=root,
            known_keys=known_keys,
        )

    conflicts = 0
    while True:
        try:
            result = write(retried or conflicts > 0)
            break
        except BatchStateError:
            raise
        except Exception as e:
            # A fence that landed while this write ran fails it (Delta's concurrent
            # transaction): say that, not Delta's conflict.
            if not replay and (table := existing_target(pipeline.target, options)) is not None:
                refuse_fenced(table, pipeline, batch_id, root)
            if not is_write_conflict(e):
                raise
            conflicts += 1
            if conflicts >= CONFLICT_ATTEMPTS:
                raise _conflict_error(pipeline, batch_id, conflicts, e) from e
            # Decided again on the target's new version: an append or overwrite finds its
            # transaction if it did commit, a MERGE its labelled commit; a replay's MERGE
            # is ordered by the _wm_seq guard whatever it races with.
            _pause_after_conflict(pipeline, batch_id, e, conflicts)
    if conflicts:
        result = replace(result, conflicts=conflicts)
    if not result.committed and not replay:
        # Delta skips a write whose transaction the target records: a fence is no write.
        table = existing_target(pipeline.target, options)
        if table is not None:
            refuse_fenced(table, pipeline, batch_id, root)
    return result
