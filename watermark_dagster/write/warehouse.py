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

import hashlib
import logging
from collections.abc import Iterator, Mapping, Sequence
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
from watermark_dagster.errors import (
    BatchStateError,
    RetryableError,
    TargetBoundElsewhereError,
    TerminalError,
    reset_command,
)
from watermark_dagster.observe import warehouse_sql as sql
from watermark_dagster.observe.database_state import driver_message
from watermark_dagster.observe.warehouse_state import (
    WarehouseState,
    connected,
    credentials_of,
    state_row,
)
from watermark_dagster.write.commits import UNBOUND_ROOT, WriteResult
from watermark_dagster.write.fences import Fence
from watermark_dagster.write.merge import prepare_changes

log = logging.getLogger("watermark_dagster")

COPY_ROWS = 50_000
"""``load: auto`` streams a batch of up to this many rows with ``COPY`` from the driver,
and writes a larger one with Spark's JDBC writer (``benchmarks/warehouse.py``)."""
STAGE_PREFIX = "wm_stage_"

# Spark's types as the warehouse table is created with them, and the catalog types an
# existing table's column may have for each (format_type's words, up to a parenthesis).
_CREATED: Mapping[type[T.DataType], str] = {
    T.BooleanType: "boolean",
    T.ByteType: "smallint",
    T.ShortType: "smallint",
    T.IntegerType: "integer",
    T.LongType: "bigint",
    T.FloatType: "real",
    T.DoubleType: "double precision",
    T.StringType: "text",
    T.DateType: "date",
    T.TimestampType: "timestamp with time zone",
    T.TimestampNTZType: "timestamp without time zone",
    T.BinaryType: "bytea",
}
_ACCEPTED: Mapping[type[T.DataType], tuple[str, ...]] = {
    T.BooleanType: ("boolean",),
    T.ByteType: ("smallint", "integer", "bigint", "numeric"),
    T.ShortType: ("smallint", "integer", "bigint", "numeric"),
    T.IntegerType: ("integer", "bigint", "numeric"),
    T.LongType: ("bigint", "numeric"),
    T.FloatType: ("real", "double precision", "numeric"),
    T.DoubleType: ("double precision", "numeric"),
    T.DecimalType: ("numeric",),
    T.StringType: ("text", "character varying", "character"),
    T.DateType: ("date",),
    T.TimestampType: ("timestamp with time zone", "timestamp without time zone"),
    T.TimestampNTZType: ("timestamp without time zone",),
    T.BinaryType: ("bytea",),
}


def _target(pipeline: Pipeline) -> PostgresTarget:
    if pipeline.warehouse is None:
        raise TypeError(f"pipeline {pipeline.name} has no warehouse target")
    return pipeline.warehouse


def _table(target: PostgresTarget) -> str:
    return sql.qualified(target.schema, target.name)


def _state_table(target: PostgresTarget) -> str:
    return sql.qualified(target.state_schema, target.state_name)


def _lock_name(target: PostgresTarget, pipeline: str) -> str:
    return f"watermark:{target.state_schema}.{target.state_name}:{pipeline}"


def stage_name(pipeline: str, batch_id: str) -> str:
    """The staging table of ``pipeline``'s load of ``batch_id`` (each attempt drops it
    and stages again)."""
    return STAGE_PREFIX + hashlib.sha256(f"{pipeline}\0{batch_id}".encode()).hexdigest()[:24]


# -- what the state row says


def warehouse_mark(pipeline: Pipeline, root: str) -> TargetMark:
    """The target as an attempt finds it before it can write: the state row's position
    (-1: none), and as the transaction position the position this root loaded."""
    from watermark_dagster.observe.warehouse_state import read_state

    state = read_state(_target(pipeline), pipeline.name)
    if state is None:
        return TargetMark(-1, None)
    return TargetMark(state.position, state.position if state.root == root else None)


def _fenced_error(pipeline: str, batch_id: str, position: int) -> BatchStateError:
    return BatchStateError(
        f"Batch {batch_id} was abandoned by a forced change: pipeline '{pipeline}''s "
        f"warehouse state is fenced against it (position {position}); nothing was loaded.",
        pipeline=pipeline,
        batch_id=batch_id,
        fix="nothing to do once the forced change has finished: the next batch reads the "
        "abandoned batch's ranges again. If the change was interrupted, run it again.",
    )


