"""The writes that go through Spark's DataFrame writer with the batch's Delta transaction
identifier (application id = control root and pipeline, version = batch position): an
append, an overwrite (a full load, or an overwrite pipeline), and a merge target's rewrite
by its full transform (:func:`append_or_overwrite`).

A batch whose transaction the target already records is not written again, nor even
computed. Each write evaluates the transform once (persisted, then one aggregate for every
count and check; a rewrite in its write's own job), commits nothing when there is nothing
to change, and reports the metrics of its own commits only.
"""

import logging
from collections.abc import Mapping

from deltalake import DeltaTable as RsDeltaTable
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

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
from watermark_dagster.frames.changes import is_delete, quoted
from watermark_dagster.frames.delta import existing_target
from watermark_dagster.write.clustering import finish_layout, is_clustered, read_schema, recluster
from watermark_dagster.write.commits import (
    UNBOUND_ROOT,
    WriteResult,
    commits_since,
    labelled_commits,
    new_label,
    preparing,
)
from watermark_dagster.write.duplicate_keys import duplicate_key_in, refusing_duplicate_keys
from watermark_dagster.write.fences import (
    legacy_app_id,
    refuse_fenced,
    transaction_app_id,
)
from watermark_dagster.write.layout import (
    create_target,
    laid_out,
    rows_per_file,
    target_layout,
)
from watermark_dagster.write.merge import (
    duplicate_key_error,
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


def append_or_overwrite(
    spark: SparkSession,
    output: DataFrame,
    pipeline: Pipeline,
    *,
    batch_id: str,
    write_seq: int,
    overwrite: bool,
    root: str = UNBOUND_ROOT,
) -> WriteResult:
    """Append ``output`` to the pipeline's target, or overwrite the target with it, in a
    commit carrying the batch's Delta transaction; nothing when the target records it.

    A merge pipeline's ``overwrite`` of an existing target is a rewrite (its rows stamped
    and checked for duplicate keys in the write's own job).

    Raises:
        TerminalError: several rows of one key, or delete rows an append cannot write.
        BatchStateError: a forced change fenced the target against the batch.
    """
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    app_id = transaction_app_id(pipeline, root)
    # The target's log, read once: the version before the write, Delta's transaction for
    # this pipeline, the files an overwrite must empty, and the commits the write made.
    table = existing_target(pipeline.target, options)
    if table is not None:
        applied = table.transaction_version(app_id)
        if applied is None:
            # A target an older release wrote records its transaction without the root;
            # a retry at that position is its write (refused elsewhere on a first attempt).
            applied = table.transaction_version(legacy_app_id(pipeline))
        if applied is not None and applied >= write_seq:
            refuse_fenced(table, pipeline, batch_id, root)
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
        return _rewrite(
            spark, output, pipeline, table, batch_id=batch_id, write_seq=write_seq, root=root
        )
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
            label=new_label(pipeline.name, batch_id, write_seq, root),
            app_id=app_id,
            write_seq=write_seq,
        )
    finally:
        frame.unpersist()


def _rewrite(
    spark: SparkSession,
    output: DataFrame,
    pipeline: Pipeline,
    table: RsDeltaTable,
    *,
    batch_id: str,
    write_seq: int,
    root: str,
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
            label=new_label(pipeline.name, batch_id, write_seq, root),
            app_id=transaction_app_id(pipeline, root),
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
        change_feed=pipeline.feed_on_create,
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
        if replace_schema and (pipeline.cluster_by or is_clustered(table)):
            recluster_by = layout.cluster_by
        writer.save(target)
        if recluster_by:
            recluster(spark, target, recluster_by)
    version, commits = commits_since(target, options, before, label, table=table)
    if not commits:
        # Delta skipped the write: a concurrent attempt committed this transaction first.
        return WriteResult.nothing(version, already_applied=True)
    return WriteResult.from_commits(version, commits, created=before is None)


def _only_adds(old: StructType, new: StructType) -> bool:
    """True when ``new`` keeps every column of ``old`` with the same type."""
    types = {f.name: f.dataType for f in new.fields}
    return all(types.get(f.name) == f.dataType for f in old.fields)
