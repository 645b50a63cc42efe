"""What a sensor tick reads does not grow with history (issue 13), shown by counting.

Two control roots differ only in how many completed batches came before (50 and 549, so
the newest bucket holds the same number of batches in both). The same idle coordinator
tick, plan tick and finalizer tick then run against a real Dagster instance, and the
store's own counters (:attr:`WatermarkStore.scans`: data files opened, rows read, tables
loaded) must be equal within a small constant. Reading whole tables, as the store did
before, reads eleven times more rows at 549 than at 50.
"""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import DagsterInstance, build_sensor_context
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable, write_deltalake

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.core.records import (
    BatchKind,
    BatchStatus,
    Checkpoint,
    CheckpointStatus,
)
from watermark_dagster.dagster_defs.definitions import build_definitions
from watermark_dagster.dagster_defs.sensors import COORDINATOR, FINALIZER
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.store import codec, shared_store
from watermark_dagster.store.schema import BUCKET_SIZE
from watermark_dagster.store.tables import COMPACT_AT

UPSTREAMS = ("up1", "up2", "up3")
PIPELINES = {"pipeline_a": ("up1", "up2"), "pipeline_b": ("up2", "up3")}


def _never_called(batch):
    raise AssertionError("no pipeline runs in these tests")


def _commit(path: Path, ids: list[int]) -> None:
    table = pa.table({"id": pa.array(ids, pa.int64())})
    write_deltalake(
        str(path), table, mode="append", configuration={"delta.enableChangeDataFeed": "true"}
    )


def _past_batch(seq: int) -> tuple[list[dict], list[dict], list[dict]]:
    """The rows a planned, run and completed batch leaves in batches, checkpoints and
    history, built by the store's own codec."""
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=seq)
    inputs = {u: PlannedInput(u, ReadMode.CDF, VersionRange(seq, seq), seq) for u in UPSTREAMS}
    batch = codec.new_batch(seq, BatchKind.SCHEDULED, inputs, pipelines=PIPELINES, actor="past")
    batch_rows = codec.batch_rows(batch, committed={}, latest={})
    for row in batch_rows:
        row.update(status=BatchStatus.COMPLETED.value, advanced_at=at, created_at=at)
    checkpoints = [
        codec.checkpoint_row(
            Checkpoint(p, batch.batch_id, 1, CheckpointStatus.SUCCESS, 5, 5, "run", at, at, None)
        )
        for p in PIPELINES
    ]
    history = [codec.history_row("BATCH_PLANNED", "past", batch_id=batch.batch_id)]
    history += [
        codec.history_row("WATERMARK_ADVANCED", "past", batch_id=batch.batch_id, upstream=u)
        for u in UPSTREAMS
    ]
    history += [
        codec.history_row("PIPELINE_SUCCEEDED", "past", batch_id=batch.batch_id, pipeline=p)
        for p in PIPELINES
    ]
    history.append(codec.history_row("BATCH_COMPLETED", "past", batch_id=batch.batch_id))
    return batch_rows, checkpoints, history


def _synthesize(store, batches: int) -> None:
    """``batches`` completed batches, appended ten at a time."""
    for first in range(1, batches + 1, 10):
        rows: tuple[list[dict], list[dict], list[dict]] = ([], [], [])
        for seq in range(first, min(first + 10, batches + 1)):
            for acc, new in zip(rows, _past_batch(seq), strict=True):
                acc.extend(new)
        for table, table_rows in zip(
            ("batches", "pipeline_checkpoints", "history"), rows, strict=True
        ):
            store.append_rows(table, table_rows)


@pytest.fixture
def lake(tmp_path: Path, dagster_home: Path) -> Iterator[tuple]:
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        yield tmp_path, instance
    finally:
        instance.dispose()


def _location(root: Path):
    for name in UPSTREAMS:
        _commit(root / name, [1, 2])
    for name in PIPELINES:  # the targets, as the pipelines' first runs would leave them
        _commit(root / f"target_{name}", [0])
    registry = Registry(
        upstreams=[DeltaUpstream(name=n, path=str(root / n)) for n in UPSTREAMS],
        pipelines=[
            Pipeline(
                name=name,
                upstreams=ups,
                target=str(root / f"target_{name}"),
                keys=("id",),
                transform=_never_called,
            )
            for name, ups in PIPELINES.items()
        ],
    )
    control = str(root / "control")
    defs = build_definitions(
        registry, control_root=control, settings=WatermarkSettings(min_batch_interval_seconds=0)
    )
    return defs, control


