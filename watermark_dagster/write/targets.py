"""Writing a batch's output to a pipeline's target: merge, append or overwrite.

Each write is idempotent, so a batch retried after a crash between the target commit and
its checkpoint changes nothing the second time (I4):

* merge keeps per row the batch position that wrote it and only takes newer changes;
* append and overwrite carry Delta transaction identifiers (application id = pipeline,
  version = batch position): a batch whose transaction the target already records is not
  written again, and not even computed.

Each write evaluates the transform once (persisted, then one aggregate for every count and
check), commits nothing when there is nothing to change, and reports the metrics of its
own commits only.
"""

import logging
from collections.abc import Mapping, Sequence

from deltalake import DeltaTable as RsDeltaTable
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
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
from watermark_dagster.errors import TerminalError
from watermark_dagster.read.changes import is_delete, quoted, quoted_identifier
from watermark_dagster.write.commits import (
    WriteResult,
    commits_since,
    existing_target,
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
) -> WriteResult:
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
    if overwrite:
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
    an append or overwrite's Delta transaction (``txnAppId``/``txnVersion``) at the
    batch's position or later (no later batch is planned while this one is open), or a
    commit labelled with the pipeline and the batch (a MERGE writes no transaction). A
    write that committed nothing leaves none, and re-reading its range writes nothing
    twice either.
    """
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    table = existing_target(pipeline.target, options)
    if table is None:
        return None
    app_id = transaction_app_id(pipeline)
    applied = table.transaction_version(app_id)
    if applied is not None and applied >= write_seq:
        return f"the target's Delta transaction {app_id} is at {applied} (batch at {write_seq})"
    prefix = label_prefix(pipeline.name, batch_id)
    version = labelled_commit(table, prefix)
    if version is not None:
        return f"the target's version {version} was written by {pipeline.name} for {batch_id}"
    return None


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
    if full_load or pipeline.write is not WriteMode.MERGE:
        overwrite = full_load or pipeline.write is WriteMode.OVERWRITE
        return _txn_write(
            spark, output, pipeline, batch_id=batch_id, write_seq=write_seq, overwrite=overwrite
        )
    if retried:
        options = resolved_options(pipeline.storage_options) or {}
        table = existing_target(pipeline.target, options)
        version = (
            None if table is None else labelled_commit(table, label_prefix(pipeline.name, batch_id))
        )
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
        storage_options=resolved_options(pipeline.storage_options),
        partition_by=pipeline.partition_by,
        cluster_by=pipeline.cluster_by,
        insert_missing=not replay,
    )


__all__: Sequence[str] = [
    "WriteResult",
    "applied_by_target",
    "transaction_app_id",
    "write_target",
]
