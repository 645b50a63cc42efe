"""PostgreSQL's dialect of a warehouse target: every statement the load and its state
reads send, in one module, so that another warehouse (Redshift) is one more module.

No statement is built from a setting's text: table and column names are validated
(:func:`identifier`) and double-quoted, and every value is a bound parameter (``%s``, the
driver's ``format`` style). docs/warehouse.md#redshift lists what a Redshift dialect
changes: ``MERGE`` for ``INSERT ... ON CONFLICT``, ``LOCK`` for the advisory lock, ``COPY``
from S3 for ``COPY ... FROM STDIN``, and no ``xmax`` to tell inserts from updates.
"""

import re
from collections.abc import Sequence

from watermark_dagster.core.columns import BATCH_COLUMN, CHANGE_TYPE, DELETE, SEQ_COLUMN
from watermark_dagster.errors import ConfigurationError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

# The state table: one row per pipeline, written in the load's own transaction.
STATE_COLUMNS = (
    "pipeline",
    "position",
    "batch_id",
    "root",
    "fenced",
    "last_batch_id",
    "rows_inserted",
    "rows_updated",
    "rows_deleted",
    "loaded_at",
)


def identifier(name: str, what: str = "column") -> str:
    """``name`` double-quoted for PostgreSQL.

    Raises:
        ConfigurationError: the name is not letters, digits and underscores (63 at most).
    """
    if not _NAME.match(name):
        raise ConfigurationError(
            f"Warehouse {what} {name!r} is not a plain identifier (letters, digits and "
            "underscores, at most 63).",
            fix=f"rename the {what} in the transform's output (e.g. withColumnRenamed).",
        )
    return f'"{name}"'


def qualified(schema: str, table: str) -> str:
    """``"schema"."table"``."""
    return f"{identifier(schema, 'schema')}.{identifier(table, 'table')}"


def _columns(names: Sequence[str], prefix: str = "") -> str:
    return ", ".join(f"{prefix}{identifier(c)}" for c in names)


def _keys_equal(keys: Sequence[str], left: str, right: str) -> str:
    return " AND ".join(f"{left}.{identifier(k)} = {right}.{identifier(k)}" for k in keys)


# -- the state table


def create_state(state: str) -> str:
    """The state table, if missing."""
    return (
        f"CREATE TABLE IF NOT EXISTS {state} (pipeline text PRIMARY KEY, position bigint NOT "
        "NULL, batch_id text NOT NULL, root text NOT NULL, fenced boolean NOT NULL DEFAULT "
        "false, last_batch_id text, rows_inserted bigint, rows_updated bigint, rows_deleted "
        "bigint, loaded_at timestamptz NOT NULL DEFAULT now())"
    )


def lock_pipeline() -> str:
    """One load of a pipeline at a time (held to the transaction's end). Parameter: the
    lock's name."""
    return "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


def try_lock_attempt() -> str:
    """Hold a batch's staging for this session, if no other attempt of the batch holds it
    (released when the session ends, a killed one's too). Parameter: the lock's name."""
    return "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))"


def unlock_attempt() -> str:
    """Release :func:`try_lock_attempt`'s lock. Parameter: the lock's name."""
    return "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"


def read_state(state: str) -> str:
    """A pipeline's state row. Parameter: the pipeline."""
    return f"SELECT {_columns(STATE_COLUMNS)} FROM {state} WHERE pipeline = %s"


def read_states(state: str) -> str:
    """Every pipeline's state row."""
    return f"SELECT {_columns(STATE_COLUMNS)} FROM {state} ORDER BY pipeline"


