"""A plain downstream Dagster asset loads a pipeline's target through the I/O manager
``build_definitions`` configures, on a real instance.

No JVM: the target is a real Delta table written by delta-rs (as a pipeline's Spark write
would leave it) and the pipeline asset itself never runs; only the downstream asset is
materialized. Its partitions exist as the coordinator would have added them.
"""

import shutil
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    Definitions,
    DynamicPartitionsDefinition,
    MaterializeResult,
    asset,
    define_asset_job,
)
from deltalake import DeltaTable, write_deltalake

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.dagster_defs.definitions import build_location
from watermark_dagster.dagster_defs.names import BATCHES_PARTITIONS_NAME
from watermark_dagster.dagster_defs.target_io import TARGETS_IO_MANAGER_KEY

PIPELINE_KEY = AssetKey(["orders_enriched"])
# A table as Spark's DELETE leaves it with deletion vectors (tests/dagster/data/README.md).
SPARK_DV_TABLE = Path(__file__).parent / "data" / "spark_deletion_vectors"


def _never_called(batch):
    raise AssertionError("the pipeline asset does not run in these tests")


@pytest.fixture
def instance(dagster_home: Path) -> Iterator[DagsterInstance]:
    with DagsterInstance.get() as found:
        # Two batches, as the coordinator would have planned them.
        found.add_dynamic_partitions(BATCHES_PARTITIONS_NAME, ["b-000001", "b-000002"])
        yield found


def _location_defs(tmp_path: Path, *downstream) -> Definitions:
    up = tmp_path / "orders"
    write_deltalake(str(up), pa.table({"id": pa.array([1], pa.int64())}))
    registry = Registry(
        upstreams=[DeltaUpstream(name="orders", path=str(up))],
        pipelines=[
            Pipeline(
                name="orders_enriched",
                upstreams=("orders",),
                target=str(tmp_path / "orders_enriched"),
                keys=("id",),
                transform=_never_called,
            )
        ],
    )
    location = build_location(registry, control_root=str(tmp_path / "control"))
    job = define_asset_job("downstream", selection=[a.key for a in downstream])
    return Definitions.merge(location.definitions, Definitions(assets=list(downstream), jobs=[job]))


def _write_target(tmp_path: Path) -> Path:
    """Two batches' writes and a delete: version 2 holds ids 1, 3, 4."""
    target = tmp_path / "orders_enriched"
    rows = {"id": pa.array([1, 2, 3], pa.int64()), "amount": pa.array([10, 20, 30], pa.int64())}
    write_deltalake(str(target), pa.table(rows))
    write_deltalake(
        str(target),
        pa.table({"id": pa.array([4], pa.int64()), "amount": pa.array([40], pa.int64())}),
        mode="append",
    )
    DeltaTable(str(target)).delete("id = 2")
    return target


def _messages(instance: DagsterInstance, run_id: str) -> list[str]:
    return [e.user_message for e in instance.all_logs(run_id) if e.dagster_event is None]


def test_a_downstream_asset_reads_the_whole_target_at_its_current_version(
    tmp_path: Path, instance: DagsterInstance
) -> None:
    @asset(
        ins={"orders_enriched": AssetIn(key=PIPELINE_KEY, input_manager_key=TARGETS_IO_MANAGER_KEY)}
    )
    def order_report(orders_enriched: pa.Table) -> MaterializeResult:
        return MaterializeResult(
            metadata={
                "ids": sorted(orders_enriched.column("id").to_pylist()),
                "total": sum(orders_enriched.column("amount").to_pylist()),
            }
        )

    defs = _location_defs(tmp_path, order_report)
    _write_target(tmp_path)

    result = defs.resolve_job_def("downstream").execute_in_process(instance=instance)

    assert result.success
    # Every batch's rows, not one partition's slice; the deleted row is gone.
    materialization = instance.get_latest_materialization_event(AssetKey(["order_report"]))
    assert materialization is not None
    assert materialization.asset_materialization is not None
    metadata = materialization.asset_materialization.metadata
    assert metadata["ids"].value == [1, 3, 4]
    assert metadata["total"].value == 80
    target = tmp_path / "orders_enriched"
    assert f"Loading {target} at Delta version 2 (the current version)" in _messages(
        instance, result.run_id
    )


def test_other_forms_and_a_column_subset(tmp_path: Path, instance: DagsterInstance) -> None:
    seen: dict[str, object] = {}
    target = AssetIn(key=PIPELINE_KEY, input_manager_key=TARGETS_IO_MANAGER_KEY)

    @asset(ins={"orders_enriched": target})
    def as_frame(orders_enriched: pd.DataFrame) -> None:
        seen["frame"] = sorted(orders_enriched["id"].tolist())

    @asset(
        ins={
            "orders_enriched": AssetIn(
                key=PIPELINE_KEY,
                input_manager_key=TARGETS_IO_MANAGER_KEY,
                metadata={"columns": ["id"]},
            )
        }
    )
    def ids_only(orders_enriched: pa.Table) -> None:
        seen["ids_only"] = orders_enriched.column_names

    @asset(ins={"orders_enriched": target})
    def as_stream(orders_enriched: pa.RecordBatchReader) -> None:
        seen["stream"] = orders_enriched.read_all().num_rows

    @asset(ins={"orders_enriched": target})
    def as_delta_table(orders_enriched: DeltaTable) -> None:
        seen["version"] = orders_enriched.version()

    defs = _location_defs(tmp_path, as_frame, ids_only, as_stream, as_delta_table)
    _write_target(tmp_path)

    assert defs.resolve_job_def("downstream").execute_in_process(instance=instance).success
    assert seen == {"frame": [1, 3, 4], "ids_only": ["id"], "stream": 3, "version": 2}