def _bound_elsewhere(
    pipeline: Pipeline, batch_id: str, write_seq: int, root: str, state: WarehouseState | None
) -> TargetBoundElsewhereError:
    target = _target(pipeline)
    resets = " and ".join(f"`{reset_command(u)} --yes`" for u in pipeline.upstreams)
    if state is None:
        what = "rows, but its state table records no load of the pipeline"
        by = "a load this state table does not record"
    elif state.root != root:
        what = f"a load at position {state.position} (batch {state.batch_id})"
        by = f"control root {state.root}"
    else:
        what = f"a load at position {state.position} (batch {state.batch_id})"
        by = (
            f"this control root ({root}) in an earlier life: the root was restored from an "
            "older copy or its batches were rewound"
        )
    return TargetBoundElsewhereError(
        f"Pipeline '{pipeline.name}': warehouse table {target.table} at {target.url} holds "
        f"{what} by {by}, which control root {root} did not schedule: its batch {batch_id} "
        f"is at position {write_seq}. Taking the batch as applied would drop its changes, "
        "and loading it under newer rows would lose them; nothing was skipped or written.",
        pipeline=pipeline.name,
        batch_id=batch_id,
        versions=f"warehouse position={None if state is None else state.position}, batch "
        f"position={write_seq}, warehouse root={None if state is None else state.root}, this "
        f"root={root}",
        fix=f"if this control root now owns the table, empty it (TRUNCATE {target.table}) and "
        f"delete the pipeline's row of {target.state_table}, then run {resets} and "
        "`watermark run --retry`: the table is loaded in full from the upstreams. If it "
        "belongs to the other control root, load it from there, or give this one its own "
        "table.",
    )


def _applied(
    state: WarehouseState | None,
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    root: str,
    *,
    first_attempt: bool,
    first: TargetMark | None,
    replay: bool,
) -> bool:
    """Whether the state row shows the batch applied (a retry then changes nothing).

    Raises:
        TargetBoundElsewhereError: the row is another control root's, or this root's at a
            position ahead of the batch (or at it on a first attempt): restored.
        BatchStateError: a forced change fenced the batch.
    """
    if state is None:
        return False
    if root != UNBOUND_ROOT and state.root != root:
        raise _bound_elsewhere(pipeline, batch_id, write_seq, root, state)
    if replay:
        return not first_attempt and state.last_batch_id == batch_id
    if state.position < write_seq:
        return False
    if state.position == write_seq and state.batch_id == batch_id and state.fenced:
        raise _fenced_error(pipeline.name, batch_id, state.position)
    earlier = first_attempt or (first is not None and first.holds(write_seq))
    if state.position > write_seq or state.batch_id != batch_id or earlier:
        raise _bound_elsewhere(pipeline, batch_id, write_seq, root, state)
    return True


def check_warehouse_bound(
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    root: str,
    *,
    first_attempt: bool,
    first: TargetMark | None = None,
    replay: bool = False,
) -> None:
    """Before a run reads anything: refuse a warehouse table whose state row another
    control root wrote, or this root ahead of the batch (the load checks again in its
    transaction).

    Raises:
        TargetBoundElsewhereError, BatchStateError: as the load would.
    """
    from watermark_dagster.observe.warehouse_state import read_state

    state = read_state(_target(pipeline), pipeline.name)
    _applied(
        state,
        pipeline,
        batch_id,
        write_seq,
        root,
        first_attempt=first_attempt,
        first=first,
        replay=replay,
    )


def warehouse_evidence(pipeline: Pipeline, batch_id: str, write_seq: int, root: str) -> str | None:
    """What shows that ``pipeline``'s warehouse already holds batch ``batch_id`` (a run
    killed between its commit and its checkpoint), or None: its state row."""
    from watermark_dagster.observe.warehouse_state import read_state

    state = read_state(_target(pipeline), pipeline.name)
    if state is None or not state.applied(batch_id, write_seq, root):
        return None
    return (
        f"the warehouse state row of {pipeline.name} in {_target(pipeline).state_table} "
        f"(position {state.position}, batch {state.last_batch_id})"
    )


