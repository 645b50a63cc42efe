"""A merge target as Spark leaves it, with deletion vectors: its standard metadata counts
the rows a reader sees, and a downstream asset loads exactly those rows."""

from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetIn, DagsterInstance, Definitions, asset, define_asset_job
from deltalake import DeltaTable as RsDeltaTable
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.dagster_defs.definitions import build_location
from watermark_dagster.dagster_defs.target_io import TARGETS_IO_MANAGER_KEY
from watermark_dagster.dagster_defs.targets import target_metadata

pytestmark = pytest.mark.spark


def _never_called(batch):
    raise AssertionError("the pipeline asset does not run in this test")


def test_deletion_vectors_are_counted_and_applied(
    spark: SparkSession, tmp_path: Path, dagster_home: Path
) -> None:
    target = str(tmp_path / "orders_enriched")
    (
        spark.range(0, 100)
        .coalesce(1)
        .write.format("delta")
        .option("delta.enableDeletionVectors", "true")
        .save(target)
    )
    spark.sql(f"DELETE FROM delta.`{target}` WHERE id % 10 = 0")  # marks rows, keeps the file
    assert pa.table(RsDeltaTable(target).deletion_vectors()).num_rows == 1  # really a DV
    pipeline = Pipeline(
        name="orders_enriched",
        upstreams=("orders",),
        target=target,
        keys=("id",),
        transform=_never_called,
    )

    metadata = target_metadata(pipeline)
    assert (
        metadata["dagster/row_count"].value == 90 == spark.read.format("delta").load(target).count()
    )

    seen: dict[str, list[int]] = {}

    @asset(ins={"orders_enriched": AssetIn(input_manager_key=TARGETS_IO_MANAGER_KEY)})
    def order_ids(orders_enriched: pa.Table) -> None:
        seen["ids"] = sorted(orders_enriched.column("id").to_pylist())

    up = tmp_path / "orders"
    write_deltalake(str(up), pa.table({"id": pa.array([1], pa.int64())}))
    registry = Registry(
        upstreams=[DeltaUpstream(name="orders", path=str(up))], pipelines=[pipeline]
    )
    location = build_location(registry, control_root=str(tmp_path / "control"))
    defs = Definitions.merge(
        location.definitions,
        Definitions(assets=[order_ids], jobs=[define_asset_job("ids", selection=[order_ids.key])]),
    )
    with DagsterInstance.get() as instance:
        assert defs.resolve_job_def("ids").execute_in_process(instance=instance).success
    assert seen["ids"] == [i for i in range(100) if i % 10]
