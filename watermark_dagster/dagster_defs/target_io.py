"""Loading a pipeline's target for downstream Dagster assets.

Pipeline assets write their targets themselves, through Spark, and return a
``MaterializeResult`` (no value goes through an I/O manager). A downstream asset that takes
a pipeline asset as an input gets the pipeline's whole target table from
:class:`PipelineTargetIOManager`, read with delta-rs and converted with dagster-deltalake's
Arrow type handler: no Spark session, no JVM. An unpartitioned downstream asset reads the
current Delta version; one partitioned by the batch partitions reads, for its partition,
the version that batch left the target at (Delta time travel), so it is reproducible.

Why not dagster-deltalake's ``DeltaLakePyarrowIOManager`` as it is: it places a table at
``root_uri/<key prefix>/<asset name>`` and reads a partitioned input as the slice of a
``partition_expr`` column, while a target lives at the path its pipeline declares and a
batch partition is not a column of it; and its reader (``DeltaTable.to_pyarrow_dataset``)
refuses tables with deletion vectors, which Spark's MERGE gives our merge targets. This
manager reads with ``DeltaTable.scan``, which applies deletion vectors.
"""

from typing import Any

import pyarrow as pa
from dagster import AssetRecordsFilter, ConfigurableIOManager, InputContext, OutputContext
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pydantic import Field

from watermark_dagster.config.secrets import resolved_options

# The resource key build_definitions gives the manager (behind the location's prefix, if
# any). Downstream assets name it in ``AssetIn(input_manager_key=...)`` (a pipeline asset
# bound to it needs no AssetIn).
from watermark_dagster.dagster_defs.names import (
    TARGETS_IO_MANAGER_KEY as TARGETS_IO_MANAGER_KEY,
)
from watermark_dagster.dagster_defs.runs import PIPELINE_METADATA

# The materialization metadata that holds the target's Delta version after a batch (written
# by the pipeline asset: watermark_dagster.dagster_defs.targets.TARGET_VERSION_KEY).
_TARGET_VERSION = "target_version"
# How many materializations of a pipeline asset a load looks through, newest first, for the
# version a batch that wrote nothing (done with nothing to do) left the target at.
_LOOK_BACK = 100