def fence_warehouse(pipeline: Pipeline, batch_id: str, write_seq: int, root: str) -> Fence:
    """Fence ``pipeline``'s warehouse against scheduled batch ``batch_id``: its state row
    takes the batch's position marked fenced, so no load of the batch commits afterwards
    (the load's transaction reads the row under the same lock). When the batch's load won
    the race, its evidence instead."""
    target = _target(pipeline)
    with connected(target, pipeline=pipeline.name) as connection:
        cursor = connection.cursor()
        connection.autocommit = True
        _create_state(cursor, target)
        connection.autocommit = False
        cursor.execute(sql.lock_pipeline(), (_lock_name(target, pipeline.name),))
        state = state_row(cursor, target, pipeline.name)
        if state is not None and state.applied(batch_id, write_seq, root):
            connection.rollback()
            return Fence(applied=f"the warehouse state row at position {state.position}")
        if state is not None and state.position >= write_seq:
            connection.rollback()
            return Fence(fenced=state.position)
        cursor.execute(
            sql.write_state(_state_table(target)),
            (
                pipeline.name,
                write_seq,
                batch_id,
                root,
                True,
                None if state is None else state.last_batch_id,
                None,
                None,
                None,
            ),
        )
        connection.commit()
        connection.autocommit = True
        cursor.execute(
            sql.drop_table(sql.qualified(target.schema, stage_name(pipeline.name, batch_id)))
        )
        return Fence(fenced=write_seq, new=True)


# -- the load


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


def _created_type(pipeline: str, column: str, dtype: T.DataType) -> str:
    if isinstance(dtype, T.DecimalType):
        return f"numeric({dtype.precision},{dtype.scale})"
    found = _CREATED.get(type(dtype))
    if found is None:
        raise TerminalError(
            f"Pipeline '{pipeline}': output column {column} is {dtype.simpleString()}, which a "
            "warehouse table does not hold; nothing was written.",
            pipeline=pipeline,
            fix=f"convert it in the transform (to_json({column}) for a nested value).",
        )
    return found


def _create_state(cursor: Any, target: PostgresTarget) -> None:
    cursor.execute(sql.create_schema(target.state_schema))
    cursor.execute(sql.create_state(_state_table(target)))


def _check_columns(
    cursor: Any, pipeline: Pipeline, target: PostgresTarget, schema: T.StructType
) -> bool:
    """Create the target when missing (True), else check that its columns hold the
    output's, and for a merge that its keys are unique.

    Raises:
        TerminalError: naming each column that is missing, of another type or required
            but not in the output, and the fix.
    """
    cursor.execute(sql.table_columns(), (target.schema, target.name))
    found = {
        str(n): (str(t), bool(nullable), bool(default))
        for n, t, nullable, default in cursor.fetchall()
    }
    data = [f for f in schema.fields if f.name != CHANGE_TYPE]
    if not found:
        columns = [
            (f.name, _created_type(pipeline.name, f.name, f.dataType))
            for f in data
            if f.name not in (SEQ_COLUMN, BATCH_COLUMN)
        ]
        cursor.execute(sql.create_schema(target.schema))
        keys = pipeline.keys if pipeline.write is WriteMode.MERGE else ()
        cursor.execute(sql.create_target(_table(target), columns, keys))
        return True
    problems: list[str] = []
    fixes: list[str] = []
    for f in data:
        if f.name not in found:
            problems.append(f"{f.name} ({f.dataType.simpleString()}) is missing")
            created = (
                "bigint NOT NULL DEFAULT 0"
                if f.name == SEQ_COLUMN
                else "text"
                if f.name == BATCH_COLUMN
                else _created_type(pipeline.name, f.name, f.dataType)
            )
            fixes.append(f"ALTER TABLE {target.table} ADD COLUMN {f.name} {created}")
            continue
        kind = found[f.name][0].split("(")[0].strip()
        accepted = _ACCEPTED.get(type(f.dataType), ())
        if kind not in accepted:
            problems.append(
                f"{f.name} is {found[f.name][0]}, the output's is {f.dataType.simpleString()}"
            )
    names = {f.name for f in data}
    for name, (kind, nullable, default) in found.items():
        if name not in names and not nullable and not default:
            problems.append(f"{name} ({kind}) is NOT NULL but not in the output")
    if problems:
        raise TerminalError(
            f"Pipeline '{pipeline.name}': warehouse table {target.table} does not match the "
            f"output: {'; '.join(problems)}. Nothing was written.",
            pipeline=pipeline.name,
            fix=("; ".join(fixes) + "; or " if fixes else "")
            + "change the transform's output (or the table) so that each output column has a "
            "column of its type; a table created by the first load has exactly these.",
        )
    if pipeline.write is WriteMode.MERGE:
        cursor.execute(sql.unique_keys(), (target.schema, target.name))
        unique = [sorted(r[0]) for r in cursor.fetchall()]
        if sorted(pipeline.keys) not in unique:
            raise TerminalError(
                f"Pipeline '{pipeline.name}': warehouse table {target.table} has no primary key "
                f"or unique index on its keys {list(pipeline.keys)}, which a merge's upserts "
                "need; nothing was written.",
                pipeline=pipeline.name,
                fix=f"ALTER TABLE {target.table} ADD PRIMARY KEY ({', '.join(pipeline.keys)}).",
            )
    return False


