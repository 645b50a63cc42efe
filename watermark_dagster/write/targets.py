"""Writing a batch's output to a pipeline's target: merge, append or overwrite.

Each write is idempotent, so a batch retried after a crash between the target commit and
its checkpoint changes nothing the second time (I4):

* merge keeps per row the batch position that wrote it and only takes newer changes;
* every write of a scheduled batch carries a Delta transaction identifier (application
  id = pipeline, version = batch position): a batch whose transaction the target already
  records is not written again (an append or overwrite is not even computed).

A forced change that abandons a batch fences its targets (:func:`fence_target`): an empty
commit records the batch's transaction, so a run of that batch still in flight, whatever
it checked before, cannot commit afterwards; Delta skips its write, or fails it when it
read the target before the fence landed.

Each write evaluates the transform once (persisted, then one aggregate for every count and
check), commits nothing when there is nothing to change, and reports the metrics of its
own commits only.
"""

import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from deltalake import DeltaTable as RsDeltaTable
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from watermark_dagster.config.names import validate_name
from watermark_dagster.config.pipeline import Pipeline, WriteMode
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.core.columns import (
    BATCH_COLUMN,
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    SEQ_COLUMN,
)
from watermark_dagster.core.faults import fault_point
from watermark_dagster.errors import BatchStateError, RetryableError, TerminalError
from watermark_dagster.read.changes import is_delete, quoted, quoted_identifier
from watermark_dagster.write.commits import (
    WriteResult,
    commits_since,
    existing_target,
    fence_label,
    fenced,
    label_prefix,
    labelled_commit,
    labelled_commits,
    new_label,
    preparing,
)
from watermark_dagster.write.layout import (
    create_target,
    delta_location,
    laid_out,
    rows_per_file,
    target_layout,
)
from watermark_dagster.write.merge import (
    duplicate_key_error,
    merge_into_target,
    prepare_changes,
)
from watermark_dagster.write.summary import summarize

log = logging.getLogger("watermark_dagster")


def _stamped(frame: DataFrame, write_seq: int, batch_id: str) -> DataFrame:
    return (
        frame.drop(COMMIT_VERSION, COMMIT_TIMESTAMP)
        .withColumn(SEQ_COLUMN, F.lit(write_seq).cast("long"))
        .withColumn(BATCH_COLUMN, F.lit(batch_id))
    )


def _without_deletes(frame: DataFrame) -> DataFrame:
    if CHANGE_TYPE not in frame.columns:
        return frame
    return frame.where(~is_delete(quoted(CHANGE_TYPE))).drop(CHANGE_TYPE)


def _append_delete_error(pipeline: Pipeline, batch_id: str) -> TerminalError:
    return TerminalError(
        f"Pipeline '{pipeline.name}' appends to its target, but its transform returned "
        "delete rows; an append target cannot delete.",
        pipeline=pipeline.name,
        batch_id=batch_id,
        fix="use write='merge' with key columns, or filter the deletes out.",
    )


def transaction_app_id(pipeline: Pipeline) -> str:
    """The Delta transaction application id of a pipeline's append and overwrite writes."""
    return f"watermark:{pipeline.name}"


def _txn_write(
    spark: SparkSession,
    output: DataFrame,
    pipeline: Pipeline,
    *,
    batch_id: str,
    write_seq: int,
    overwrite: bool,
) -> WriteResult:
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    app_id = transaction_app_id(pipeline)
    # The target's log, read once: the version before the write, Delta's transaction for
    # this pipeline, the files an overwrite must empty, and the commits the write made.
    table = existing_target(pipeline.target, options)
    if table is not None:
        applied = table.transaction_version(app_id)
        if applied is not None and applied >= write_seq:
            refuse_fenced(table, pipeline, batch_id)
            # One decision per write: a retry finishes what the committed write left.
            finish_layout(spark, pipeline, table)
            # Delta would skip this transaction anyway: skip computing it too.
            log.info(
                "pipeline=%s batch=%s: transaction %s/%d already committed",
                pipeline.name,
                batch_id,
                app_id,
                write_seq,
            )
            return WriteResult.nothing(table.version(), already_applied=True)
    merge = pipeline.write is WriteMode.MERGE
    if merge and overwrite and table is not None:
        return _rewrite(spark, output, pipeline, table, batch_id=batch_id, write_seq=write_seq)
    if merge:
        frame = prepare_changes(
            output,
            keys=pipeline.keys,
            batch_seq=write_seq,
            batch_id=batch_id,
            pipeline=pipeline.name,
        )
    else:
        frame = _stamped(output, write_seq, batch_id)
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        summary = summarize(
            frame,
            keys=pipeline.keys,
            check_duplicates=merge and COMMIT_VERSION not in output.columns,
        )
        error = duplicate_key_error(summary, pipeline=pipeline.name, batch_id=batch_id)
        if error is not None:
            raise error
        if not overwrite and summary.deletes:
            raise _append_delete_error(pipeline, batch_id)
        rows = _without_deletes(frame)
        return _commit(
            spark,
            rows,
            pipeline,
            count=summary.upserts,
            table=table,
            overwrite=overwrite,
            label=new_label(pipeline.name, batch_id, write_seq),
            app_id=app_id,
            write_seq=write_seq,
        )
    finally:
        frame.unpersist()