class PipelineTargetIOManager(ConfigurableIOManager):
    """Hands a downstream asset the whole target table of the pipeline asset it depends on.

    A batch partition names the batch that wrote to the target, not a slice of it, so the
    whole table is read. An input that maps to one batch partition (a downstream asset
    partitioned by the batch partitions) reads it as of the Delta version that batch left
    it at (the ``target_version`` its materialization recorded; for a batch that did not
    need the pipeline, the version the batch before it left); any other input reads the
    current version. The input's annotation picks the form: ``pyarrow.Table`` (also when
    unannotated), ``pyarrow.RecordBatchReader`` (streamed), ``pandas.DataFrame`` or
    ``deltalake.DeltaTable`` (the opened table, to read as you like). ``AssetIn(metadata=
    {"columns": [...]})`` reads only those columns, as with dagster-deltalake.
    The step's log names the target and the version it read.

    :func:`~watermark_dagster.dagster_defs.definitions.build_definitions` configures one
    under ``"watermark_targets"`` with every pipeline's target and storage options.

    Example:
        >>> @asset(ins={"orders_enriched": AssetIn(input_manager_key="watermark_targets")})
        ... def big_orders(orders_enriched: pa.Table) -> None:
        ...     ...
    """

    targets: dict[str, str] = Field(
        description="Target path or URI of each pipeline, by pipeline name."
    )
    storage_options: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="delta-rs storage options of the targets on object stores, by pipeline "
        "name (the pipelines' own storage_options); a pipeline not named has none.",
    )

    def handle_output(self, context: OutputContext, obj: object) -> None:
        """Pipeline assets write their targets themselves: there is nothing to store.

        Raises:
            ValueError: an asset returned a value for this manager to write.
        """
        if obj is None:
            return
        raise ValueError(
            f"{context.asset_key.to_user_string() if context.has_asset_key else 'an output'} "
            f"returned a {type(obj).__name__} to the watermark targets I/O manager, which "
            "only loads pipeline targets (pipelines write them through Spark). Give that "
            "asset another io_manager_key, or return a MaterializeResult."
        )

    def target_of(self, context: InputContext) -> tuple[str, dict[str, str] | None]:
        """The target path and storage options of the pipeline asset the input loads.

        Raises:
            ValueError: the upstream is not a pipeline asset of this code location.
        """
        upstream = context.upstream_output
        metadata = (upstream.definition_metadata if upstream is not None else None) or {}
        pipeline = metadata.get(PIPELINE_METADATA)
        key = context.asset_key.to_user_string() if context.has_asset_key else "the input"
        if not isinstance(pipeline, str):
            raise ValueError(
                f"{key} is not a watermark pipeline asset (it has no {PIPELINE_METADATA} "
                "metadata), so the watermark targets I/O manager cannot load it. Load it "
                "with its own I/O manager (drop input_manager_key for this input)."
            )
        if pipeline not in self.targets:
            raise ValueError(
                f"{key} is pipeline {pipeline!r}, which the watermark targets I/O manager "
                f"does not know (it knows {sorted(self.targets)}). Build the manager with "
                "build_definitions, or add the pipeline to its targets."
            )
        return self.targets[pipeline], self.storage_options.get(pipeline) or None

    def version_of(self, context: InputContext) -> tuple[int | None, str]:
        """The Delta version to read (None: the current one) and why.

        An input mapped to one batch partition reads the version that batch left the
        target at: the ``target_version`` of the partition's materialization by the batch
        itself (not by a later replay); for a batch the pipeline had nothing to do in, the
        version of the newest earlier batch that recorded one.

        Raises:
            ValueError: no materialization of the partition records where the batch left
                the target.
        """
        if not context.has_asset_partitions or len(context.asset_partition_keys) != 1:
            return None, "the current version"
        [batch_id] = context.asset_partition_keys
        key = context.asset_key
        records = context.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, asset_partitions=[batch_id]), limit=_LOOK_BACK
        ).records
        own = [r for r in records if _batch_version(r) is not None]
        if own:
            return _batch_version(own[-1]), f"as batch {batch_id} left it"
        if records:
            # Done with nothing to do: the target is as the batch before left it.
            seq = _metadata_value(records[-1], "batch_seq")
            before = context.instance.fetch_materializations(
                AssetRecordsFilter(asset_key=key, before_storage_id=records[-1].storage_id),
                limit=_LOOK_BACK,
            ).records
            for record in before:
                version = _batch_version(record)
                earlier = _metadata_value(record, "batch_seq")
                if version is not None and (seq is None or (earlier or 0) < seq):
                    return version, f"batch {batch_id} wrote nothing; as the batch before left it"
        raise ValueError(
            f"{key.to_user_string()}: no materialization of batch partition {batch_id} "
            f"records the target's Delta version ({_TARGET_VERSION}), so the target cannot be "
            f"read as that batch left it. Materialize {batch_id} of the pipeline first, or "
            "read the current version from an unpartitioned asset."
        )

    def load_input(self, context: InputContext) -> Any:
        """The pipeline's whole target table, as of its batch partition's version or at
        its current version (see :meth:`version_of`), in the form the input's annotation
        asks for.

        Raises:
            ValueError: the upstream is not a pipeline, or its target does not exist yet.
        """
        target, storage_options = self.target_of(context)
        version, why = self.version_of(context)
        try:
            table = DeltaTable(
                target, version=version, storage_options=resolved_options(storage_options)
            )
        except TableNotFoundError:
            key = context.asset_key.to_user_string() if context.has_asset_key else "the input"
            raise ValueError(
                f"The target of {key} at {target} is not a Delta table yet: no batch has "
                "written to it. Materialize the downstream asset after the pipeline's first "
                "batch that wrote rows."
            ) from None
        # A log line, not add_input_metadata: that would record an observation on the
        # pipeline asset (and fails for an input spanning several batch partitions).
        context.log.info(f"Loading {target} at Delta version {table.version()} ({why})")
        wanted = context.dagster_type.typing_type
        if wanted is DeltaTable:
            return table
        columns = (context.definition_metadata or {}).get("columns")
        # scan() reads through delta-rs's engine, which applies deletion vectors.
        reader = pa.RecordBatchReader.from_stream(table.scan(columns=columns))
        if _is_pandas_frame(wanted):
            return reader.read_pandas()
        if wanted is pa.RecordBatchReader:
            return reader
        if wanted in (pa.Table, Any, object, None):
            # Imported on use: dagster-deltalake imports pandas, which loading the
            # definitions does not need.
            from dagster_deltalake import DeltaLakePyArrowTypeHandler

            return DeltaLakePyArrowTypeHandler().from_arrow(reader, pa.Table)
        raise ValueError(
            f"The watermark targets I/O manager cannot load a target as {wanted!r}. Annotate "
            "the input as pyarrow.Table, pyarrow.RecordBatchReader, pandas.DataFrame or "
            "deltalake.DeltaTable."
        )


def _metadata_value(record: Any, name: str) -> Any:
    """The value of ``name`` in a materialization record's metadata, or None."""
    materialization = record.asset_materialization
    entry = materialization.metadata.get(name) if materialization is not None else None
    return getattr(entry, "value", entry)


def _batch_version(record: Any) -> int | None:
    """The target version a batch's own run recorded (None for a replay's or a
    materialization with nothing written)."""
    if _metadata_value(record, "replay_batch_id") is not None:
        return None
    version = _metadata_value(record, _TARGET_VERSION)
    return version if isinstance(version, int) else None


def _is_pandas_frame(wanted: object) -> bool:
    """Whether an input asks for a pandas DataFrame (pandas is imported only if so)."""
    if getattr(wanted, "__module__", "").split(".")[0] != "pandas":
        return False
    import pandas

    return wanted is pandas.DataFrame
