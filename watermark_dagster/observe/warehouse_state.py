"""What a warehouse target holds, read without a JVM: each pipeline's loaded position from
the state table, and whether the table is missing, empty or filled (the first-load rule).

The state table has one row per pipeline (:data:`~.warehouse_sql.STATE_COLUMNS`), written
by the load's own transaction (:mod:`~watermark_dagster.write.warehouse`): the position
and id of the newest batch applied, the control root that applied it, whether a forced
change fenced it, and what the last load changed.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.config.warehouse import PostgresTarget
from watermark_dagster.core.observations import TargetState
from watermark_dagster.errors import ConfigurationError, RetryableError, WatermarkError
from watermark_dagster.observe import database_state
from watermark_dagster.observe import warehouse_sql as sql
from watermark_dagster.observe.database_state import connect, driver_message


@dataclass(frozen=True)
class WarehouseState:
    """One pipeline's row of a warehouse's state table.

    Attributes:
        pipeline: the pipeline.
        position: the position (``Batch.write_seq``) of the newest batch loaded or fenced.
        batch_id: that batch.
        root: the control root that scheduled it.
        fenced: a forced change fenced the batch (no write of it may land); not a load.
        last_batch_id: the last batch applied, a replay's too.
        rows_inserted, rows_updated, rows_deleted: what the last load changed.
        loaded_at: when the row was last written (the database's clock, UTC).
    """

    pipeline: str
    position: int
    batch_id: str
    root: str
    fenced: bool
    last_batch_id: str | None
    rows_inserted: int | None
    rows_updated: int | None
    rows_deleted: int | None
    loaded_at: datetime | None

    def applied(self, batch_id: str, write_seq: int, root: str) -> bool:
        """Whether this row shows ``batch_id`` (at ``write_seq``, of control root ``root``)
        applied: loaded, not fenced."""
        if self.root != root:
            return False
        newest = self.position == write_seq and self.batch_id == batch_id and not self.fenced
        return newest or self.last_batch_id == batch_id


def credentials_of(target: PostgresTarget) -> dict[str, Any]:
    """The target's user and password, read from the environment now.

    Raises:
        ConfigurationError: a referenced variable is not set.
    """
    given = {k: v for k, v in (("user", target.user), ("password", target.password)) if v}
    return dict(resolved_options(given, f"Warehouse target {target.table}") or {})


LOAD_SECONDS = 3600.0
"""How long one statement of a load may take before the connection is taken as broken
(a first load of millions of rows upserts for minutes; a state read keeps the connect
timeout, ``CONNECT_SECONDS``)."""


@contextmanager
def connected(
    target: PostgresTarget, *, pipeline: str, statement_seconds: float | None = None
) -> Iterator[Any]:
    """A connection to the target's database, in UTC and without autocommit; closed (a
    transaction still open rolled back) on the way out. It is opened within
    ``CONNECT_SECONDS``; each statement may then take ``statement_seconds`` (default: the
    same). pg8000 keeps its connect timeout as the socket's for every later read, so a
    load sets its own on the socket (pg8000 1.31's ``_usock``, the pinned release).

    Raises:
        ConfigurationError: a credential variable is not set, or the server refused the
            credentials (the message names neither value).
        RetryableError: the server did not answer.
    """
    credentials = credentials_of(target)
    try:
        connection = connect(target, credentials, timeout=database_state.CONNECT_SECONDS)
    except Exception as e:  # the driver's errors share no base class with ours
        text = driver_message(e, credentials.values())
        if "28P01" in text or "28000" in text or "password" in text.lower():
            names = ", ".join(
                f"{what} from ${ref.name}"
                for what, ref in (("user", target.user), ("password", target.password))
                if ref is not None
            )
            raise ConfigurationError(
                f"Pipeline '{pipeline}': the warehouse at {target.url} refused the "
                f"credentials ({text}); nothing was written.",
                pipeline=pipeline,
                fix=f"check the variables the target reads ({names or 'none given'}) where the "
                "code location and its runs start.",
            ) from None
        raise RetryableError(
            f"Pipeline '{pipeline}': the warehouse at {target.url} did not answer ({text}); "
            "nothing was written.",
            pipeline=pipeline,
            fix="check that the database is up and reachable from the runs; the batch is "
            "retried as it stands (its rows are read again from the same pinned ranges).",
        ) from None
    if statement_seconds is not None:
        socket = getattr(connection, "_usock", None)
        if socket is not None:
            socket.settimeout(statement_seconds)
    try:
        yield connection
    finally:
        connection.close()


def state_row(cursor: Any, target: PostgresTarget, pipeline: str) -> WarehouseState | None:
    """``pipeline``'s state row, through an open cursor (None: no row, or no state table)."""
    if not _exists(cursor, target.state_schema, target.state_name):
        return None
    cursor.execute(sql.read_state(_state(target)), (pipeline,))
    row = cursor.fetchone()
    return None if row is None else _state_of(row)


def read_state(target: PostgresTarget, pipeline: str) -> WarehouseState | None:
    """``pipeline``'s state row in its warehouse (None: it never loaded there).

    Raises:
        ConfigurationError, RetryableError: as :func:`connected`.
    """
    with connected(target, pipeline=pipeline) as connection:
        return state_row(connection.cursor(), target, pipeline)


def read_states(target: PostgresTarget) -> tuple[WarehouseState, ...]:
    """Every pipeline's row of the target's state table (none without one)."""
    with connected(target, pipeline="") as connection:
        cursor = connection.cursor()
        if not _exists(cursor, target.state_schema, target.state_name):
            return ()
        cursor.execute(sql.read_states(_state(target)))
        return tuple(_state_of(r) for r in cursor.fetchall())


def target_state(target: PostgresTarget, pipeline: str) -> TargetState:
    """Whether the warehouse table is missing, empty or filled, for the first-load rule.

    Raises:
        ConfigurationError, RetryableError: as :func:`connected`.
    """
    with connected(target, pipeline=pipeline) as connection:
        cursor = connection.cursor()
        if not _exists(cursor, target.schema, target.name):
            return TargetState.MISSING
        cursor.execute(sql.has_rows(sql.qualified(target.schema, target.name)))
        row = cursor.fetchone()
        return TargetState.FILLED if row and row[0] else TargetState.EMPTY


def row_count(target: PostgresTarget, pipeline: str) -> int | None:
    """The warehouse table's row count (None: no table yet)."""
    with connected(target, pipeline=pipeline) as connection:
        cursor = connection.cursor()
        if not _exists(cursor, target.schema, target.name):
            return None
        cursor.execute(sql.count_rows(sql.qualified(target.schema, target.name)))
        row = cursor.fetchone()
        return int(row[0]) if row else 0


class WarehouseLooks:
    """The first-load rule's looks at warehouse tables, for one observer.

    A table once seen filled stays so for the rule (emptied or dropped, it matters only to a
    pipeline that never succeeded, and a load of changes into a dropped table is refused), so
    while the warehouse does not answer, a look goes on with it. A table never seen filled
    fails the look, naming the warehouse: the rule cannot tell whether it must load it in full.
    """

    def __init__(self) -> None:
        self._filled: set[str] = set()
        self._lock = threading.Lock()

    def state(self, target: PostgresTarget, pipeline: str) -> TargetState:
        """:func:`target_state`, or ``FILLED`` for a table seen filled when it cannot be read.

        Raises:
            ConfigurationError, RetryableError: the warehouse could not be read, and the
                table was never seen filled.
        """
        try:
            state = target_state(target, pipeline)
        except WatermarkError:
            with self._lock:
                if target.location in self._filled:
                    return TargetState.FILLED
            raise
        if state is TargetState.FILLED:
            with self._lock:
                self._filled.add(target.location)
        return state


def table_exists(target: PostgresTarget, pipeline: str) -> bool:
    """Whether the warehouse table exists."""
    return target_state(target, pipeline) is not TargetState.MISSING


def _exists(cursor: Any, schema: str, table: str) -> bool:
    cursor.execute(sql.table_columns(), (schema, table))
    return bool(cursor.fetchall())


def _state(target: PostgresTarget) -> str:
    return sql.qualified(target.state_schema, target.state_name)


def _state_of(row: Any) -> WarehouseState:
    (pipeline, position, batch_id, root, fenced, last, inserted, updated, deleted, at) = row
    return WarehouseState(
        str(pipeline),
        int(position),
        str(batch_id),
        str(root),
        bool(fenced),
        None if last is None else str(last),
        None if inserted is None else int(inserted),
        None if updated is None else int(updated),
        None if deleted is None else int(deleted),
        at,
    )


__all__ = [
    "LOAD_SECONDS",
    "WarehouseLooks",
    "WarehouseState",
    "connected",
    "credentials_of",
    "read_state",
    "read_states",
    "row_count",
    "state_row",
    "table_exists",
    "target_state",
]
