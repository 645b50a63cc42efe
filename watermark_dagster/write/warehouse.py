"""Loading a batch into a warehouse table exactly once, by the warehouse's own transaction
(:func:`write_warehouse`).

A batch's rows (the transform's output on Spark, one change per key) are first staged in
an unlogged table of the target's database: by Spark's JDBC writer from the executors, or
streamed by the driver with ``COPY`` (``load:``). Then one database transaction

1. takes the pipeline's lock and reads its row of the state table,
2. applies the staged rows: deletes and ``INSERT ... ON CONFLICT`` upserts guarded by the
   ``_wm_seq`` column (a row a newer batch wrote is never overwritten by an older one),
   an ``INSERT`` for an append, the table emptied first for a full load,
3. records the batch's position, id and control root in the state row,

and commits. A crash anywhere before the commit leaves nothing applied (staged rows are
dropped by the next attempt); after it, the state row shows the batch applied and a retry
changes nothing (:func:`warehouse_evidence`). The state row also binds the table to one
control root and holds a forced change's fence (:func:`fence_warehouse`), as a Delta
target's transaction does (:mod:`~watermark_dagster.write.fences`).
"""

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.config.pipeline import Pipeline, WriteMode
from watermark_dagster.config.warehouse import PostgresTarget
from watermark_dagster.core.columns import (
    BATCH_COLUMN,
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    SEQ_COLUMN,
    UPSERT,
)
from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.records import TargetMark
from watermark_dagster.errors import RetryableError, TerminalError
from watermark_dagster.observe import warehouse_sql as sql
from watermark_dagster.observe.database_state import driver_message
from watermark_dagster.observe.warehouse_state import (
    LOAD_SECONDS,
    WarehouseState,
    connected,
    credentials_of,
    state_row,
)
from watermark_dagster.write.commits import UNBOUND_ROOT, WriteResult
from watermark_dagster.write.merge import prepare_changes
from watermark_dagster.write.warehouse_fences import (
    applied,
    bound_elsewhere,
    create_state,
    lock_name,
    stage_name,
    state_table_of,
    table_gone,
    table_of,
    warehouse_of,
)
from watermark_dagster.write.warehouse_stage import check_columns, check_stage, stage_rows

log = logging.getLogger("watermark_dagster")


def _prepared(output: DataFrame, pipeline: Pipeline, batch_id: str, write_seq: int) -> DataFrame:
    """One change per key (a merge), each row stamped with the batch's position and id."""
    if pipeline.write is WriteMode.MERGE:
        return prepare_changes(
            output,
            keys=pipeline.keys,
            batch_seq=write_seq,
            batch_id=batch_id,
            pipeline=pipeline.name,
        )
    frame = output.drop(COMMIT_VERSION, COMMIT_TIMESTAMP)
    if CHANGE_TYPE not in frame.columns:
        frame = frame.withColumn(CHANGE_TYPE, F.lit(UPSERT))
    return frame.withColumn(SEQ_COLUMN, F.lit(write_seq).cast("long")).withColumn(
        BATCH_COLUMN, F.lit(batch_id)
    )


