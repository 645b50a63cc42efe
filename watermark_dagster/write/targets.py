"""Writing a batch's output to a pipeline's target: merge, append or overwrite.

Each write is idempotent, so a batch retried after a crash between the target commit and
its checkpoint changes nothing the second time (I4):

* merge keeps per row the batch position that wrote it and only takes newer changes;
* append and overwrite carry Delta transaction identifiers (application id = pipeline,
  version = batch position): Delta itself skips a transaction it already committed.
"""

from collections.abc import Sequence

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from watermark_dagster.changes import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION
from watermark_dagster.errors import TerminalError
from watermark_dagster.registry import Pipeline, WriteMode, validate_name
from watermark_dagster.write.merge import (
    BATCH_COLUMN,
    SEQ_COLUMN,
    WriteResult,
    _last_commit_metrics,
    _q,
    create_clustered,
    merge_into_target,
    prepare_changes,
    target_version,
)

_DELETE = "delete"


def _stamped(frame: DataFrame, write_seq: int, batch_id: str) -> DataFrame:
    return (
        frame.drop(COMMIT_VERSION, COMMIT_TIMESTAMP)
        .withColumn(SEQ_COLUMN, F.lit(write_seq).cast("long"))
        .withColumn(BATCH_COLUMN, F.lit(batch_id))
    )


def _without_deletes(
    frame: DataFrame, pipeline: Pipeline, batch_id: str, *, full: bool
) -> DataFrame:
    if CHANGE_TYPE not in frame.columns:
        return frame
    is_delete = F.lower(F.col(_q(CHANGE_TYPE))) == _DELETE
    if not full and frame.where(is_delete).limit(1).count():
        raise TerminalError(
            f"Pipeline '{pipeline.name}' appends to its target, but its transform returned "
            "delete rows; an append target cannot delete.",
            pipeline=pipeline.name,
            batch_id=batch_id,
            fix="use write='merge' with key columns, or filter the deletes out.",
        )
    return frame.where(~is_delete | F.col(_q(CHANGE_TYPE)).isNull()).drop(CHANGE_TYPE)


def _txn_write(
    spark: SparkSession,
    rows: DataFrame,
    pipeline: Pipeline,
    *,
    mode: str,
    write_seq: int,
) -> WriteResult:
    options = dict(pipeline.storage_options or {})
    before = target_version(pipeline.target, options or None)
    writer = (
        rows.write.format("delta")
        .mode(mode)
        .option("txnAppId", f"watermark:{pipeline.name}")
        .option("txnVersion", write_seq)
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    exists = before is not None
    replace_schema = (
        mode == "overwrite"
        and exists
        and not _only_adds(read_schema(spark, pipeline.target), rows.schema)
    )
    if pipeline.cluster_by and not exists:
        # The DataFrame writer cannot cluster: create the empty clustered table first.
        create_clustered(spark, pipeline.target, rows.schema, pipeline.cluster_by)
        exists = True
    if not exists:
        writer = writer.partitionBy(*pipeline.partition_by) if pipeline.partition_by else writer
    elif replace_schema:
        # A reload whose columns changed type or disappeared (an upstream's schema changed
        # and the pipeline was reset) replaces the schema, which also clears clustering.
        writer = writer.option("overwriteSchema", "true")
        if pipeline.partition_by:
            writer = writer.partitionBy(*pipeline.partition_by)
    else:
        # New output columns are added. An overwrite replaces the rows only ("true"
        # matches every row): a plain overwrite would also drop the table's clustering.
        writer = writer.option("mergeSchema", "true")
        if mode == "overwrite":
            writer = writer.option("replaceWhere", "true")
    writer.save(pipeline.target)
    if replace_schema and pipeline.cluster_by:
        recluster(spark, pipeline.target, pipeline.cluster_by)
    version, metrics = _last_commit_metrics(pipeline.target, options or None)
    if version == before:
        # Delta skipped the write: this transaction (pipeline, batch) was committed before.
        return WriteResult(version, 0, 0, 0, created=False, already_applied=True)
    written = int(metrics.get("numOutputRows", 0))
    return WriteResult(
        target_version=version,
        rows_inserted=written,
        rows_updated=0,
        rows_deleted=0,
        created=before is None,
    )


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
    columns = ", ".join(_q(validate_name("cluster_by column", c)) for c in cluster_by)
    location = "delta.`" + target.replace("`", "``") + "`"
    spark.sql("ALTER TABLE " + location + " CLUSTER BY (" + columns + ")")


def write_target(
    spark: SparkSession,
    output: DataFrame,
    pipeline: Pipeline,
    *,
    batch_id: str,
    write_seq: int,
    full_load: bool,
    replay: bool = False,
) -> WriteResult:
    """Write the transform's ``output`` for one batch to the pipeline's target.

    Args:
        output: the transform's output (changes, or the full table for a full load).
        write_seq: the batch position the rows carry (``Batch.write_seq``).
        full_load: the batch reloads the pipeline from snapshots: the target is replaced.
        replay: a REPLAY batch: a merge does not insert keys the target lacks.
    """
    if full_load or pipeline.write is WriteMode.OVERWRITE:
        if pipeline.write is WriteMode.MERGE:
            output = prepare_changes(
                output,
                keys=pipeline.keys,
                batch_seq=write_seq,
                batch_id=batch_id,
                pipeline=pipeline.name,
            )
            rows = _without_deletes(output, pipeline, batch_id, full=True)
        else:
            rows = _stamped(
                _without_deletes(output, pipeline, batch_id, full=True), write_seq, batch_id
            )
        return _persisted_write(spark, rows, pipeline, mode="overwrite", write_seq=write_seq)
    if pipeline.write is WriteMode.APPEND:
        rows = _stamped(
            _without_deletes(output, pipeline, batch_id, full=False), write_seq, batch_id
        )
        return _persisted_write(spark, rows, pipeline, mode="append", write_seq=write_seq)
    return merge_into_target(
        spark,
        output,
        target=pipeline.target,
        keys=pipeline.keys,
        batch_seq=write_seq,
        batch_id=batch_id,
        pipeline=pipeline.name,
        storage_options=dict(pipeline.storage_options) if pipeline.storage_options else None,
        partition_by=pipeline.partition_by,
        cluster_by=pipeline.cluster_by,
        insert_missing=not replay,
    )


def _persisted_write(
    spark: SparkSession, rows: DataFrame, pipeline: Pipeline, *, mode: str, write_seq: int
) -> WriteResult:
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        rows.count()
        return _txn_write(spark, rows, pipeline, mode=mode, write_seq=write_seq)
    finally:
        rows.unpersist()


__all__: Sequence[str] = ["WriteResult", "write_target"]
