"""Where a warehouse target stands (:func:`warehouse_status`): its state row, read from the
warehouse itself, and the lake versions the batch it names pinned. ``watermark list`` and
``get`` show it (the seeds' "redshift_status"), and the ``watermark_warehouse_lag`` check
compares those versions with the lake's newest.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.errors import WatermarkError

if TYPE_CHECKING:
    from watermark_dagster.core.records import Batch
    from watermark_dagster.store import WatermarkStore


class WarehouseLoad(StrEnum):
    """A warehouse target's state, as ``list`` and ``get`` show it.

    * ``loaded``: its state row names the newest batch the pipeline succeeded on;
    * ``behind``: the control tables record a newer successful batch than the warehouse
      (its state row was restored or edited: ``watermark verify`` compares the rows);
    * ``fenced``: a forced change fenced the batch the row names (the next load clears it);
    * ``not loaded``: no batch was loaded yet;
    * ``unreachable``: the warehouse did not answer, or refused the credentials.
    """

    LOADED = "loaded"
    BEHIND = "behind"
    FENCED = "fenced"
    NOT_LOADED = "not loaded"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class WarehouseStatus:
    """One warehouse target's standing.

    Attributes:
        pipeline: the pipeline loading it.
        table: the warehouse table (``schema.table``).
        url: the database's JDBC URL (no credential in it).
        state: see :class:`WarehouseLoad`.
        position: the position of the batch the state row names (None: no row).
        batch_id: the last batch applied (a replay's too).
        loaded_at: when the row was written (the database's clock).
        rows: inserted, updated and deleted rows of the last load.
        loaded_versions: per upstream, the lake version that batch pinned (what the
            warehouse holds); empty when the batch is not in these control tables.
        succeeded: the newest batch the control tables record the pipeline succeeded on.
        error: why the warehouse could not be read (``unreachable``).
    """

    pipeline: str
    table: str
    url: str
    state: WarehouseLoad
    position: int | None = None
    batch_id: str | None = None
    loaded_at: datetime | None = None
    rows: Mapping[str, int | None] = field(default_factory=dict[str, int | None])
    loaded_versions: Mapping[str, int | None] = field(default_factory=dict[str, int | None])
    succeeded: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        """The status as ``--json`` shows it."""
        return {
            "pipeline": self.pipeline,
            "table": self.table,
            "url": self.url,
            "state": str(self.state),
            "position": self.position,
            "batch_id": self.batch_id,
            "loaded_at": None if self.loaded_at is None else self.loaded_at.isoformat(),
            "rows": dict(self.rows),
            "loaded_versions": dict(self.loaded_versions),
            "succeeded": self.succeeded,
            "error": self.error,
        }

    @property
    def text(self) -> str:
        """One line: the state, the batch and when."""
        if self.state is WarehouseLoad.UNREACHABLE:
            return f"{self.state}: {self.error}"
        if self.position is None:
            return str(self.state)
        at = "" if self.loaded_at is None else f" at {self.loaded_at:%Y-%m-%d %H:%M:%S}"
        return f"{self.state} {self.batch_id} (position {self.position}){at}"


def warehouse_status(store: "WatermarkStore", pipeline: Pipeline) -> WarehouseStatus:
    """Where ``pipeline``'s warehouse target stands (one connection, no JVM)."""
    from watermark_dagster.core.records import CheckpointStatus
    from watermark_dagster.observe.warehouse_state import read_state

    target = pipeline.warehouse
    if target is None:
        raise TypeError(f"pipeline {pipeline.name} has no warehouse target")
    base = (pipeline.name, f"{target.schema}.{target.name}", target.url)
    try:
        state = read_state(target, pipeline.name)
    except WatermarkError as e:
        return WarehouseStatus(*base, state=WarehouseLoad.UNREACHABLE, error=e.reason)
    done = {
        c.batch_id
        for c in store.checkpoints(pipeline=pipeline.name)
        if c.status is CheckpointStatus.SUCCESS
    }
    batches = {b.batch_id: b for b in store.batches() if b.batch_id in done}
    newest = max(batches.values(), key=lambda b: b.write_seq, default=None)
    succeeded = None if newest is None else newest.batch_id
    if state is None:
        return WarehouseStatus(*base, state=WarehouseLoad.NOT_LOADED, succeeded=succeeded)
    named = store_batch(store, state.batch_id)
    loaded = (
        {}
        if named is None
        else {u: i.snapshot_version for u, i in named.inputs.items() if u in pipeline.upstreams}
    )
    if state.fenced:
        load = WarehouseLoad.FENCED
    elif newest is not None and newest.write_seq > state.position:
        load = WarehouseLoad.BEHIND
    else:
        load = WarehouseLoad.LOADED
    return WarehouseStatus(
        *base,
        state=load,
        position=state.position,
        batch_id=state.last_batch_id or state.batch_id,
        loaded_at=state.loaded_at,
        rows={
            "inserted": state.rows_inserted,
            "updated": state.rows_updated,
            "deleted": state.rows_deleted,
        },
        loaded_versions=loaded,
        succeeded=succeeded,
    )


def store_batch(store: "WatermarkStore", batch_id: str) -> "Batch | None":
    """The batch ``batch_id`` of these control tables, or None (another root's)."""
    from watermark_dagster.errors import BatchStateError

    try:
        return store.get_batch(batch_id)
    except BatchStateError:
        return None


__all__ = ["WarehouseLoad", "WarehouseStatus", "store_batch", "warehouse_status"]