@dataclass(frozen=True)
class _Load:
    """One attempt's load of a batch: what it writes and the state row rules it checks."""

    pipeline: Pipeline
    target: PostgresTarget
    batch_id: str
    write_seq: int
    root: str
    full_load: bool
    replay: bool
    first_attempt: bool
    first: TargetMark | None
    staged: str

    def applied(self, state: WarehouseState | None) -> bool:
        return applied(
            state,
            self.pipeline,
            self.batch_id,
            self.write_seq,
            self.root,
            first_attempt=self.first_attempt,
            first=self.first,
            replay=self.replay,
        )

    def prepare(self, cursor: Any, schema: T.StructType) -> tuple[WarehouseState | None, bool]:
        """The state row (None: no load yet) and whether the table was created, after the
        checks that refuse a table this load cannot take."""
        create_state(cursor, self.target)
        state = state_row(cursor, self.target, self.pipeline.name)
        if self.applied(state):
            return state, False
        if state is not None and not (self.full_load or self.replay):
            cursor.execute(sql.table_columns(), (self.target.schema, self.target.name))
            if not cursor.fetchall():  # refused before an empty table is created
                raise table_gone(self.pipeline, self.batch_id, state)
        created = check_columns(cursor, self.pipeline, self.target, schema)
        if state is None and not created:
            cursor.execute(sql.has_rows(table_of(self.target)))
            row = cursor.fetchone()
            if row and row[0]:
                raise bound_elsewhere(self.pipeline, self.batch_id, self.write_seq, self.root, None)
        return state, created

    def stage(self, cursor: Any, frame: DataFrame, credentials: Mapping[str, Any]) -> None:
        """The rows in a fresh staging table (a stale one of an earlier attempt dropped)."""
        cursor.execute(sql.drop_table(self.staged))
        cursor.execute(sql.create_stage(self.staged, table_of(self.target), self.pipeline.keys))
        persisted = frame.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            rows = persisted.count()
            how = stage_rows(cursor, persisted, self.target, self.staged, rows, credentials)
        finally:
            persisted.unpersist()
        log.info(
            "pipeline=%s batch=%s: %d row(s) staged in %s by %s",
            self.pipeline.name,
            self.batch_id,
            rows,
            self.staged,
            how,
        )

    def commit(
        self, connection: Any, columns: Sequence[str], created: bool
    ) -> tuple[int, int, int] | None:
        """The staged rows applied and the state row written, in one transaction: the
        counts, or None when another attempt committed the batch first."""
        cursor = connection.cursor()
        connection.autocommit = False
        cursor.execute(sql.lock_pipeline(), (lock_name(self.target, self.pipeline.name),))
        if self.applied(state_row(cursor, self.target, self.pipeline.name)):
            connection.rollback()
            return None
        counts = _apply(
            cursor,
            self.target,
            self.staged,
            columns,
            self.pipeline,
            full_load=self.full_load or self.pipeline.write is WriteMode.OVERWRITE,
            insert_missing=not self.replay or created,
        )
        row = (self.pipeline.name, self.write_seq, self.batch_id, self.root, False, self.batch_id)
        cursor.execute(sql.write_state(state_table_of(self.target)), (*row, *counts))
        fault_point("before_warehouse_commit", where=self.pipeline.name)
        connection.commit()
        return counts

    def driver_error(self, error: Exception, credentials: Mapping[str, Any]) -> Exception:
        """A driver's error as ours: the server's answer is terminal, a broken connection
        retryable; neither shows a credential."""
        said = driver_message(error, credentials.values())
        name, batch_id = self.pipeline.name, self.batch_id
        if not _server_error(error):  # the connection broke: the batch may simply be retried
            return RetryableError(
                f"Pipeline '{name}': the connection to the warehouse at {self.target.url} "
                f"broke during the load of batch {batch_id} ({said}); its retry finds from "
                "the state row whether the load committed, and applies it only if not.",
                pipeline=name,
                batch_id=batch_id,
                fix="check that the database is up; the batch is retried as it stands.",
            )
        return TerminalError(
            f"Pipeline '{name}': the load of batch {batch_id} into warehouse table "
            f"{self.target.table} failed ({said}); nothing was applied.",
            pipeline=name,
            batch_id=batch_id,
            fix="correct the table or the transform as the database's message says, then "
            "re-run the batch.",
        )


