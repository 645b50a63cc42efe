"""Old batch partitions pruned from Dagster by the finalizer, against a real instance.

No JVM: upstreams are real Delta tables written with delta-rs, the sensors tick through
the headless runner (which applies their partition requests as the daemon does), and a
pipeline's success is the SUCCESS checkpoint its run would record.
"""

import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    DagsterRunStatus,
)
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.tags import PARTITION_NAME_TAG
from dagster._core.test_utils import create_run_for_test
from deltalake import write_deltalake

from watermark_dagster.cli.app import run as watermark
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.core.records import BatchStatus, CheckpointStatus, batch_id_for
from watermark_dagster.dagster_defs.component import settings_from_environment
from watermark_dagster.dagster_defs.definitions import WatermarkLocation, build_location
from watermark_dagster.dagster_defs.headless import HeadlessRunner
from watermark_dagster.dagster_defs.names import BATCHES_PARTITIONS_NAME
from watermark_dagster.dagster_defs.pruning import PRUNE_PER_TICK, stale_batch_partitions
from watermark_dagster.dagster_defs.sensors import COORDINATOR, FINALIZER
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.operations.replay import plan_replay, run_replay


def _never_called(batch):
    raise AssertionError("no pipeline runs in these tests")


def _commit(path: Path, ids: list[int]) -> None:
    write_deltalake(
        str(path),
        pa.table({"id": pa.array(ids, pa.int64())}),
        mode="append",
        configuration={"delta.enableChangeDataFeed": "true"},
    )


class Lake:
    """One upstream, one merge pipeline reading it, the code location and its instance."""

    def __init__(self, tmp_path: Path, instance: DagsterInstance, keep: int) -> None:
        self.up = tmp_path / "up"
        _commit(self.up, [1])
        _commit(tmp_path / "target", [0])  # as the pipeline's first run would have
        self.registry = Registry(
            upstreams=[DeltaUpstream(name="up", path=str(self.up))],
            pipelines=[
                Pipeline(
                    name="p",
                    upstreams=("up",),
                    target=str(tmp_path / "target"),
                    keys=("id",),
                    transform=_never_called,
                )
            ],
        )
        self.location: WatermarkLocation = build_location(
            self.registry,
            control_root=str(tmp_path / "control"),
            settings=WatermarkSettings(min_batch_interval_seconds=0, keep_batch_partitions=keep),
        )
        self.store = self.location.store()
        self.instance = instance
        self.runner = HeadlessRunner(self.location.definitions, instance)

    def partitions(self) -> list[str]:
        return list(self.instance.get_dynamic_partitions(BATCHES_PARTITIONS_NAME))

    def plan(self) -> str:
        """Commit to the upstream and let the coordinator plan (and add) the next batch."""
        if self.store.batches():  # the first batch reads the commit made above
            _commit(self.up, [len(self.store.batches()) + 2])
        self.runner.tick(COORDINATOR)
        batch = self.store.open_batch()
        assert batch is not None
        return batch.batch_id

    def complete(self, batch_id: str) -> str | None:
        """Record the pipeline's success and tick the finalizer; its skip message."""
        attempt = self.store.begin_checkpoint("p", batch_id, run_id=None)
        self.store.finish_checkpoint("p", batch_id, attempt, CheckpointStatus.SUCCESS, rows_read=0)
        done = self.runner.tick(FINALIZER)
        assert self.store.get_batch(batch_id).status is BatchStatus.COMPLETED
        return done.skip_reason.skip_message if done.skip_reason else None


@pytest.fixture
def instance(dagster_home: Path) -> Iterator[DagsterInstance]:
    found = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        yield found
    finally:
        found.dispose()


