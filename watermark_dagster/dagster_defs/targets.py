"""Dagster's standard table metadata for a pipeline's target, read from its Delta log.

Everything here comes from one delta-rs load of the target (no Spark, no JVM): the schema
and version from the table's metadata, the row count from the add actions' ``numRecords``
statistics minus the rows that deletion vectors mark as deleted. No data file is read.

The keys are Dagster's own (``dagster/uri``, ``dagster/table_name``,
``dagster/column_schema``, ``dagster/row_count``), so the UI shows a Columns tab and a row
count. Dagster 1.13 does not export ``TableMetadataSet``/``UriMetadataSet`` from its public
``dagster`` module, so the keys are written out here; the tests read them back with those
classes.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from dagster import DataVersion, MetadataValue, TableColumn, TableColumnConstraints, TableSchema
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.schema import ArrayType, DataType, MapType, PrimitiveType, StructType

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.secrets import resolved_options

URI_KEY = "dagster/uri"
TABLE_NAME_KEY = "dagster/table_name"
COLUMN_SCHEMA_KEY = "dagster/column_schema"
ROW_COUNT_KEY = "dagster/row_count"
# Our own keys: the target's Delta version (plottable), and why a row count is absent.
TARGET_VERSION_KEY = "target_version"
ROW_COUNT_UNAVAILABLE_KEY = "row_count_unavailable"


def delta_type_text(delta_type: DataType) -> str:
    """A Delta type as text, nested types spelled out: ``long``, ``decimal(10,2)``,
    ``array<long>``, ``map<string, long>``, ``struct<id: long, name: string>``."""
    if isinstance(delta_type, PrimitiveType):
        return delta_type.type
    if isinstance(delta_type, ArrayType):
        return f"array<{delta_type_text(delta_type.element_type)}>"
    if isinstance(delta_type, MapType):
        return (
            f"map<{delta_type_text(delta_type.key_type)}, {delta_type_text(delta_type.value_type)}>"
        )
    if isinstance(delta_type, StructType):
        fields = ", ".join(f"{f.name}: {delta_type_text(f.type)}" for f in delta_type.fields)
        return f"struct<{fields}>"
    return delta_type.type  # variant


def column_schema(table: DeltaTable) -> TableSchema:
    """The target's columns as a Dagster :class:`TableSchema`: Delta type, nullability and
    the column comment (Spark's ``comment`` field metadata) when there is one."""
    columns = []
    for field in table.schema().fields:
        comment = field.metadata.get("comment")
        columns.append(
            TableColumn(
                name=field.name,
                type=delta_type_text(field.type),
                description=str(comment) if comment else None,
                constraints=TableColumnConstraints(nullable=field.nullable),
            )
        )
    return TableSchema(columns=columns)


@dataclass(frozen=True)
class RowCount:
    """Rows in the table's current files per the log, or why that cannot be told.

    Exactly one of ``rows`` and ``unavailable`` is set.
    """

    rows: int | None
    unavailable: str | None = None


def row_count(table: DeltaTable) -> RowCount:
    """Rows in ``table`` from its log alone: the sum of the add actions' ``numRecords``
    minus the rows its deletion vectors delete (read from the small deletion-vector files,
    never the data files).

    A writer may omit file statistics; when any current file has none the count is
    unavailable (with the reason) rather than an undercount.
    """
    actions = pa.table(table.get_add_actions(flatten=True))
    records = actions.column("num_records")
    if records.null_count:
        return RowCount(
            rows=None,
            unavailable=f"{records.null_count} of {actions.num_rows} data files of "
            f"{table.table_uri} carry no numRecords statistics in the Delta log, so the row "
            "count cannot be told without reading them",
        )
    total = sum(int(n) for n in records.to_pylist())
    if "deletionVectors" in (table.protocol().reader_features or []):
        # Spark's MERGE leaves deletion vectors: numRecords still counts the rows they hide.
        total -= _deleted_rows(pa.table(table.deletion_vectors()).column("selection_vector"))
    return RowCount(rows=total)


def _deleted_rows(masks: pa.ChunkedArray) -> int:
    """Rows the deletion vectors delete: the False entries of the files' keep-masks."""
    deleted = 0
    for chunk in masks.chunks:
        flags = chunk.flatten()
        deleted += len(flags) - flags.true_count
    return deleted


def load_target(
    pipeline: Pipeline, *, storage_options: Mapping[str, str] | None = None
) -> DeltaTable | None:
    """The pipeline's target at its current version, or None when no table is there yet
    (a pipeline whose batches have all skipped has written nothing).

    ``storage_options`` default to the pipeline's own, which its writes use.
    """
    options = storage_options if storage_options is not None else pipeline.storage_options
    try:
        return DeltaTable(pipeline.target, storage_options=resolved_options(options))
    except TableNotFoundError:
        return None


def table_metadata(table: DeltaTable, *, uri: str | None = None) -> dict[str, Any]:
    """Dagster's standard table metadata of an opened Delta table, plus its version as
    ``target_version`` (an int, so the UI plots it). ``uri`` is the path as the user wrote
    it (default: delta-rs's normalised ``table_uri``)."""
    metadata: dict[str, Any] = {URI_KEY: uri or table.table_uri}
    name = table.metadata().name
    if name:
        metadata[TABLE_NAME_KEY] = name
    metadata[COLUMN_SCHEMA_KEY] = MetadataValue.table_schema(column_schema(table))
    count = row_count(table)
    if count.rows is not None:
        metadata[ROW_COUNT_KEY] = MetadataValue.int(count.rows)
    else:
        metadata[ROW_COUNT_UNAVAILABLE_KEY] = count.unavailable
    metadata[TARGET_VERSION_KEY] = MetadataValue.int(table.version())
    return metadata


def target_metadata(
    pipeline: Pipeline, *, storage_options: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Dagster's standard table metadata for ``pipeline``'s target, from one delta-rs load.

    Keys: ``dagster/uri`` (the target path), ``dagster/table_name`` (only when the Delta
    metadata names the table), ``dagster/column_schema`` (columns with Delta types),
    ``dagster/row_count`` (from the log's statistics; when a file has none,
    ``row_count_unavailable`` says so instead) and ``target_version`` (int).

    A target that does not exist yet (every batch so far skipped it) has only
    ``dagster/uri``: there is no schema, count or version to report, and a run that wrote
    nothing must not fail for it.

    Args:
        pipeline: the pipeline whose target to describe.
        storage_options: delta-rs storage options for the target (default: the pipeline's
            own ``storage_options``, which its writes use).

    Example:
        >>> metadata = target_metadata(pipeline)
        >>> MaterializeResult(metadata={**outcome_metadata(outcome), **metadata})
    """
    if pipeline.warehouse is not None:
        return warehouse_metadata(pipeline)
    table = load_target(pipeline, storage_options=storage_options)
    if table is None:
        return {URI_KEY: pipeline.target}
    return table_metadata(table, uri=pipeline.target)


def warehouse_metadata(pipeline: Pipeline) -> dict[str, Any]:
    """A warehouse target's metadata: where it is (``dagster/uri``, ``dagster/table_name``),
    its row count, and its state row's position as ``target_version`` (an int, so the UI
    plots it) with the batch it names (``warehouse_batch``)."""
    from watermark_dagster.observe.warehouse_state import read_state, row_count

    target = pipeline.warehouse
    assert target is not None
    metadata: dict[str, Any] = {
        URI_KEY: pipeline.target,
        TABLE_NAME_KEY: f"{target.schema}.{target.name}",
    }
    rows = row_count(target, pipeline.name)
    if rows is not None:
        metadata[ROW_COUNT_KEY] = MetadataValue.int(rows)
    state = read_state(target, pipeline.name)
    if state is not None:
        metadata[TARGET_VERSION_KEY] = MetadataValue.int(state.position)
        metadata["warehouse_batch"] = state.last_batch_id or state.batch_id
    return metadata


def target_data_version(
    pipeline: Pipeline, *, storage_options: Mapping[str, str] | None = None
) -> DataVersion | None:
    """The target's Delta version as a Dagster data version (``DataVersion("7")``), or
    None when the target does not exist yet (nothing to version).

    When :func:`target_metadata` was called already, ``DataVersion(str(metadata[
    "target_version"]))`` gives the same without a second load.
    """
    if pipeline.warehouse is not None:
        from watermark_dagster.observe.warehouse_state import read_state

        state = read_state(pipeline.warehouse, pipeline.name)
        return None if state is None else DataVersion(str(state.position))
    table = load_target(pipeline, storage_options=storage_options)
    return None if table is None else DataVersion(str(table.version()))