# Spark's error when a rewrite's output holds several rows of one key starts with this,
# followed by the key as JSON: the write job itself fails, so Delta commits nothing.
DUPLICATE_KEY_MARKER = "watermark-duplicate-key:"
_KEY_ROWS = "_wm_key_rows"


def refusing_duplicate_keys(frame: DataFrame, keys: Sequence[str]) -> DataFrame:
    """``frame``, failing the Spark job that reads it at the first key with several rows
    (``DUPLICATE_KEY_MARKER`` and the key): the duplicate check of a write that is not
    persisted and summarised first. NULL keys are one key, as the MERGE matches them."""
    columns = [quoted(k) for k in keys]
    rows = F.count(F.lit(1)).over(Window.partitionBy(*columns))
    message = F.concat(
        F.lit(DUPLICATE_KEY_MARKER), F.to_json(F.struct(*columns), {"ignoreNullFields": "false"})
    )
    refused = F.when(F.col(_KEY_ROWS) > 1, F.raise_error(message)).otherwise(F.lit(True))
    return frame.withColumn(_KEY_ROWS, rows).where(refused).drop(_KEY_ROWS)


def duplicate_key_in(error: BaseException) -> dict[str, Any] | None:
    """The key :func:`refusing_duplicate_keys` failed a job at, read from Spark's error
    (a Py4J or a Spark Connect one); None for any other error."""
    text = str(error)
    at = text.find(DUPLICATE_KEY_MARKER)
    if at < 0:
        return None
    try:
        found, _ = json.JSONDecoder().raw_decode(text[at + len(DUPLICATE_KEY_MARKER) :])
    except ValueError:
        return {"key": text[at + len(DUPLICATE_KEY_MARKER) :][:200]}
    return found if isinstance(found, dict) else {"key": found}


def _rewrite(
    spark: SparkSession,
    output: DataFrame,
    pipeline: Pipeline,
    table: RsDeltaTable,
    *,
    batch_id: str,
    write_seq: int,
) -> WriteResult:
    """Overwrite an existing target with ``output`` (the full transform's rows), every row
    stamped with ``write_seq``, in one commit carrying the batch's Delta transaction.

    Computed once, by the write's own job: no persisted copy and no summary job before
    it. A key with several rows fails that job (:func:`refusing_duplicate_keys`) and
    nothing is committed; the rows written are counted by Delta's commit metrics. The
    files are not range-partitioned by the clustering columns, as a first load's are: at
    2M rows that layout cost as much again as the check's own shuffle (a MERGE into the
    target then reads more files; `OPTIMIZE` clusters them).

    Raises:
        TerminalError: several rows of one key (without ``_commit_version``), or delete
            rows with a key column missing.
    """
    frame = prepare_changes(
        output,
        keys=pipeline.keys,
        batch_seq=write_seq,
        batch_id=batch_id,
        pipeline=pipeline.name,
    )
    if COMMIT_VERSION not in output.columns:  # else prepare_changes kept one row per key
        frame = refusing_duplicate_keys(frame, pipeline.keys)
    try:
        return _commit(
            spark,
            _without_deletes(frame),
            pipeline,
            count=0,
            counted=False,
            table=table,
            overwrite=True,
            label=new_label(pipeline.name, batch_id, write_seq),
            app_id=transaction_app_id(pipeline),
            write_seq=write_seq,
        )
    except Exception as e:
        duplicate = duplicate_key_in(e)
        if duplicate is None:
            raise
        error = duplicate_key_error(duplicate, pipeline=pipeline.name, batch_id=batch_id)
        assert error is not None
        raise error from None


