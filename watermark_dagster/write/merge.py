"""Merging a batch's changes into a pipeline's target table, idempotently.

The target keeps, per row, the sequence number of the batch that last wrote it
(``_wm_seq``). A change is applied only when its batch is at least as new as the row's,
so running the same batch twice (retry after a crash between the target commit and the
checkpoint) changes nothing the second time, and re-running an older batch cannot
overwrite what a newer one wrote.
"""

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from delta.tables import DeltaTable as SparkDeltaTable
from deltalake import DeltaTable as RsDeltaTable
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from watermark_dagster.changes import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, latest_per_key
from watermark_dagster.errors import TerminalError

SEQ_COLUMN = "_wm_seq"
BATCH_COLUMN = "_wm_batch_id"
_DELETE = "delete"


@dataclass(frozen=True)
class WriteResult:
    """What one write did to the target."""

    target_version: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    created: bool
    already_applied: bool = False

    @property
    def rows_written(self) -> int:
        """Rows inserted, updated or deleted."""
        return self.rows_inserted + self.rows_updated + self.rows_deleted


def _q(name: str) -> str:
    """Backtick-quote a validated identifier for a column reference."""
    return "`" + name.replace("`", "``") + "`"


def _col(alias: str, name: str) -> Any:
    return F.col(f"{alias}.{_q(name)}")


def prepare_changes(
    changes: DataFrame, *, keys: Sequence[str], batch_seq: int, batch_id: str, pipeline: str
) -> DataFrame:
    """One change per key, with the framework's columns, ready to merge.

    Raises:
        TerminalError: a key column is missing, or several changes share a key and there is
            no ``_commit_version`` to choose the latest.
    """
    missing = [k for k in keys if k not in changes.columns]
    if missing:
        raise TerminalError(
            f"Pipeline '{pipeline}': the transform's output lacks key column(s) {missing}; it "
            f"has {changes.columns}.",
            pipeline=pipeline,
            batch_id=batch_id,
            fix="return the target's key columns from the transform.",
        )
    key_cols = [F.col(_q(k)) for k in keys]
    if COMMIT_VERSION in changes.columns:
        # The latest change per key, in the one order shared with net_changes.
        changes = latest_per_key(changes, keys)
    else:
        dup = changes.groupBy(*key_cols).count().where(F.col("count") > 1).limit(1).collect()
        if dup:
            raise TerminalError(
                f"Pipeline '{pipeline}': the transform returned several rows for key "
                f"{dup[0].asDict()} and no {COMMIT_VERSION} column to pick the latest.",
                pipeline=pipeline,
                batch_id=batch_id,
                fix=f"return one row per key, or include {COMMIT_VERSION}.",
            )
    if CHANGE_TYPE not in changes.columns:
        changes = changes.withColumn(CHANGE_TYPE, F.lit("upsert"))
    return (
        changes.drop(COMMIT_VERSION, COMMIT_TIMESTAMP)
        .withColumn(SEQ_COLUMN, F.lit(batch_seq).cast("long"))
        .withColumn(BATCH_COLUMN, F.lit(batch_id))
    )


def _last_commit_metrics(target: str, storage_options: dict[str, str] | None) -> tuple[int, dict]:
    dt = RsDeltaTable(target, storage_options=storage_options)
    last = dt.history(1)[0]
    return dt.version(), dict(last.get("operationMetrics") or {})


def target_version(target: str, storage_options: dict[str, str] | None) -> int | None:
    """The target's current version (None when it does not exist yet)."""
    if not RsDeltaTable.is_deltatable(target, storage_options=storage_options):
        return None
    return RsDeltaTable(target, storage_options=storage_options).version()


def create_clustered(
    spark: SparkSession, target: str, schema: StructType, cluster_by: Sequence[str]
) -> None:
    """Create an empty target with liquid clustering (the DataFrame writer cannot)."""
    (
        SparkDeltaTable.createIfNotExists(spark)
        .location(target)
        .addColumns(schema)
        .clusterBy(*cluster_by)
        .execute()
    )


def merge_into_target(
    spark: SparkSession,
    changes: DataFrame,
    *,
    target: str,
    keys: Sequence[str],
    batch_seq: int,
    batch_id: str,
    pipeline: str,
    storage_options: dict[str, str] | None = None,
    partition_by: Sequence[str] = (),
    cluster_by: Sequence[str] = (),
    insert_missing: bool = True,
) -> WriteResult:
    """Apply the batch's changes to ``target``: upserts, deletes, latest change per key.

    Creates the target on the first batch. The merge only touches rows whose ``_wm_seq`` is
    not newer than this batch's, which makes the write safe to repeat. With
    ``insert_missing`` off (replays), keys the target does not hold are not inserted: the
    target cannot tell a key never seen from one a newer batch deleted.
    """
    prepared = prepare_changes(
        changes, keys=keys, batch_seq=batch_seq, batch_id=batch_id, pipeline=pipeline
    )
    # Evaluate the transform once: MERGE scans its source more than once, and the source
    # (joins over change feeds and snapshots) is the expensive part.
    prepared = prepared.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        prepared.count()
        return _write(
            spark,
            prepared,
            target=target,
            keys=keys,
            storage_options=storage_options,
            partition_by=partition_by,
            cluster_by=cluster_by,
            insert_missing=insert_missing,
        )
    finally:
        prepared.unpersist()


def _write(
    spark: SparkSession,
    prepared: DataFrame,
    *,
    target: str,
    keys: Sequence[str],
    storage_options: dict[str, str] | None,
    partition_by: Sequence[str] = (),
    cluster_by: Sequence[str] = (),
    insert_missing: bool = True,
) -> WriteResult:
    is_delete = F.lower(F.col(f"s.{_q(CHANGE_TYPE)}")) == _DELETE
    data_columns = [c for c in prepared.columns if c != CHANGE_TYPE]

    if not SparkDeltaTable.isDeltaTable(spark, target):
        rows = prepared.where(F.lower(F.col(_q(CHANGE_TYPE))) != _DELETE).drop(CHANGE_TYPE)
        writer = rows.write.format("delta").mode("errorifexists")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        if cluster_by:
            create_clustered(spark, target, rows.schema, cluster_by)
            writer = writer.mode("append")
        writer.save(target)
        version, metrics = _last_commit_metrics(target, storage_options)
        return WriteResult(
            target_version=version,
            rows_inserted=int(metrics.get("numOutputRows", 0)),
            rows_updated=0,
            rows_deleted=0,
            created=True,
        )

    on = reduce(operator.and_, [_col("t", k) == _col("s", k) for k in keys])
    not_older = _col("s", SEQ_COLUMN) >= _col("t", SEQ_COLUMN)
    assignments = {_q(c): _col("s", c) for c in data_columns}
    merge = (
        SparkDeltaTable.forPath(spark, target)
        .alias("t")
        .merge(prepared.alias("s"), on)
        # New nullable output columns (an upstream gained a column) are added to the target.
        .withSchemaEvolution()
        .whenMatchedDelete(condition=is_delete & not_older)
        .whenMatchedUpdate(condition=~is_delete & not_older, set=assignments)
    )
    if insert_missing:
        merge = merge.whenNotMatchedInsert(condition=~is_delete, values=assignments)
    merge.execute()
    version, metrics = _last_commit_metrics(target, storage_options)
    return WriteResult(
        target_version=version,
        rows_inserted=int(metrics.get("numTargetRowsInserted", 0)),
        rows_updated=int(metrics.get("numTargetRowsUpdated", 0)),
        rows_deleted=int(metrics.get("numTargetRowsDeleted", 0)),
        created=False,
    )
