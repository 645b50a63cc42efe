"""Catalog names against Spark's own session catalog (in memory, no metastore): a target
whose name moved after the code location resolved it is refused before anything is written,
and an upstream table that does not exist blocks only its pipelines while the rest of the
code location loads and plans. The same against an embedded Hive metastore, through
`watermark run`: tests/scale/test_catalog.py.
"""

from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from tests.support.lakes import defs_from, registry_from
from watermark_dagster.core.records import CheckpointStatus
from watermark_dagster.dagster_defs.checks import CONTINUITY_CHECK
from watermark_dagster.dagster_defs.headless import HeadlessRunner
from watermark_dagster.dagster_defs.sensors import COORDINATOR
from watermark_dagster.errors import UpstreamRecreatedError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import look_before_planning, plan_next
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.read.catalog import register_table
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.spark


def _table(path: Path, ids: list[int]) -> None:
    write_deltalake(
        str(path), pa.table({"id": pa.array(ids, pa.int64()), "value": pa.array(ids, pa.int64())})
    )


def test_a_target_name_that_moved_since_the_load_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path
) -> None:
    up, a, b = tmp_path / "up", tmp_path / "a", tmp_path / "b"
    _table(up, [1, 2])
    _table(a, [1])
    _table(b, [7])
    spark.sql(f"CREATE SCHEMA moved_target LOCATION '{tmp_path / 'wh'}'")
    try:
        parts = ("moved_target", "up_copy")
        register_table(spark, parts, str(a))
        spec = {
            "upstreams": [{"name": "up", "path": str(up)}],
            "pipelines": [{"name": "up_copy", "upstreams": ["up"],
                           "table": "moved_target.up_copy", "transform": "copy"}],
        }  # fmt: skip
        # What the code location's load resolved the name to.
        registry = registry_from(spec).with_locations({}, {"up_copy": str(a)})
        store = WatermarkStore(str(tmp_path / "control"))
        look = look_before_planning(registry, Observer(), store, actor="test")
        batch, _ = plan_next(store, look, actor="test")
        assert batch is not None
        # The name is dropped and registered again at another table before the run.
        spark.sql("DROP TABLE moved_target.up_copy")  # external: the files stay
        register_table(spark, parts, str(b))

        with pytest.raises(UpstreamRecreatedError) as refused:
            execute_pipeline(
                spark=spark,
                store=store,
                registry=registry,
                pipeline_name="up_copy",
                batch_id=batch.batch_id,
                run_id="test",
            )
        error = refused.value
        assert str(error).startswith(
            "The target of pipeline 'up_copy' (catalog table `moved_target`.`up_copy`) was "
            f"dropped and recreated since batch {batch.batch_id} was planned: the batch uses "
            f"it at {a}, and the name now points at {b}. Nothing was read or written."
        ), error
        assert error.pipeline == "up_copy"
        assert error.fix is not None
        assert f"point `moved_target`.`up_copy` back at {a}" in error.fix
        # Neither table written; the attempt recorded as failed with the reason.
        assert (DeltaTable(str(a)).version(), DeltaTable(str(b)).version()) == (0, 0)
        [checkpoint] = store.checkpoints(batch_id=batch.batch_id)
        assert checkpoint.status is CheckpointStatus.FAILED
        assert "was dropped and recreated" in (checkpoint.error or "")
        assert store.committed_versions().get("up") is None
    finally:
        spark.sql("DROP SCHEMA moved_target CASCADE")


def test_a_missing_upstream_table_blocks_its_pipelines_and_the_location_loads(
    tmp_path: Path, dagster_home: Path
) -> None:
    other = tmp_path / "other"
    _table(other, [1, 2])
    spec = {
        "control_root": str(tmp_path / "control"),
        "spark_master": "local[1]",
        "upstreams": [
            # Spark's session catalog (resolved in a child process) has no such table.
            {"name": "up", "table": "lake.up"},
            {"name": "other", "path": str(other)},
        ],
        "pipelines": [
            {"name": "up_copy", "upstreams": ["up"], "target": str(tmp_path / "up_copy"),
             "transform": "copy"},
            {"name": "other_copy", "upstreams": ["other"],
             "target": str(tmp_path / "other_copy"), "transform": "copy"},
        ],
    }  # fmt: skip
    defs = defs_from(spec)  # loads: the missing table does not stop the code location
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        result = HeadlessRunner(defs, instance).tick(COORDINATOR)
        [request] = result.run_requests or []
        assert set(request.asset_selection or []) == {AssetKey(["other_copy"])}
        key = AssetCheckKey(AssetKey(["up"]), CONTINUITY_CHECK)
        [record] = instance.event_log_storage.get_asset_check_execution_history(key, limit=10)
        assert record.event is not None
        assert record.event.dagster_event is not None
        evaluation = record.event.dagster_event.event_specific_data
        assert not evaluation.passed  # type: ignore[union-attr]
        description = evaluation.description or ""  # type: ignore[union-attr]
        assert "catalog table `lake`.`up` does not exist" in description, description
        assert "reload the code location" in description
    finally:
        instance.dispose()
    batch = WatermarkStore(spec["control_root"]).open_batch()
    assert batch is not None
    assert (set(batch.pipelines), set(batch.inputs)) == ({"other_copy"}, {"other"})