class PartitionReads:
    """Counts how the partition keys are read: whole listings, and pages with their size.

    It wraps the instance's own methods and calls through: the reads still happen."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, instance: DagsterInstance) -> None:
        self.listings = 0
        self.pages: list[int] = []
        listing, paging = instance.get_dynamic_partitions, instance.get_paginated_dynamic_partitions

        def get_dynamic_partitions(name):
            self.listings += 1
            return listing(name)

        def get_paginated_dynamic_partitions(name, limit, ascending, cursor=None):
            found = paging(name, limit=limit, ascending=ascending, cursor=cursor)
            self.pages.append(len(found.results))
            return found

        monkeypatch.setattr(instance, "get_dynamic_partitions", get_dynamic_partitions)
        monkeypatch.setattr(
            instance, "get_paginated_dynamic_partitions", get_paginated_dynamic_partitions
        )


def test_the_newest_batches_keep_their_partitions_and_the_count_stays_bounded(
    tmp_path: Path, instance: DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """15 batches with keep_batch_partitions=5: after each completes, exactly the newest 5
    partitions remain. No finalizer tick lists every partition; each reads one page of at
    most PRUNE_PER_TICK keys. The batches stay in the control tables, the pruned keys'
    materializations in Dagster's event log."""
    lake = Lake(tmp_path, instance, keep=5)
    for seq in range(1, 16):
        batch_id = lake.plan()
        assert batch_id == batch_id_for(seq)
        instance.report_runless_asset_event(
            AssetMaterialization(asset_key=AssetKey("p"), partition=batch_id)
        )
        reads = PartitionReads(monkeypatch, instance)
        message = lake.complete(batch_id)
        monkeypatch.undo()
        assert message == f"batch {batch_id} completed"
        assert lake.partitions() == [batch_id_for(s) for s in range(max(1, seq - 4), seq + 1)]
        assert reads.listings == 0
        # One page once a batch is beyond retention (the 6 present: 5 kept, 1 pruned).
        assert reads.pages == ([] if seq <= 5 else [6])
        assert all(size <= PRUNE_PER_TICK for size in reads.pages)

    assert [b.batch_id for b in lake.store.batches()] == [batch_id_for(s) for s in range(15, 0, -1)]
    pruned = lake.store.get_batch("b000001")
    assert pruned.status is BatchStatus.COMPLETED
    assert str(pruned.inputs["up"].range) == "[0, 0]"
    materialized = instance.fetch_materializations(AssetKey("p"), limit=100).records
    assert {r.partition_key for r in materialized} == {batch_id_for(s) for s in range(1, 16)}


def test_keep_0_keeps_every_partition(tmp_path: Path, instance: DagsterInstance) -> None:
    lake = Lake(tmp_path, instance, keep=0)
    for _ in range(3):
        lake.complete(lake.plan())
    assert lake.partitions() == ["b000001", "b000002", "b000003"]


def test_open_batches_and_partitions_with_a_run_in_flight_are_kept(
    tmp_path: Path, instance: DagsterInstance
) -> None:
    """keep_batch_partitions=1: an open replay batch and a partition a run (a UI
    re-execution, say) is in flight for stay until they end; then they go."""
    lake = Lake(tmp_path, instance, keep=1)
    lake.complete(lake.plan())  # b000001
    replay = run_replay_batch(lake)  # b000002, open (PLANNED) while its runs go
    assert replay == "b000002"
    run = create_run_for_test(
        instance,
        job_name="watermark_batch_job",
        status=DagsterRunStatus.STARTED,
        tags={PARTITION_NAME_TAG: "b000001"},
    )
    lake.complete(lake.plan())  # b000003: b000001 and b000002 are beyond retention
    assert lake.partitions() == ["b000001", "b000002", "b000003"]

    instance.report_run_failed(run)
    lake.complete(lake.plan())  # b000004
    assert lake.partitions() == ["b000002", "b000004"]

    lake.store.set_batch_status(replay, BatchStatus.COMPLETED, actor="test")
    lake.complete(lake.plan())  # b000005
    assert lake.partitions() == ["b000005"]


def test_a_partition_a_running_backfill_targets_is_kept_until_it_ends(
    tmp_path: Path, instance: DagsterInstance
) -> None:
    """Dagster fails a running asset backfill as a whole once a partition it targets is
    deleted: such a partition stays until the backfill ends."""
    lake = Lake(tmp_path, instance, keep=1)
    lake.complete(lake.plan())  # b000001
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id="old",
        asset_graph=lake.location.definitions.resolve_asset_graph(),
        partition_names=["b000001"],
        asset_selection=[AssetKey("p")],
        backfill_timestamp=0.0,
        tags={},
        dynamic_partitions_store=instance,
        all_partitions=False,
        title=None,
        description=None,
        run_config=None,
    )
    instance.add_backfill(backfill)
    assert backfill.status is BulkActionStatus.REQUESTED
    lake.complete(lake.plan())  # b000002: b000001 is beyond retention
    assert lake.partitions() == ["b000001", "b000002"]

    instance.update_backfill(backfill.with_status(BulkActionStatus.COMPLETED_SUCCESS))
    lake.complete(lake.plan())  # b000003
    assert lake.partitions() == ["b000003"]


def run_replay_batch(lake: Lake) -> str:
    """Record a replay of up's version 0 and add its partition, as ``watermark replay``
    does before its run starts; the batch stays open (PLANNED)."""
    plan = plan_replay(lake.store, lake.registry, "up", VersionRange(0, 0))
    batch = lake.store.create_range_replay(
        "up",
        plan.range,
        mode=plan.mode,
        pipelines=list(plan.pipelines),
        all_upstreams=["up"],
        actor="test",
    )
    lake.instance.add_dynamic_partitions(BATCHES_PARTITIONS_NAME, [batch.batch_id])
    return batch.batch_id


