"""What a warehouse target's state row says about a batch, and the state row's fences:
the rules of :mod:`~watermark_dagster.write.fences` for a database table.

The state row (one per pipeline, in the warehouse's own ``state_table``) is written in the
load's transaction (:mod:`~watermark_dagster.write.warehouse`). It shows a batch applied
(:func:`applied`, :func:`warehouse_evidence`), binds the table to one control root
(:func:`bound_elsewhere`), and takes a forced change's fence (:func:`fence_warehouse`): the
batch's position marked fenced, under the lock every load takes.
"""

import hashlib
from typing import Any

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.warehouse import PostgresTarget
from watermark_dagster.core.records import TargetMark
from watermark_dagster.errors import (
    BatchStateError,
    TargetBoundElsewhereError,
    TerminalError,
    reset_command,
)
from watermark_dagster.observe import warehouse_sql as sql
from watermark_dagster.observe.warehouse_state import WarehouseState, connected, state_row
from watermark_dagster.write.commits import UNBOUND_ROOT, Fence

STAGE_PREFIX = "wm_stage_"


def warehouse_of(pipeline: Pipeline) -> PostgresTarget:
    """The pipeline's warehouse target (a Delta target is a programming error here)."""
    if pipeline.warehouse is None:
        raise TypeError(f"pipeline {pipeline.name} has no warehouse target")
    return pipeline.warehouse


def table_of(target: PostgresTarget) -> str:
    """The target table, quoted."""
    return sql.qualified(target.schema, target.name)


def state_table_of(target: PostgresTarget) -> str:
    """The state table, quoted."""
    return sql.qualified(target.state_schema, target.state_name)


def lock_name(target: PostgresTarget, pipeline: str) -> str:
    """The advisory lock every load and fence of ``pipeline`` takes."""
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

    state = read_state(warehouse_of(pipeline), pipeline.name)
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


def bound_elsewhere(
    pipeline: Pipeline, batch_id: str, write_seq: int, root: str, state: WarehouseState | None
) -> TargetBoundElsewhereError:
    """The refusal of a table this control root did not load (``state`` None: rows and
    no state row)."""
    target = warehouse_of(pipeline)
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


def applied(
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
        raise bound_elsewhere(pipeline, batch_id, write_seq, root, state)
    if replay:
        return not first_attempt and state.last_batch_id == batch_id
    if state.position < write_seq:
        return False
    if state.position == write_seq and state.batch_id == batch_id and state.fenced:
        raise _fenced_error(pipeline.name, batch_id, state.position)
    earlier = first_attempt or (first is not None and first.holds(write_seq))
    if state.position > write_seq or state.batch_id != batch_id or earlier:
        raise bound_elsewhere(pipeline, batch_id, write_seq, root, state)
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

    state = read_state(warehouse_of(pipeline), pipeline.name)
    applied(
        state,
        pipeline,
        batch_id,
        write_seq,
        root,
        first_attempt=first_attempt,
        first=first,
        replay=replay,
    )


def warehouse_evidence(
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    root: str,
    *,
    first: TargetMark | None = None,
) -> str | None:
    """What shows that ``pipeline``'s warehouse already holds batch ``batch_id`` (a run
    killed between its commit and its checkpoint), or None: its state row. ``first`` is the
    batch's first attempt's mark: a position the row held already then was written by an
    earlier life of the control root (restored from an older copy, its batch ids issued
    again), never by this batch."""
    from watermark_dagster.observe.warehouse_state import read_state

    if first is not None and first.holds(write_seq):
        return None
    state = read_state(warehouse_of(pipeline), pipeline.name)
    if state is None or not state.applied(batch_id, write_seq, root):
        return None
    return (
        f"the warehouse state row of {pipeline.name} in {warehouse_of(pipeline).state_table} "
        f"(position {state.position}, batch {state.last_batch_id})"
    )


def fence_warehouse(pipeline: Pipeline, batch_id: str, write_seq: int, root: str) -> Fence:
    """Fence ``pipeline``'s warehouse against scheduled batch ``batch_id``: its state row
    takes the batch's position marked fenced, so no load of the batch commits afterwards
    (the load's transaction reads the row under the same lock). When the batch's load won
    the race, its evidence instead."""
    target = warehouse_of(pipeline)
    with connected(target, pipeline=pipeline.name) as connection:
        cursor = connection.cursor()
        connection.autocommit = True
        create_state(cursor, target)
        connection.autocommit = False
        cursor.execute(sql.lock_pipeline(), (lock_name(target, pipeline.name),))
        state = state_row(cursor, target, pipeline.name)
        if state is not None and state.applied(batch_id, write_seq, root):
            connection.rollback()
            return Fence(applied=f"the warehouse state row at position {state.position}")
        if state is not None and state.position >= write_seq:
            connection.rollback()
            return Fence(fenced=state.position)
        cursor.execute(
            sql.write_state(state_table_of(target)),
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


def create_state(cursor: Any, target: PostgresTarget) -> None:
    """The state table (and its schema), if missing."""
    cursor.execute(sql.create_schema(target.state_schema))
    cursor.execute(sql.create_state(state_table_of(target)))


def table_gone(pipeline: Pipeline, batch_id: str, state: WarehouseState) -> TerminalError:
    """The refusal of a batch of changes into a table dropped behind the pipeline's back."""
    target = warehouse_of(pipeline)
    resets = " and ".join(f"`{reset_command(u)} --yes`" for u in pipeline.upstreams)
    return TerminalError(
        f"Pipeline '{pipeline.name}': warehouse table {target.table} is gone, but its state "
        f"row records loads up to position {state.position} (batch {state.batch_id}). "
        f"Loading only batch {batch_id}'s changes would lose every earlier row; nothing "
        "was written.",
        pipeline=pipeline.name,
        batch_id=batch_id,
        fix=f"run {resets} (the open batch is abandoned), then `watermark run`: with the "
        "table missing, the next batch loads it in full from the upstreams.",
    )


__all__ = [
    "STAGE_PREFIX",
    "applied",
    "bound_elsewhere",
    "check_warehouse_bound",
    "create_state",
    "fence_warehouse",
    "lock_name",
    "stage_name",
    "state_table_of",
    "table_gone",
    "table_of",
    "warehouse_evidence",
    "warehouse_mark",
    "warehouse_of",
]