def _tick(defs, instance, name: str):
    with build_sensor_context(
        instance_ref=instance.get_ref(),
        definitions=defs,
        sensor_name=name,
        resources=dict(defs.resources),
    ) as context:
        return defs.resolve_sensor_def(name).evaluate_tick(context)


def _succeed_all(store) -> None:
    """What the runs of the open batch would record: a SUCCESS checkpoint per pipeline."""
    batch = store.open_batch()
    assert batch is not None
    for pipeline in batch.pipelines:
        attempt = store.begin_checkpoint(pipeline, batch.batch_id, run_id="run")
        store.finish_checkpoint(pipeline, batch.batch_id, attempt, CheckpointStatus.SUCCESS)


def _costs(root: Path, instance: DagsterInstance, past: int) -> dict[str, dict[str, int]]:
    """Scans of an idle tick, a plan tick and a completing finalizer tick after ``past``
    completed batches."""
    root.mkdir()
    defs, control = _location(root)
    store = shared_store(control)  # the store the sensors of this thread use
    _synthesize(store, past)
    # One real batch through the sensors: the first plan after the synthesized ones.
    _tick(defs, instance, COORDINATOR)
    _succeed_all(store)
    _tick(defs, instance, FINALIZER)
    assert store.open_batch() is None
    costs = {}
    store.scans.reset()
    _tick(defs, instance, COORDINATOR)
    costs["idle coordinator"] = store.scans.snapshot()
    assert store.open_batch() is None, "nothing changed: the idle tick must not plan"

    _commit(root / "up1", [3])
    store.scans.reset()
    _tick(defs, instance, COORDINATOR)
    costs["plan"] = store.scans.snapshot()
    planned = store.open_batch()
    assert planned is not None
    assert planned.seq == past + 2

    _succeed_all(store)
    store.scans.reset()
    _tick(defs, instance, FINALIZER)
    costs["finalize"] = store.scans.snapshot()
    assert store.get_batch(planned.batch_id).status is BatchStatus.COMPLETED
    return costs


def test_tick_reads_do_not_grow_with_the_number_of_past_batches(lake) -> None:
    tmp_path, instance = lake
    # 1..50 and 500..549 fill the newest bucket alike.
    assert 549 // BUCKET_SIZE == 5
    assert BUCKET_SIZE > 50
    few = _costs(tmp_path / "few", instance, 50)
    many = _costs(tmp_path / "many", instance, 549)
    for tick in few:
        # Same files and (within one batch's rows) the same rows, at 11x the history.
        assert many[tick]["files"] <= few[tick]["files"] + 2, (tick, few[tick], many[tick])
        assert many[tick]["rows"] <= few[tick]["rows"] + 20, (tick, few[tick], many[tick])
        # Handles are refreshed across ticks, never loaded from scratch again.
        assert many[tick]["loads"] == few[tick]["loads"] == 0, (tick, many[tick])
    # The idle tick reads no batch or checkpoint rows of the past at all.
    assert many["idle coordinator"]["rows"] < 2 * BUCKET_SIZE * len(UPSTREAMS)


def test_buckets_stay_compacted_as_commits_go(lake) -> None:
    """Every commit leaves its bucket with at most COMPACT_AT files: no sawtooth."""
    tmp_path, instance = lake
    defs, control = _location(tmp_path)
    store = shared_store(control)
    for n in range(8):
        _commit(tmp_path / "up1", [10 + n])
        _tick(defs, instance, COORDINATOR)
        _succeed_all(store)
        _tick(defs, instance, FINALIZER)
        for table in ("batches", "pipeline_checkpoints", "history"):
            files = len(DeltaTable(f"{control}/{table}").file_uris())
            assert files <= COMPACT_AT, (n, table, files)
    assert store.batches(limit=1)[0].seq == 8
