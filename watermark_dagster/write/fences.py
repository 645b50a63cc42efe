"""What a target says about a batch's write, through the pipeline's Delta transaction
(application id = pipeline, version = batch position, :func:`transaction_app_id`) and the
labels of its commits: whether the write already landed (:func:`applied_by_target`), and
fences.

A forced change that abandons a batch fences its targets (:func:`fence_target`): an empty
commit records the batch's transaction, so a run of that batch still in flight, whatever
it checked before, cannot commit afterwards; Delta skips its write, or fails it when it
read the target before the fence landed (:func:`refuse_fenced` says so).
"""

from collections.abc import Mapping
from dataclasses import dataclass

from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import SparkSession

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.errors import BatchStateError, TerminalError
from watermark_dagster.write.commits import (
    existing_target,
    fence_label,
    fenced,
    label_prefix,
    labelled_commit,
)


def transaction_app_id(pipeline: Pipeline) -> str:
    """The Delta transaction application id of a pipeline's append and overwrite writes."""
    return f"watermark:{pipeline.name}"


def applied_by_target(pipeline: Pipeline, batch_id: str, write_seq: int) -> str | None:
    """What shows that ``pipeline``'s target already holds its write for batch
    ``batch_id`` (at position ``write_seq``), or None when nothing does.

    A run killed between its target commit and its SUCCESS checkpoint leaves this evidence:
    a commit labelled with the pipeline and the batch (its data commit, never a preparatory
    one), or, when that label is older than the commits read, the Delta transaction of the
    pipeline at the batch's position or later (no later batch is planned while this one is
    open). A fence (:func:`fence_target`) records the transaction too, without rows: a
    fenced batch has no evidence. A write that committed nothing leaves none, and
    re-reading its range writes nothing twice either.
    """
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    table = existing_target(pipeline.target, options)
    return None if table is None else evidence_in(table, pipeline, batch_id, write_seq)


def evidence_in(
    table: RsDeltaTable, pipeline: Pipeline, batch_id: str, write_seq: int
) -> str | None:
    """:func:`applied_by_target` on a target's log already opened."""
    version = labelled_commit(table, label_prefix(pipeline.name, batch_id))
    if version is not None:
        return f"the target's version {version} was written by {pipeline.name} for {batch_id}"
    if fenced(table, pipeline.name, batch_id) is not None:
        return None
    app_id = transaction_app_id(pipeline)
    applied = table.transaction_version(app_id)
    if applied is not None and applied >= write_seq:
        return f"the target's Delta transaction {app_id} is at {applied} (batch at {write_seq})"
    return None


def _fenced_error(pipeline: str, batch_id: str, version: int) -> BatchStateError:
    return BatchStateError(
        f"Batch {batch_id} was abandoned by a forced change: pipeline '{pipeline}''s target "
        f"is fenced against it (its version {version}); its output was not written.",
        pipeline=pipeline,
        batch_id=batch_id,
        fix="nothing to do once the forced change has finished: the next batch reads the "
        "abandoned batch's ranges again. If the change was interrupted, run it again.",
    )


def refuse_fenced(table: RsDeltaTable, pipeline: Pipeline, batch_id: str) -> None:
    """Raise when a forced change fenced ``pipeline``'s target against ``batch_id``: a
    write Delta skipped for that reason was not applied, and must not be reported so.

    Raises:
        BatchStateError: the target holds a fence for the batch.
    """
    version = fenced(table, pipeline.name, batch_id)
    if version is not None:
        raise _fenced_error(pipeline.name, batch_id, version)


@dataclass(frozen=True)
class Fence:
    """What :func:`fence_target` found or did: ``fenced`` (the target's version holding
    the fence; ``new`` when this call committed it), ``applied`` (the batch's write landed
    first: its evidence), or neither (no target yet)."""

    fenced: int | None = None
    applied: str | None = None
    new: bool = False


def fence_target(spark: SparkSession, pipeline: Pipeline, batch_id: str, write_seq: int) -> Fence:
    """Make sure no write of batch ``batch_id`` lands in ``pipeline``'s target from now on.

    An empty append records the pipeline's Delta transaction at ``write_seq`` (labelled
    as a fence, which is never evidence). Every write of a scheduled batch carries that
    transaction, so Delta skips a later attempt of the batch, and fails (concurrent
    transaction) one that read the target before the fence committed. When the batch's
    write landed first, the fence commits nothing and the evidence is returned: the
    caller records the pipeline as succeeded instead.

    A target that does not exist yet is not fenced (there is no log to commit to): a late
    first write that creates it is found by the next plan, which reloads the target in full
    (:func:`~watermark_dagster.operations.coordinate.reloads_after_abandon`).
    """
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    table = existing_target(pipeline.target, options)
    if table is None:
        return Fence()
    evidence = evidence_in(table, pipeline, batch_id, write_seq)
    if evidence is not None:
        return Fence(applied=evidence)
    existing = fenced(table, pipeline.name, batch_id)
    if existing is not None:  # an interrupted forced change fenced it already
        return Fence(fenced=existing)
    before = table.version()
    label = fence_label(pipeline.name, batch_id, write_seq)
    writer = (
        spark.read.format("delta")
        .load(pipeline.target)
        .limit(0)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", transaction_app_id(pipeline))
        .option("txnVersion", write_seq)
        .option("userMetadata", label)
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save(pipeline.target)
    table.update_incremental()
    version = fenced(table, pipeline.name, batch_id, newest=max(1, table.version() - before))
    if version is not None:
        return Fence(fenced=version, new=True)
    evidence = evidence_in(table, pipeline, batch_id, write_seq)
    if evidence is not None:  # the batch's write won the race: Delta skipped the fence
        return Fence(applied=evidence)
    raise TerminalError(
        f"Pipeline '{pipeline.name}': the fence against batch {batch_id} was not committed to "
        f"{pipeline.target}, and the target records no write of the batch either.",
        pipeline=pipeline.name,
        batch_id=batch_id,
        fix="run the forced change again; report it if it persists.",
    )
