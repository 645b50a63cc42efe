"""Pruning old batch partitions from Dagster, at a cost that does not grow with history.

One dynamic partition is added per batch; without pruning the partitions view, the
partition-status queries behind it and every full listing of the keys grow with the
number of batches ever run. When a batch completes, the finalizer deletes the partitions
of ended batches older than the newest ``keep_batch_partitions`` sequence numbers.

What a tick reads is bounded: one page of the *oldest* partition keys (Dagster returns
them in the order they were added, which is batch order), at most :data:`PRUNE_PER_TICK`
keys, never the whole list; gaps (keys pruned before or never added) cost nothing. An
instance that already holds many old partitions catches up by at most that many
deletions per completed batch, and converges since a batch adds one partition. A key is
kept while its batch is open, a run of it is in flight or a running backfill targets it
(Dagster fails such a backfill as a whole once one of its partitions is deleted). The
control tables are read only when some key is beyond retention (the open batches, a
filtered read), and Dagster's runs only for those keys. Keys at the head that stay (not
batch ids, added by hand; open batches) take a slot of the page each: pruning stalls only
if there are :data:`PRUNE_PER_TICK` of them.

What stays: the batches, their ranges and history in the control tables (``watermark
batches``, ``watermark batch ID``, ``watermark replay``, which records a new batch with a
new partition); in Dagster the runs and the materialization events of the pruned keys
(the asset's event log still lists them) but not their partition status; a run that names
a pruned key is refused by Dagster as an unknown partition, and the UI offers no pruned key
to a new backfill.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass

from dagster import DagsterInstance, DagsterRunStatus, DeleteDynamicPartitionsRequest, RunsFilter

# Private, and kept: Dagster 1.13 exports no backfill status to ask for the running
# backfills by, and a running asset backfill fails as a whole once a partition it targets
# is deleted ("Targeted partitions ... have been removed since this backfill was stored").
from dagster._core.execution.backfill import BulkActionStatus

from watermark_dagster.core.planning import prunable_batch_partitions
from watermark_dagster.dagster_defs.names import BATCHES_PARTITIONS_NAME
from watermark_dagster.dagster_defs.runs import FINISHED, PARTITION_NAME_TAG
from watermark_dagster.errors import ConfigurationError

# The most partitions one finalizer tick deletes, and so the size of the page it reads:
# bounds a catch-up tick on an instance that holds thousands of old partitions. Dagster
# deletes a key per statement (about 5 ms CPU each on the SQLite instance), so 50 keep the
# daemon's handling of a tick near the 0.3 s a sensor tick may cost.
PRUNE_PER_TICK = 50

_IN_FLIGHT = [s for s in DagsterRunStatus if s not in FINISHED]
_RUNNING_BACKFILL = (
    BulkActionStatus.REQUESTED,
    BulkActionStatus.CANCELING,
    BulkActionStatus.FAILING,
)


def check_keep_batch_partitions(value: object) -> int:
    """``value`` as a ``keep_batch_partitions`` setting: a whole number, 0 or more.

    Raises:
        ConfigurationError: anything else; names the value and the fix.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(
            f"keep_batch_partitions={value!r} is not a number of batches to keep.",
            fix="give a whole number of newest batch partitions to keep in Dagster, such as "
            "1000, or 0 to keep every partition (WATERMARK_KEEP_BATCH_PARTITIONS or "
            "WatermarkSettings(keep_batch_partitions=...)).",
        )
    return value


@dataclass(frozen=True)
class Pruning:
    """What one pruning pass found.

    Attributes:
        delete: the partition keys to delete, oldest first.
        held: keys beyond retention kept for now: their batch is open (PLANNED), a
            Dagster run of the partition is in flight or a running backfill targets it.
        partitions_name: the dynamic partitions definition they belong to.
    """

    delete: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    partitions_name: str = BATCHES_PARTITIONS_NAME

    def request(self) -> DeleteDynamicPartitionsRequest | None:
        """The sensor's request deleting :attr:`delete` (None when there is nothing)."""
        if not self.delete:
            return None
        return DeleteDynamicPartitionsRequest(self.partitions_name, list(self.delete))


def stale_batch_partitions(
    instance: DagsterInstance,
    *,
    newest_seq: int,
    keep: int,
    open_batch_ids: Callable[[], Collection[str]],
    limit: int = PRUNE_PER_TICK,
    partitions_name: str = BATCHES_PARTITIONS_NAME,
) -> Pruning:
    """The batch partitions to delete now that batch ``newest_seq`` ended: among the
    ``limit`` oldest partition keys, those of batches beyond the newest ``keep`` sequence
    numbers, except open batches and partitions a run is in flight for or a running
    backfill targets.

    Args:
        instance: the Dagster instance holding the partitions and runs.
        newest_seq: the sequence number of the batch that just completed.
        keep: ``keep_batch_partitions`` (0: keep all; nothing is read).
        open_batch_ids: the ids of the open batches; called only when some key is beyond
            retention (it reads the control tables).
        limit: the most keys read, and so deleted, in this pass.
        partitions_name: the location's batch partitions (runs of another location's
            batch with the same id only hold a key a little longer).
    """
    if keep <= 0 or newest_seq <= keep:
        return Pruning()
    oldest = instance.get_paginated_dynamic_partitions(
        partitions_name, limit=limit, ascending=True
    ).results
    beyond = prunable_batch_partitions(oldest, newest_seq=newest_seq, keep=keep)
    if not beyond:
        return Pruning()
    running = {
        run.tags[PARTITION_NAME_TAG]
        for run in instance.get_runs(
            RunsFilter(tags={PARTITION_NAME_TAG: beyond}, statuses=_IN_FLIGHT)
        )
    }
    held = set(open_batch_ids()) | running | _backfill_targets(instance, beyond)
    delete = prunable_batch_partitions(beyond, newest_seq=newest_seq, keep=keep, held=held)
    return Pruning(tuple(delete), tuple(k for k in beyond if k in held), partitions_name)


def _backfill_targets(instance: DagsterInstance, keys: Collection[str]) -> set[str]:
    """The keys among ``keys`` that a running backfill targets; all of them when a running
    backfill's targets cannot be read without the asset graph (a job backfill of all
    partitions, an asset backfill stored in the older serialized form). Running backfills
    are few: this reads only them."""
    wanted = set(keys)
    held: set[str] = set()
    for status in _RUNNING_BACKFILL:
        for backfill in instance.get_backfills(status=status):
            if backfill.asset_backfill_data is not None:
                subsets = backfill.asset_backfill_data.target_subset.partitions_subsets_by_asset_key
                for subset in subsets.values():
                    held |= wanted & set(subset.get_partition_keys())
            elif backfill.partition_names is not None:
                held |= wanted & set(backfill.partition_names)
            else:
                return wanted
    return held
