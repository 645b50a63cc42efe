"""A lake whose upstream ``up`` can be dropped and recreated under a committed watermark:
the tests of blocked upstreams (delta-rs, Spark, a real daemon) share it."""

import shutil
from pathlib import Path
from typing import Any

from dagster import AssetCheckKey, AssetKey, DagsterInstance
from deltalake import DeltaTable

from tests.support.spec_lake import Lake, commit_rows
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.core.records import BatchStatus
from watermark_dagster.dagster_defs.checks import CONTINUITY_CHECK
from watermark_dagster.store import WatermarkStore

# The one recovery command a blocked ``up`` names.
RESET = "`watermark reset -t up --force`"


def blocked_lake(tmp_path: Path, dagster_home: Path) -> Lake:
    """Two upstreams (``up`` at version 2, ``other`` at 0), each read by one pipeline whose
    target exists; a first batch advanced both watermarks to the latest versions, on the
    tables' ids, as the finalizer does."""
    for i in range(3):
        commit_rows(tmp_path / "up", [i])
    commit_rows(tmp_path / "other", [0])
    for target in ("up_copy", "other_copy"):
        commit_rows(tmp_path / target, [0])
    spec = {
        "control_root": str(tmp_path / "control"),
        # Starting Spark would fail: proves that a command with nothing to run starts no JVM.
        "spark_master": "no-such-master",
        "upstreams": [
            {"name": "up", "path": str(tmp_path / "up")},
            {"name": "other", "path": str(tmp_path / "other")},
        ],
        "pipelines": [
            {"name": "up_copy", "upstreams": ["up"], "target": str(tmp_path / "up_copy"),
             "transform": "copy"},
            {"name": "other_copy", "upstreams": ["other"],
             "target": str(tmp_path / "other_copy"), "transform": "copy"},
        ],
    }  # fmt: skip
    store = WatermarkStore(spec["control_root"])
    ids = {n: str(DeltaTable(str(tmp_path / n)).metadata().id) for n in ("up", "other")}
    batch, _ = store.create_batch(
        [UpstreamPosition("up", 2, None), UpstreamPosition("other", 0, None)],
        {"up_copy": ["up"], "other_copy": ["other"]},
        actor="test",
        table_ids=ids,
    )
    assert batch is not None
    for upstream in batch.ranged_upstreams:
        store.advance(batch, upstream, actor="test")
    store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="test")
    assert store.committed()["up"].table_id == ids["up"]
    return Lake(tmp_path, spec, dagster_home)


def recreate(lake: Lake, versions: int) -> None:
    """Drop the table and create a new one at the same path with ``versions`` commits."""
    shutil.rmtree(lake.up)
    for i in range(versions):
        commit_rows(lake.up, [100 + i])


def check_history(instance: DagsterInstance, upstream: str) -> list[Any]:
    """Evaluations of an upstream's continuity check recorded in the instance, oldest first."""
    key = AssetCheckKey(AssetKey([upstream]), CONTINUITY_CHECK)
    records = instance.event_log_storage.get_asset_check_execution_history(key, limit=100)
    evaluations = [
        r.event.dagster_event.event_specific_data  # type: ignore[union-attr]
        for r in reversed(records)
        if r.event is not None and r.event.dagster_event is not None
    ]
    return [e for e in evaluations if hasattr(e, "passed")]