def test_a_catch_up_deletes_a_bounded_page_per_tick_and_converges(
    instance: DagsterInstance,
) -> None:
    """An instance that kept every partition (400 batches, every third key gone already)
    before retention was set: each pass reads and deletes at most PRUNE_PER_TICK of the
    oldest keys, and the passes converge to the newest keep_batch_partitions."""
    keys = [batch_id_for(s) for s in range(1, 401) if s % 3]
    instance.add_dynamic_partitions(BATCHES_PARTITIONS_NAME, keys)
    deleted: list[int] = []
    for _ in range(20):
        pruning = stale_batch_partitions(
            instance, newest_seq=400, keep=5, open_batch_ids=lambda: {"b000001"}
        )
        if not pruning.delete:
            break
        for key in pruning.delete:
            instance.delete_dynamic_partition(BATCHES_PARTITIONS_NAME, key)
        deleted.append(len(pruning.delete))
    # The open b000001 holds one slot of each page; nothing else stops the passes.
    # 267 keys: b000001 held, b000397, b000398 and b000400 within retention, 263 deleted,
    # 49 a pass (b000001 takes a slot of each page of PRUNE_PER_TICK).
    assert PRUNE_PER_TICK == 50
    assert deleted == [49, 49, 49, 49, 49, 18]
    assert list(instance.get_dynamic_partitions(BATCHES_PARTITIONS_NAME)) == [
        "b000001",
        "b000397",
        "b000398",
        "b000400",
    ]


@pytest.mark.parametrize("value", [-1, "5", 2.5, True, None])
def test_keep_batch_partitions_is_validated(value) -> None:
    with pytest.raises(ConfigurationError) as raised:
        WatermarkSettings(keep_batch_partitions=value)
    assert f"keep_batch_partitions={value!r}" in str(raised.value)
    assert "0 to keep every partition" in str(raised.value)


@pytest.mark.parametrize("raw", ["-3", "many", "1.5"])
def test_keep_batch_partitions_from_the_environment_is_validated(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATERMARK_KEEP_BATCH_PARTITIONS", raw)
    with pytest.raises(ConfigurationError, match="WATERMARK_KEEP_BATCH_PARTITIONS"):
        settings_from_environment()


def test_a_pruned_batch_is_shown_and_its_range_replayed(
    tmp_path: Path,
    instance: DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`watermark batch` and `watermark replay` read the control tables: a batch whose
    partition was pruned is shown in full, and its range is replayed as a new batch with
    a partition of its own (the pruned key is not re-added: nothing names it)."""
    lake = Lake(tmp_path, instance, keep=1)
    for _ in range(3):
        lake.complete(lake.plan())
    assert lake.partitions() == ["b000003"]

    monkeypatch.setitem(sys.modules, "pruned_location", types.SimpleNamespace(loc=lake.location))
    monkeypatch.setenv("WATERMARK_HOME", str(tmp_path / "wm"))
    capsys.readouterr()
    code = watermark(["batch", "b000001", "--defs", "pruned_location:loc", "--json"])
    shown = json.loads(capsys.readouterr().out)
    assert code == 0
    assert shown["batch_id"] == "b000001"
    assert shown["status"] == "COMPLETED"
    assert [(u["upstream"], u["start_version"], u["end_version"]) for u in shown["upstreams"]] == [
        ("up", 0, 0)
    ]

    ran: list[tuple[str, list[str]]] = []

    def execute(batch_id: str, pipelines) -> list[str | None]:
        # What the headless executor does before its Spark run: add the batch's partition.
        # The run itself (Spark) is stood in for by the checkpoint it records.
        instance.add_dynamic_partitions(BATCHES_PARTITIONS_NAME, [batch_id])
        assert instance.has_dynamic_partition(BATCHES_PARTITIONS_NAME, batch_id)
        for p in pipelines:
            attempt = lake.store.begin_checkpoint(p, batch_id, run_id=None)
            lake.store.finish_checkpoint(
                p, batch_id, attempt, CheckpointStatus.SUCCESS, rows_read=1
            )
        ran.append((batch_id, list(pipelines)))
        return []

    plan = plan_replay(lake.store, lake.registry, "up", VersionRange(0, 0))
    done = run_replay(lake.store, lake.registry, plan, execute=execute, actor="test")
    assert done.status is BatchStatus.COMPLETED
    assert ran == [("b000004", ["p"])]
    assert lake.partitions() == ["b000003", "b000004"]

    # The next scheduled batch prunes by sequence: the replay's partition goes in turn.
    lake.complete(lake.plan())
    assert lake.partitions() == ["b000005"]