def test_rows_deleted_by_deletion_vectors_are_not_loaded(
    tmp_path: Path, instance: DagsterInstance
) -> None:
    """A merge target as Spark leaves it: the rows its deletion vector marks stay in the
    data file but are not handed to the downstream asset."""
    seen: dict[str, list[int]] = {}

    @asset(ins={"orders_enriched": AssetIn(input_manager_key=TARGETS_IO_MANAGER_KEY)})
    def order_ids(orders_enriched: pa.Table) -> None:
        seen["ids"] = sorted(orders_enriched.column("id").to_pylist())

    defs = _location_defs(tmp_path, order_ids)
    shutil.copytree(SPARK_DV_TABLE, tmp_path / "orders_enriched")

    assert defs.resolve_job_def("downstream").execute_in_process(instance=instance).success
    assert seen["ids"] == [i for i in range(100) if i % 10]


def test_a_target_no_batch_wrote_fails_the_step_with_the_reason(
    tmp_path: Path, instance: DagsterInstance
) -> None:
    @asset(
        ins={"orders_enriched": AssetIn(key=PIPELINE_KEY, input_manager_key="watermark_targets")}
    )
    def order_report(orders_enriched: pa.Table) -> None:
        raise AssertionError("not reached: the input cannot load")

    defs = _location_defs(tmp_path, order_report)  # no target written

    result = defs.resolve_job_def("downstream").execute_in_process(
        instance=instance, raise_on_error=False
    )
    assert not result.success
    failure = result.failure_data_for_node("order_report")
    assert failure is not None
    assert failure.error is not None
    cause = failure.error.cause
    assert cause is not None
    assert cause.cls_name == "ValueError"
    assert "is not a Delta table yet: no batch has written to it" in cause.message
    assert str(tmp_path / "orders_enriched") in cause.message


def test_a_plain_input_loads_the_target_through_the_pipeline_assets_manager(
    tmp_path: Path, instance: DagsterInstance
) -> None:
    """``def report(orders_enriched: pa.Table)`` with no AssetIn: Dagster loads an input
    with the upstream asset's I/O manager: the pipeline asset carries
    ``io_manager_key="watermark_targets"`` (assets.py)."""

    @asset
    def orders_enriched_count(orders_enriched: pa.Table) -> MaterializeResult:
        return MaterializeResult(metadata={"rows": orders_enriched.num_rows})

    defs = _location_defs(tmp_path, orders_enriched_count)
    pipeline_asset = defs.resolve_assets_def(PIPELINE_KEY)
    assert pipeline_asset.get_io_manager_key_for_asset_key(PIPELINE_KEY) == TARGETS_IO_MANAGER_KEY
    _write_target(tmp_path)

    assert defs.resolve_job_def("downstream").execute_in_process(instance=instance).success
    event = instance.get_latest_materialization_event(AssetKey(["orders_enriched_count"]))
    assert event is not None
    assert event.asset_materialization is not None
    assert event.asset_materialization.metadata["rows"].value == 3


def test_a_downstream_partition_reads_the_target_as_its_batch_left_it(
    tmp_path: Path, instance: DagsterInstance
) -> None:
    seen: dict[str, list[int]] = {}

    @asset(
        partitions_def=DynamicPartitionsDefinition(name=BATCHES_PARTITIONS_NAME),
        ins={
            "orders_enriched": AssetIn(key=PIPELINE_KEY, input_manager_key=TARGETS_IO_MANAGER_KEY)
        },
    )
    def batch_report(context: AssetExecutionContext, orders_enriched: pa.Table) -> None:
        seen[context.partition_key] = sorted(orders_enriched.column("id").to_pylist())

    defs = _location_defs(tmp_path, batch_report)
    target = _write_target(tmp_path)  # batch 1 wrote version 0, batch 2 versions 1 and 2
    instance.add_dynamic_partitions(BATCHES_PARTITIONS_NAME, ["b-000003"])
    # The pipeline's materializations, as its runs record them: batch 1's, batch 2's, a
    # later replay of batch 1 (version 3), and batch 3, which did not need the pipeline.
    for batch_id, meta in (
        ("b-000001", {"target_version": 0, "batch_seq": 1}),
        ("b-000002", {"target_version": 2, "batch_seq": 2}),
        ("b-000001", {"target_version": 3, "batch_seq": 1, "replay_batch_id": "b-000004"}),
        ("b-000003", {"batch_seq": 3, "skip_kind": "not_in_batch"}),
    ):
        instance.report_runless_asset_event(
            AssetMaterialization(PIPELINE_KEY, partition=batch_id, metadata=meta)
        )
    write_deltalake(  # version 3: what the replay wrote, and what an unpartitioned input reads
        str(target),
        pa.table({"id": pa.array([5], pa.int64()), "amount": pa.array([50], pa.int64())}),
        mode="append",
    )

    job = defs.resolve_job_def("downstream")
    runs = {}
    for partition in ("b-000001", "b-000002", "b-000003"):
        runs[partition] = job.execute_in_process(instance=instance, partition_key=partition)
        assert runs[partition].success
    assert seen == {"b-000001": [1, 2, 3], "b-000002": [1, 3, 4], "b-000003": [1, 3, 4]}
    messages = _messages(instance, runs["b-000001"].run_id)
    assert f"Loading {target} at Delta version 0 (as batch b-000001 left it)" in messages