def write_state(state: str) -> str:
    """Record a load (or a fence) of a pipeline. The position only moves forward (a
    replay's is below it); ``last_batch_id`` is the newest batch applied, a replay too.
    Parameters: pipeline, position, batch_id, root, fenced, rows inserted, updated,
    deleted."""
    return (
        f"INSERT INTO {state} AS s (pipeline, position, batch_id, root, fenced, last_batch_id, "
        "rows_inserted, rows_updated, rows_deleted, loaded_at) VALUES (%s, %s, %s, %s, %s, "
        "%s, %s, %s, %s, now()) ON CONFLICT (pipeline) DO UPDATE SET "
        "batch_id = CASE WHEN EXCLUDED.position >= s.position THEN EXCLUDED.batch_id ELSE "
        "s.batch_id END, fenced = CASE WHEN EXCLUDED.position >= s.position THEN "
        "EXCLUDED.fenced ELSE s.fenced END, position = GREATEST(s.position, "
        "EXCLUDED.position), root = EXCLUDED.root, last_batch_id = EXCLUDED.last_batch_id, "
        "rows_inserted = EXCLUDED.rows_inserted, rows_updated = EXCLUDED.rows_updated, "
        "rows_deleted = EXCLUDED.rows_deleted, loaded_at = now()"
    )


def delete_state(state: str) -> str:
    """Forget a pipeline's loads (the table was emptied). Parameter: the pipeline."""
    return f"DELETE FROM {state} WHERE pipeline = %s"


# -- the catalog


def table_columns() -> str:
    """A table's columns in order: name, type, nullable, has a default. Parameters:
    schema, table."""
    return (
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull, "
        "a.atthasdef FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN "
        "pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s "
        "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
    )


def unique_keys() -> str:
    """The column sets of a table's primary key and unique indexes. Parameters: schema,
    table."""
    return (
        "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i JOIN pg_class c "
        "ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace JOIN "
        "pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey) WHERE "
        "n.nspname = %s AND c.relname = %s AND i.indisunique AND i.indpred IS NULL GROUP BY "
        "i.indexrelid"
    )


def has_rows(table: str) -> str:
    """Whether a table holds a row."""
    return f"SELECT EXISTS (SELECT 1 FROM {table})"


def create_target(table: str, columns: Sequence[tuple[str, str]], keys: Sequence[str]) -> str:
    """The target table: the output's columns (name, type), the position and batch
    columns, and a primary key on ``keys`` (none: an append target)."""
    body = ", ".join(f"{identifier(n)} {t}" for n, t in columns)
    body += f", {identifier(SEQ_COLUMN)} bigint NOT NULL, {identifier(BATCH_COLUMN)} text"
    if keys:
        body += f", PRIMARY KEY ({_columns(keys)})"
    return f"CREATE TABLE IF NOT EXISTS {table} ({body})"


def create_schema(schema: str) -> str:
    """A schema, if missing."""
    return f"CREATE SCHEMA IF NOT EXISTS {identifier(schema, 'schema')}"


# -- the staging table


def create_stage(stage: str, target: str, keys: Sequence[str]) -> str:
    """An unlogged table of the target's columns (their types and NOT NULLs, no keys; the
    key columns nullable, so that a NULL key is refused by name, not by the staging) and
    the change type: where a batch's rows land before the transaction applies them."""
    nullable = "".join(f", ALTER COLUMN {identifier(k)} DROP NOT NULL" for k in keys)
    return (
        f"CREATE UNLOGGED TABLE {stage} (LIKE {target} INCLUDING DEFAULTS); "
        f"ALTER TABLE {stage} ADD COLUMN {identifier(CHANGE_TYPE)} text{nullable}"
    )


def drop_table(table: str) -> str:
    """Drop a (staging) table, if it exists."""
    return f"DROP TABLE IF EXISTS {table}"


def stages_of() -> str:
    """The staging tables a pipeline's earlier attempts left. Parameters: schema, LIKE
    pattern."""
    return (
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname LIKE %s"
    )


def copy_into(stage: str, columns: Sequence[str]) -> str:
    """``COPY`` of the driver's rows into the stage, in the text format."""
    return f"COPY {stage} ({_columns(columns)}) FROM STDIN"


def null_key(stage: str, keys: Sequence[str]) -> str:
    """A staged row whose key holds NULL: the key columns of the first one."""
    where = " OR ".join(f"{identifier(k)} IS NULL" for k in keys)
    return f"SELECT {_columns(keys)} FROM {stage} WHERE {where} LIMIT 1"