def _commit(
    spark: SparkSession,
    rows: DataFrame,
    pipeline: Pipeline,
    *,
    count: int,
    table: RsDeltaTable | None,
    overwrite: bool,
    label: str,
    app_id: str,
    write_seq: int,
    counted: bool = True,
) -> WriteResult:
    """Commit ``rows``: ``count`` of them, laid out here for an overwrite; when not
    ``counted`` (a rewrite), neither laid out nor skipped when it may be empty."""
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    target = pipeline.target
    before = None if table is None else table.version()
    exists = table is not None
    replace_schema = (
        overwrite and exists and not _only_adds(read_schema(spark, target), rows.schema)
    )
    # Nothing to add; an overwrite still has to empty a target that holds rows.
    if (
        table is not None
        and counted
        and count == 0
        and not replace_schema
        and (not overwrite or not table.file_uris())
    ):
        log.info("pipeline=%s: empty output; nothing committed to %s", pipeline.name, target)
        return WriteResult.nothing(table.version())
    layout = target_layout(
        spark,
        rows.schema,
        keys=pipeline.keys,
        merge=pipeline.write is WriteMode.MERGE,
        partition_by=pipeline.partition_by,
        cluster_by=pipeline.cluster_by,
    )
    if overwrite and counted:
        rows = laid_out(spark, rows, count, layout)
    writer = (
        rows.write.format("delta")
        .mode("overwrite" if overwrite else "append")
        .option("txnAppId", app_id)
        .option("txnVersion", write_seq)
    )
    if overwrite and layout.cluster_by:
        writer = writer.option("maxRecordsPerFile", rows_per_file(spark))
    for key, value in options.items():
        writer = writer.option(key, value)
    with labelled_commits(spark, label):
        if not exists and layout.cluster_by:
            # The DataFrame writer cannot cluster: create the empty clustered table first.
            with preparing(spark):
                create_target(spark, target, rows.schema, layout)
            fault_point("after_target_create", where=pipeline.name)
            exists = True
            writer = writer.option("mergeSchema", "true")
            if overwrite:
                writer = writer.option("replaceWhere", "true")
        elif not exists:
            for key, value in (layout.properties or {}).items():
                writer = writer.option(key, value)
            if layout.partition_by:
                writer = writer.partitionBy(*layout.partition_by)
        elif replace_schema:
            # A reload whose columns changed type or disappeared (an upstream's schema
            # changed and the pipeline was reset) replaces the schema, which also clears
            # clustering.
            writer = writer.option("overwriteSchema", "true")
            if pipeline.partition_by:
                writer = writer.partitionBy(*pipeline.partition_by)
        else:
            # New output columns are added. An overwrite replaces the rows only ("true"
            # matches every row): a plain overwrite would also drop the table's clustering.
            writer = writer.option("mergeSchema", "true")
            if overwrite:
                writer = writer.option("replaceWhere", "true")
        # Clustering cleared by a schema replacement is set again, on tables that had it.
        recluster_by = ()
        if replace_schema and (pipeline.cluster_by or _is_clustered(table)):
            recluster_by = layout.cluster_by
        writer.save(target)
        if recluster_by:
            recluster(spark, target, recluster_by)
    version, commits = commits_since(target, options, before, label, table=table)
    if not commits:
        # Delta skipped the write: a concurrent attempt committed this transaction first.
        return WriteResult.nothing(version, already_applied=True)
    return WriteResult.from_commits(version, commits, created=before is None)


def _is_clustered(table: RsDeltaTable | None) -> bool:
    """True when the target (as it was before the write) is clustered."""
    if table is None:
        return False
    protocol = table.protocol()
    return "clustering" in (protocol.writer_features or [])


def clustering_columns(spark: SparkSession, target: str) -> tuple[str, ...]:
    """The target's clustering columns now (Delta's table detail)."""
    detail = spark.sql("DESCRIBE DETAIL " + delta_location(target)).first()
    columns = None if detail is None else detail["clusteringColumns"]
    return tuple(columns or ())


def finish_layout(spark: SparkSession, pipeline: Pipeline, table: RsDeltaTable) -> None:
    """Set the clustering again on a target a committed write left without it: an overwrite
    that replaced the schema clears clustering and sets it back in a second statement,
    and a run killed between the two, retried, skips the committed write (its Delta
    transaction). Only a target that was clustered (its protocol says so) and whose layout
    asks for clustering columns, when it has none now."""
    if not _is_clustered(table):
        return
    layout = target_layout(
        spark,
        read_schema(spark, pipeline.target),
        keys=pipeline.keys,
        merge=pipeline.write is WriteMode.MERGE,
        partition_by=pipeline.partition_by,
        cluster_by=pipeline.cluster_by,
    )
    if layout.cluster_by and not clustering_columns(spark, pipeline.target):
        log.info(
            "pipeline=%s: target %s lost its clustering in a write that was not finished; "
            "clustering it by %s again",
            pipeline.name,
            pipeline.target,
            list(layout.cluster_by),
        )
        recluster(spark, pipeline.target, layout.cluster_by)


def read_schema(spark: SparkSession, target: str) -> StructType:
    """The target's current schema."""
    return spark.read.format("delta").load(target).schema


def _only_adds(old: StructType, new: StructType) -> bool:
    """True when ``new`` keeps every column of ``old`` with the same type."""
    types = {f.name: f.dataType for f in new.fields}
    return all(types.get(f.name) == f.dataType for f in old.fields)


