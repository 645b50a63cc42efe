"""A warehouse load's staging: the target table's columns created or checked against the
output, the batch's rows staged by ``COPY`` from the driver or Spark's JDBC writer, and the
staged rows checked before the transaction applies them
(:func:`~watermark_dagster.write.warehouse.write_warehouse`)."""

from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.config.pipeline import Pipeline, WriteMode
from watermark_dagster.config.warehouse import PostgresTarget
from watermark_dagster.core.columns import BATCH_COLUMN, CHANGE_TYPE, COMMIT_VERSION, SEQ_COLUMN
from watermark_dagster.errors import TerminalError
from watermark_dagster.observe import warehouse_sql as sql
from watermark_dagster.write.warehouse_fences import table_of

COPY_ROWS = 5_000
"""``load: auto`` streams a batch of up to this many rows with ``COPY`` from the driver,
and writes a larger one with Spark's JDBC writer (``benchmarks/warehouse.py``)."""

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


# -- the load


def created_type(pipeline: str, column: str, dtype: T.DataType) -> str:
    """The column type a new warehouse table gets for an output column of ``dtype``.

    Raises:
        TerminalError: a type a warehouse table does not hold (arrays, maps, structs).
    """
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


def check_columns(
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
            (f.name, created_type(pipeline.name, f.name, f.dataType))
            for f in data
            if f.name not in (SEQ_COLUMN, BATCH_COLUMN)
        ]
        cursor.execute(sql.create_schema(target.schema))
        keys = pipeline.keys if pipeline.write is WriteMode.MERGE else ()
        cursor.execute(sql.create_target(table_of(target), columns, keys))
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
                else created_type(pipeline.name, f.name, f.dataType)
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


def stage_rows(
    cursor: Any,
    frame: DataFrame,
    target: PostgresTarget,
    staged: str,
    rows: int,
    credentials: Mapping[str, Any],
) -> str:
    """Stage the rows: ``COPY`` from the driver, or Spark's JDBC writer. Returns how."""
    how = target.load if target.load != "auto" else ("copy" if rows <= COPY_ROWS else "jdbc")
    if how == "copy":
        cursor.execute(
            sql.copy_into(staged, frame.columns),
            stream=_copy_lines(iter(_text_columns(frame).toLocalIterator())),
        )
        return how
    writer = (
        frame.write.format("jdbc")
        .mode("append")
        .option("url", target.url)
        .option("driver", "org.postgresql.Driver")
        .option("dbtable", staged)
        .option("batchsize", "10000")
        .option("stringtype", "unspecified")
    )
    for key, value in credentials.items():
        writer = writer.option(key, value)
    writer.save()
    return how


def check_stage(
    cursor: Any, pipeline: Pipeline, batch_id: str, staged: str, *, ordered: bool
) -> None:
    """Refuse staged rows the load cannot apply: a NULL key, several rows of one key, a
    delete for an append.

    Raises:
        TerminalError: naming the key, with the fix; nothing was applied.
    """
    if pipeline.write is WriteMode.MERGE:
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


__all__ = ["COPY_ROWS", "check_columns", "check_stage", "created_type", "stage_rows"]