def duplicate_key(stage: str, keys: Sequence[str]) -> str:
    """A key staged twice (a transform's output with several rows of one key)."""
    return (
        f"SELECT {_columns(keys)} FROM {stage} GROUP BY {_columns(keys)} HAVING count(*) > 1 "
        "LIMIT 1"
    )


def has_deletes(stage: str) -> str:
    """Whether a staged row is a delete."""
    return f"SELECT EXISTS (SELECT 1 FROM {stage} WHERE {identifier(CHANGE_TYPE)} = '{DELETE}')"


# -- the load, inside one transaction


def delete_all(target: str) -> str:
    """A full load's first step: the target emptied (``DELETE``, so readers keep seeing
    the old rows until the transaction commits)."""
    return f"DELETE FROM {target}"


def insert_all(target: str, stage: str, columns: Sequence[str]) -> str:
    """Every staged row but deletes, inserted (an append, or a full load)."""
    return (
        f"INSERT INTO {target} ({_columns(columns)}) SELECT {_columns(columns)} FROM {stage} "
        f"WHERE {identifier(CHANGE_TYPE)} IS DISTINCT FROM '{DELETE}'"
    )


def delete_changed(target: str, stage: str, keys: Sequence[str]) -> str:
    """A merge's deletes: the target's rows of each deleted key, unless a newer batch
    wrote them (``_wm_seq``)."""
    seq = identifier(SEQ_COLUMN)
    return (
        f"DELETE FROM {target} t USING {stage} s WHERE s.{identifier(CHANGE_TYPE)} = "
        f"'{DELETE}' AND {_keys_equal(keys, 't', 's')} AND t.{seq} <= s.{seq}"
    )


def upsert_changed(target: str, stage: str, columns: Sequence[str], keys: Sequence[str]) -> str:
    """A merge's upserts: inserted, or updated over rows no newer than the batch; counts
    inserted and updated rows (``xmax = 0`` on a row the statement inserted)."""
    seq = identifier(SEQ_COLUMN)
    changed = [c for c in columns if c not in keys]
    sets = ", ".join(f"{identifier(c)} = EXCLUDED.{identifier(c)}" for c in changed)
    return (
        f"WITH applied AS (INSERT INTO {target} AS t ({_columns(columns)}) SELECT "
        f"{_columns(columns)} FROM {stage} WHERE {identifier(CHANGE_TYPE)} IS DISTINCT FROM "
        f"'{DELETE}' ON CONFLICT ({_columns(keys)}) DO UPDATE SET {sets} WHERE t.{seq} <= "
        "EXCLUDED." + seq + " RETURNING (xmax = 0) AS inserted) SELECT count(*) FILTER "
        "(WHERE inserted), count(*) FILTER (WHERE NOT inserted) FROM applied"
    )


def update_changed(target: str, stage: str, columns: Sequence[str], keys: Sequence[str]) -> str:
    """A replay's upserts: only keys the target holds, over rows no newer than the batch
    (a key it lacks may have been deleted by a newer batch)."""
    seq = identifier(SEQ_COLUMN)
    changed = [c for c in columns if c not in keys]
    sets = ", ".join(f"{identifier(c)} = s.{identifier(c)}" for c in changed)
    return (
        f"UPDATE {target} t SET {sets} FROM {stage} s WHERE s.{identifier(CHANGE_TYPE)} IS "
        f"DISTINCT FROM '{DELETE}' AND {_keys_equal(keys, 't', 's')} AND t.{seq} <= s.{seq}"
    )


def count_rows(table: str) -> str:
    """A table's row count."""
    return f"SELECT count(*) FROM {table}"


__all__ = [
    "STATE_COLUMNS",
    "copy_into",
    "count_rows",
    "create_schema",
    "create_stage",
    "create_state",
    "create_target",
    "delete_all",
    "delete_changed",
    "delete_state",
    "drop_table",
    "duplicate_key",
    "has_deletes",
    "has_rows",
    "identifier",
    "insert_all",
    "lock_pipeline",
    "null_key",
    "qualified",
    "read_state",
    "try_lock_attempt",
    "unlock_attempt",
    "read_states",
    "stages_of",
    "table_columns",
    "unique_keys",
    "update_changed",
    "upsert_changed",
    "write_state",
]