def recluster(spark: SparkSession, target: str, cluster_by: Sequence[str]) -> None:
    """Set the clustering columns again (replacing a schema clears them). No API does
    this, and Delta's ALTER TABLE takes no parameter markers here, so the statement is
    built only from quoted identifiers: the location with backticks escaped, and column
    names validated as plain identifiers."""
    columns = ", ".join(
        quoted_identifier(validate_name("cluster_by column", c)) for c in cluster_by
    )
    spark.sql("ALTER TABLE " + delta_location(target) + " CLUSTER BY (" + columns + ")")


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
    return None if table is None else _evidence(table, pipeline, batch_id, write_seq)


def _evidence(table: RsDeltaTable, pipeline: Pipeline, batch_id: str, write_seq: int) -> str | None:
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
    evidence = _evidence(table, pipeline, batch_id, write_seq)
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
    evidence = _evidence(table, pipeline, batch_id, write_seq)
    if evidence is not None:  # the batch's write won the race: Delta skipped the fence
        return Fence(applied=evidence)
    raise TerminalError(
        f"Pipeline '{pipeline.name}': the fence against batch {batch_id} was not committed to "
        f"{pipeline.target}, and the target records no write of the batch either.",
        pipeline=pipeline.name,
        batch_id=batch_id,
        fix="run the forced change again; report it if it persists.",
    )


# Delta's optimistic concurrency: another writer committed to the target between this
# write's read and its commit, in a way that conflicts with it (Delta 4's error classes
# and exception names, as they reach Python through Py4J or Spark Connect).
_CONFLICTS = (
    "DELTA_CONCURRENT_",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
)
# How many times one write is decided again after losing a commit race, and the first
# pause (doubled each time, with jitter): two or three runs replaying into one target
# (a backfill) settle within a few attempts.
CONFLICT_ATTEMPTS = 6
CONFLICT_PAUSE_SECONDS = 0.5


def is_write_conflict(error: BaseException) -> bool:
    """Whether ``error`` is Delta's concurrent-modification conflict on a commit: another
    writer won, and the same write decided again on the new version may succeed."""
    text = f"{type(error).__name__}: {error}"
    return any(marker in text for marker in _CONFLICTS)


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

    Returns:
        What this write committed (``committed`` is False when it committed nothing: an
        empty output, changes older than the target's rows, or an already applied batch).
    """
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}

    def write(retried: bool) -> WriteResult:
        if full_load or pipeline.write is not WriteMode.MERGE:
            overwrite = full_load or pipeline.write is WriteMode.OVERWRITE
            return _txn_write(
                spark, output, pipeline, batch_id=batch_id, write_seq=write_seq, overwrite=overwrite
            )
        if retried:
            table = existing_target(pipeline.target, options)
            prefix = label_prefix(pipeline.name, batch_id)
            version = None if table is None else labelled_commit(table, prefix)
            if table is not None and version is not None:
                # One decision per write: the MERGE landed before the crash; doing it again
                # would commit the same changes twice to the target's change feed.
                log.info(
                    "pipeline=%s batch=%s: its MERGE is the target's version %d already; "
                    "not merged again",
                    pipeline.name,
                    batch_id,
                    version,
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
            transaction=None if replay else (transaction_app_id(pipeline), write_seq),
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
                refuse_fenced(table, pipeline, batch_id)
            if not is_write_conflict(e):
                raise
            conflicts += 1
            if conflicts >= CONFLICT_ATTEMPTS:
                raise _conflict_error(pipeline, batch_id, conflicts, e) from e
            # Decided again on the target's new version: an append or overwrite finds its
            # transaction if it did commit, a MERGE its labelled commit; a replay's MERGE
            # is ordered by the _wm_seq guard whatever it races with.
            pause = CONFLICT_PAUSE_SECONDS * 2 ** (conflicts - 1) * (0.5 + random.random())
            log.warning(
                "pipeline=%s batch=%s: a concurrent writer committed to %s first (%s); "
                "writing again in %.1f s (attempt %d of %d)",
                pipeline.name,
                batch_id,
                pipeline.target,
                type(e).__name__,
                pause,
                conflicts + 1,
                CONFLICT_ATTEMPTS,
            )
            time.sleep(pause)
    if conflicts:
        result = replace(result, conflicts=conflicts)
    if not result.committed and not replay:
        # Delta skips a write whose transaction the target records: a fence is no write.
        table = existing_target(pipeline.target, options)
        if table is not None:
            refuse_fenced(table, pipeline, batch_id)
    return result


__all__: Sequence[str] = [
    "WriteResult",
    "Fence",
    "applied_by_target",
    "fence_target",
    "refuse_fenced",
    "transaction_app_id",
    "write_target",
]
