"""Dagster's standard table metadata for pipeline targets, read from real Delta tables.

No JVM: targets are written with delta-rs. The metadata is read back through Dagster's own
``TableMetadataSet``/``UriMetadataSet`` (not exported from ``dagster`` in 1.13, so taken
from their module here) after a round trip through a real instance's event log.
"""

import json
import shutil
from pathlib import Path

import pyarrow as pa
from dagster import AssetKey, AssetMaterialization, DagsterInstance, DataVersion, TableColumn
from dagster._core.definitions.metadata.metadata_set import TableMetadataSet, UriMetadataSet
from deltalake import DeltaTable, write_deltalake

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.dagster_defs.targets import (
    ROW_COUNT_UNAVAILABLE_KEY,
    TARGET_VERSION_KEY,
    target_data_version,
    target_metadata,
)

# A table as Spark's DELETE leaves it with deletion vectors (tests/dagster/data/README.md).
SPARK_DV_TABLE = Path(__file__).parent / "data" / "spark_deletion_vectors"


def _never_called(batch):
    raise AssertionError("no pipeline runs in these tests")


def _pipeline(target: Path) -> Pipeline:
    return Pipeline(
        name="orders_enriched",
        upstreams=("orders",),
        target=str(target),
        keys=("id",),
        transform=_never_called,
    )


def _rows(ids: list[int]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{i}" for i in ids], pa.string()),
            "amount": pa.array([i * 100 for i in ids], pa.decimal128(10, 2)),
            "tags": pa.array([["a", "b"] for _ in ids], pa.list_(pa.string())),
            "address": pa.array(
                [{"city": "x", "zip": i} for i in ids],
                pa.struct([("city", pa.string()), ("zip", pa.int64())]),
            ),
        }
    )


def _stored(instance: DagsterInstance, metadata: dict) -> dict:
    """``metadata`` as Dagster stores it: reported on a real instance, then read back."""
    key = AssetKey(["orders_enriched"])
    instance.report_runless_asset_event(AssetMaterialization(asset_key=key, metadata=metadata))
    event = instance.get_latest_materialization_event(key)
    assert event is not None
    assert event.asset_materialization is not None
    return dict(event.asset_materialization.metadata)


def test_the_standard_keys_describe_the_target(tmp_path: Path, dagster_home: Path) -> None:
    target = tmp_path / "target"
    write_deltalake(str(target), _rows([1, 2, 3]))
    write_deltalake(str(target), _rows([4, 5]), mode="append")
    DeltaTable(str(target)).delete("id = 2")  # rewrites a file: 4 rows, version 2

    with DagsterInstance.get() as instance:
        stored = _stored(instance, target_metadata(_pipeline(target)))

    table = TableMetadataSet.extract(stored)
    assert table.row_count == 4
    assert table.table_name is None  # the table has no name: none is made up
    assert table.column_schema is not None
    assert table.column_schema.columns == [
        TableColumn(name="id", type="long"),
        TableColumn(name="name", type="string"),
        TableColumn(name="amount", type="decimal(10,2)"),
        TableColumn(name="tags", type="array<string>"),
        TableColumn(name="address", type="struct<city: string, zip: long>"),
    ]
    assert UriMetadataSet.extract(stored).uri == str(target)
    assert stored[TARGET_VERSION_KEY].value == 2
    assert isinstance(stored[TARGET_VERSION_KEY].value, int)  # plotted, not text
    assert ROW_COUNT_UNAVAILABLE_KEY not in stored


def test_a_named_table_gives_its_name_and_the_version_is_the_data_version(
    tmp_path: Path,
) -> None:
    target = tmp_path / "target"
    write_deltalake(str(target), _rows([1]), name="orders_enriched")
    write_deltalake(str(target), _rows([2]), mode="append")

    metadata = target_metadata(_pipeline(target))
    assert metadata["dagster/table_name"] == "orders_enriched"
    assert target_data_version(_pipeline(target)) == DataVersion("1")
    assert DataVersion(str(metadata[TARGET_VERSION_KEY].value)) == DataVersion("1")


def test_files_without_statistics_leave_the_row_count_out_and_say_why(
    tmp_path: Path,
) -> None:
    target = tmp_path / "target"
    write_deltalake(str(target), _rows([1, 2]))
    write_deltalake(str(target), _rows([3]), mode="append")
    # The protocol makes file statistics optional; drop them from the second commit as a
    # writer that collects none would have written it.
    commit = target / "_delta_log" / "00000000000000000001.json"
    actions = [json.loads(line) for line in commit.read_text().splitlines()]
    for action in actions:
        if "add" in action:
            action["add"].pop("stats", None)
    commit.write_text("\n".join(json.dumps(a) for a in actions) + "\n")

    metadata = target_metadata(_pipeline(target))
    assert "dagster/row_count" not in metadata  # no undercount from the files that have stats
    assert "1 of 2 data files" in metadata[ROW_COUNT_UNAVAILABLE_KEY]
    assert str(target) in metadata[ROW_COUNT_UNAVAILABLE_KEY]
    assert metadata[TARGET_VERSION_KEY].value == 1


def test_an_empty_table_counts_zero_rows(tmp_path: Path) -> None:
    target = tmp_path / "target"
    write_deltalake(str(target), _rows([1, 2]))
    DeltaTable(str(target)).delete()

    metadata = target_metadata(_pipeline(target))
    assert metadata["dagster/row_count"].value == 0
    assert metadata[TARGET_VERSION_KEY].value == 1


def test_a_target_not_written_yet_has_only_its_uri(tmp_path: Path) -> None:
    """Every batch so far skipped the pipeline: nothing to describe, and nothing to fail."""
    pipeline = _pipeline(tmp_path / "absent")
    assert target_metadata(pipeline) == {"dagster/uri": str(tmp_path / "absent")}
    assert target_data_version(pipeline) is None


def test_rows_deleted_by_deletion_vectors_are_not_counted(tmp_path: Path) -> None:
    """Spark's MERGE and DELETE mark rows in a deletion vector and keep the file, whose
    numRecords still counts them: 100 rows in the file, 10 deleted."""
    target = tmp_path / "target"
    shutil.copytree(SPARK_DV_TABLE, target)
    assert DeltaTable(str(target)).count() == 100  # what the statistics alone say

    metadata = target_metadata(_pipeline(target))
    assert metadata["dagster/row_count"].value == 90
    assert metadata[TARGET_VERSION_KEY].value == 1