def _text_columns(frame: DataFrame) -> DataFrame:
    """Every column as the text ``COPY`` reads (timestamps in the session's UTC, binary as
    hex after a backslash and an x)."""
    out = []
    for f in frame.schema.fields:
        column = F.col(f"`{f.name}`")  # a name sql.identifier checked: no backtick in it
        if isinstance(f.dataType, T.BinaryType):
            column = F.concat(F.lit("\\x"), F.lower(F.hex(column)))
        elif isinstance(f.dataType, T.TimestampType):
            column = F.date_format(column, "yyyy-MM-dd HH:mm:ss.SSSSSSXXX")
        else:
            column = column.cast("string")
        out.append(column.alias(f.name))
    return frame.select(*out)


_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_lines(rows: Iterator[Any], chunk: int = 2_000) -> Iterator[str]:
    buffer: list[str] = []
    for row in rows:
        buffer.append(
            "\t".join("\\N" if v is None else str(v).translate(_ESCAPES) for v in row) + "\n"
        )
        if len(buffer) >= chunk:
            yield "".join(buffer)
            buffer.clear()
    if buffer:
        yield "".join(buffer)


def _stage(
    cursor: Any,
    frame: DataFrame,
    target: PostgresTarget,
    stage: str,
    *,
    rows: int,
    credentials: Mapping[str, Any],
) -> str:
    """Stage the rows: ``COPY`` from the driver, or Spark's JDBC writer. Returns how."""
    how = target.load if target.load != "auto" else ("copy" if rows <= COPY_ROWS else "jdbc")
    if how == "copy":
        cursor.execute(
            sql.copy_into(sql.qualified(target.schema, stage), frame.columns),
            stream=_copy_lines(iter(_text_columns(frame).toLocalIterator())),
        )
        return how
    writer = (
        frame.write.format("jdbc")
        .mode("append")
        .option("url", target.url)
        .option("driver", "org.postgresql.Driver")
        .option("dbtable", sql.qualified(target.schema, stage))
        .option("batchsize", "10000")
        .option("stringtype", "unspecified")
    )
    for key, value in credentials.items():
        writer = writer.option(key, value)
    writer.save()
    return how


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
) -> WriteResult:
    """Load the transform's ``output`` for one batch into the pipeline's warehouse table,
    in one transaction with its state row (see the module docstring).

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
    del spark  # the frame's own session stages it
    target = _target(pipeline)
    frame = _prepared(output, pipeline, batch_id, write_seq)
    columns = [c for c in frame.columns if c != CHANGE_TYPE]
    for c in frame.columns:
        sql.identifier(c)  # every name checked before anything is written
    merge = pipeline.write is WriteMode.MERGE
    checks = {"first_attempt": not retried, "first": first, "replay": replay}
    credentials = credentials_of(target)
    stage = stage_name(pipeline.name, batch_id)
    staged = sql.qualified(target.schema, stage)
    with connected(target, pipeline=pipeline.name) as connection:
        cursor = connection.cursor()
        connection.autocommit = True
        try:
            _create_state(cursor, target)
            state = state_row(cursor, target, pipeline.name)
            if _applied(state, pipeline, batch_id, write_seq, root, **checks):
                log.info(
                    "pipeline=%s batch=%s: the warehouse state of %s shows it loaded; not "
                    "loaded again",
                    pipeline.name,
                    batch_id,
                    target.table,
                )
                return WriteResult.nothing(write_seq, already_applied=True)
            created = _check_columns(cursor, pipeline, target, frame.schema)
            if state is None and not created:
                cursor.execute(sql.has_rows(_table(target)))
                row = cursor.fetchone()
                if row and row[0]:
                    raise _bound_elsewhere(pipeline, batch_id, write_seq, root, None)
            cursor.execute(sql.drop_table(staged))
            cursor.execute(sql.create_stage(staged, _table(target), pipeline.keys))
            persisted = frame.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                rows = persisted.count()
                how = _stage(cursor, persisted, target, stage, rows=rows, credentials=credentials)
            finally:
                persisted.unpersist()
            log.info(
                "pipeline=%s batch=%s: %d row(s) staged in %s by %s",
                pipeline.name,
                batch_id,
                rows,
                staged,
                how,
            )
            fault_point("after_warehouse_stage", where=pipeline.name)
            _check_stage(
                cursor,
                pipeline,
                batch_id,
                staged,
                merge=merge,
                ordered=COMMIT_VERSION in output.columns,
            )
            connection.autocommit = False
            cursor.execute(sql.lock_pipeline(), (_lock_name(target, pipeline.name),))
            state = state_row(cursor, target, pipeline.name)
            if _applied(state, pipeline, batch_id, write_seq, root, **checks):
                connection.rollback()
                return WriteResult.nothing(write_seq, already_applied=True)
            inserted, updated, deleted = _apply(
                cursor,
                target,
                staged,
                columns,
                pipeline,
                full_load=full_load or pipeline.write is WriteMode.OVERWRITE,
                insert_missing=not replay or created,
            )
            cursor.execute(
                sql.write_state(_state_table(target)),
                (
                    pipeline.name,
                    write_seq,
                    batch_id,
                    root,
                    False,
                    batch_id,
                    inserted,
                    updated,
                    deleted,
                ),
            )
            fault_point("before_warehouse_commit", where=pipeline.name)
            connection.commit()
        except TerminalError:
            raise
        except Exception as e:
            if "pg8000" not in type(e).__module__:
                raise
            if not _server_error(e):  # the connection broke: the batch may simply be retried
                raise RetryableError(
                    f"Pipeline '{pipeline.name}': the connection to the warehouse at "
                    f"{target.url} broke during the load of batch {batch_id} "
                    f"({driver_message(e, credentials.values())}); nothing was applied.",
                    pipeline=pipeline.name,
                    batch_id=batch_id,
                    fix="check that the database is up; the batch is retried as it stands.",
                ) from None
            raise TerminalError(
                f"Pipeline '{pipeline.name}': the load of batch {batch_id} into warehouse "
                f"table {target.table} failed ({driver_message(e, credentials.values())}); "
                "nothing was applied.",
                pipeline=pipeline.name,
                batch_id=batch_id,
                fix="correct the table or the transform as the database's message says, then "
                "re-run the batch.",
            ) from None
        finally:
            _drop_stage(connection, staged)
    position = max(write_seq, state.position if state is not None else write_seq)
    log.info(
        "pipeline=%s batch=%s: warehouse table %s loaded: %d inserted, %d updated, %d deleted",
        pipeline.name,
        batch_id,
        target.table,
        inserted,
        updated,
        deleted,
    )
    return WriteResult(position, inserted, updated, deleted, created=created, committed=True)


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


def _check_stage(
    cursor: Any, pipeline: Pipeline, batch_id: str, staged: str, *, merge: bool, ordered: bool
) -> None:
    """Refuse staged rows the load cannot apply: a NULL key, several rows of one key, a
    delete for an append.

    Raises:
        TerminalError: naming the key, with the fix; nothing was applied.
    """
    if merge:
        cursor.execute(sql.null_key(staged, pipeline.keys))
        row = cursor.fetchone()
        if row is not None:
            raise TerminalError(
                f"Pipeline '{pipeline.name}': the output holds a row whose key "
                f"{dict(zip(pipeline.keys, row, strict=True))} is NULL, which a warehouse "
                "table's primary key cannot hold; nothing was applied.",
                pipeline=pipeline.name,
                batch_id=batch_id,
                fix="filter the rows with NULL keys out in the transform (or fill them), then "
                "re-run the batch.",
            )
        if not ordered:
            cursor.execute(sql.duplicate_key(staged, pipeline.keys))
            row = cursor.fetchone()
            if row is not None:
                raise TerminalError(
                    f"Pipeline '{pipeline.name}': the transform returned several rows for key "
                    f"{dict(zip(pipeline.keys, row, strict=True))} and no {COMMIT_VERSION} "
                    "column to pick the latest; nothing was applied.",
                    pipeline=pipeline.name,
                    batch_id=batch_id,
                    fix=f"return one row per key, or include {COMMIT_VERSION}.",
                )
    elif pipeline.write is WriteMode.APPEND:
        cursor.execute(sql.has_deletes(staged))
        row = cursor.fetchone()
        if row and row[0]:
            raise TerminalError(
                f"Pipeline '{pipeline.name}' appends to its warehouse table, but its transform "
                "returned delete rows; an append target cannot delete.",
                pipeline=pipeline.name,
                batch_id=batch_id,
                fix="use write='merge' with key columns, or filter the deletes out.",
            )


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
    table = _table(target)
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


__all__ = [
    "COPY_ROWS",
    "check_warehouse_bound",
    "fence_warehouse",
    "stage_name",
    "warehouse_evidence",
    "warehouse_mark",
    "write_warehouse",
]