def write_warehouse(
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
    """Load the transform's ``output`` for one batch into the pipeline's warehouse table,
    in one transaction with its state row (see the module docstring).

    ``known_keys`` (the output's keys, held by the driver) is taken for the signature
    :func:`~watermark_dagster.write.targets.write_target` shares: the staged rows are
    checked in the warehouse itself.

    Returns:
        What the load changed; ``target_version`` is the state row's position after it.
        ``already_applied`` when the state row shows the batch loaded (nothing staged).

    Raises:
        TargetBoundElsewhereError: the state row is another control root's, or ahead.
        BatchStateError: a forced change fenced the batch.
        TerminalError: the table's columns do not match the output, a key column holds
            NULL, several rows share a key, or an append's output holds deletes; nothing
            was written.
        ConfigurationError, RetryableError: the credentials were refused, or the server
            did not answer (:func:`~watermark_dagster.observe.warehouse_state.connected`).
    """
    del spark, known_keys  # the frame's own session stages it; the stage checks the keys
    target = warehouse_of(pipeline)
    frame = _prepared(output, pipeline, batch_id, write_seq)
    columns = [c for c in frame.columns if c != CHANGE_TYPE]
    for c in frame.columns:
        sql.identifier(c)  # every name checked before anything is written
    staged = sql.qualified(target.schema, stage_name(pipeline.name, batch_id))
    load = _Load(
        pipeline,
        target,
        batch_id,
        write_seq,
        root,
        full_load,
        replay,
        not retried,
        first,
        staged,
    )
    credentials = credentials_of(target)
    with connected(target, pipeline=pipeline.name, statement_seconds=LOAD_SECONDS) as connection:
        cursor = connection.cursor()
        connection.autocommit = True
        _hold_staging(cursor, load)
        try:
            state, created = load.prepare(cursor, frame.schema)
            if load.applied(state):
                log.info(
                    "pipeline=%s batch=%s: the warehouse state of %s shows it loaded; not "
                    "loaded again",
                    pipeline.name,
                    batch_id,
                    target.table,
                )
                return WriteResult.nothing(write_seq, already_applied=True)
            load.stage(cursor, frame, credentials)
            fault_point("after_warehouse_stage", where=pipeline.name)
            ordered = COMMIT_VERSION in output.columns
            check_stage(cursor, pipeline, batch_id, staged, ordered=ordered)
            counts = load.commit(connection, columns, created)
        except TerminalError:
            raise
        except Exception as e:
            # The driver's errors, and a socket's (a timeout, a reset connection).
            if "pg8000" not in type(e).__module__ and not isinstance(e, OSError):
                raise
            raise load.driver_error(e, credentials) from None
        finally:
            _drop_stage(connection, staged)
    if counts is None:
        return WriteResult.nothing(write_seq, already_applied=True)
    inserted, updated, deleted = counts
    log.info(
        "pipeline=%s batch=%s: warehouse table %s loaded: %d inserted, %d updated, %d deleted",
        pipeline.name,
        batch_id,
        target.table,
        inserted,
        updated,
        deleted,
    )
    position = max(write_seq, state.position if state is not None else write_seq)
    return WriteResult(position, inserted, updated, deleted, created=created, committed=True)


def _hold_staging(cursor: Any, load: "_Load") -> None:
    """Take the batch's staging for this attempt: each attempt drops and refills the one
    staging table of its batch, so another attempt still running (a run taken for dead, a
    retry launched beside it) must finish first. The session holds it to its end.

    Raises:
        RetryableError: another attempt of the batch holds it.
    """
    cursor.execute(sql.try_lock_attempt(), (f"{load.staged}:{load.batch_id}",))
    row = cursor.fetchone()
    if not (row and row[0]):
        raise RetryableError(
            f"Pipeline '{load.pipeline.name}': another attempt of batch {load.batch_id} is "
            f"loading warehouse table {load.target.table} (it holds the batch's staging); "
            "nothing was written by this one.",
            pipeline=load.pipeline.name,
            batch_id=load.batch_id,
            fix="nothing to do: the batch is retried once that attempt ends (a load that "
            "committed is then found applied).",
        )


def _server_error(error: BaseException) -> bool:
    """Whether a driver error is the server's answer (it carries an SQLSTATE), not a
    broken connection."""
    fields = error.args[0] if error.args else None
    return isinstance(fields, Mapping) and "C" in fields


def _drop_stage(connection: Any, staged: str) -> None:
    """Roll back what is open and drop the stage; a broken connection leaves it to the
    next attempt, which drops it first."""
    try:
        if not connection.autocommit:
            connection.rollback()
            connection.autocommit = True
        connection.cursor().execute(sql.drop_table(staged))
    except Exception as e:  # the driver's errors share no base class with ours
        log.warning("staging table %s left for the next attempt to drop (%s)", staged, e)


def _apply(
    cursor: Any,
    target: PostgresTarget,
    staged: str,
    columns: Sequence[str],
    pipeline: Pipeline,
    *,
    full_load: bool,
    insert_missing: bool,
) -> tuple[int, int, int]:
    """The staged rows applied inside the open transaction: (inserted, updated, deleted)."""
    table = table_of(target)
    if full_load or pipeline.write is not WriteMode.MERGE:
        deleted = 0
        if full_load:
            cursor.execute(sql.delete_all(table))
            deleted = max(cursor.rowcount, 0)
        cursor.execute(sql.insert_all(table, staged, columns))
        return max(cursor.rowcount, 0), 0, deleted
    cursor.execute(sql.delete_changed(table, staged, pipeline.keys))
    deleted = max(cursor.rowcount, 0)
    if insert_missing:
        cursor.execute(sql.upsert_changed(table, staged, columns, pipeline.keys))
        row = cursor.fetchone()
        return int(row[0]), int(row[1]), deleted
    cursor.execute(sql.update_changed(table, staged, columns, pipeline.keys))
    return 0, max(cursor.rowcount, 0), deleted


__all__ = ["write_warehouse"]
