"""Checking a pipeline's target against a recompute from its upstreams (``watermark verify``).

The recompute feeds the pipeline's transform every upstream as a full snapshot at the
versions the target should reflect (the committed watermarks, or the open batch's ends
when the pipeline already applied that batch). Both sides are compared on the target's
columns without the framework's ``_wm_`` columns: row count and an order-independent
checksum first (two Spark actions), and only when those differ, the rows each side has
that the other has not, with a few example keys.
"""

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.core.columns import RESERVED_PREFIX
from watermark_dagster.errors import UsageError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from watermark_dagster.config.registry import Registry
    from watermark_dagster.store import WatermarkStore

EXAMPLES = 5


@dataclass(frozen=True)
class Comparison:
    """A target compared with its recompute."""

    columns: tuple[str, ...]
    target_rows: int
    recompute_rows: int
    target_checksum: str
    recompute_checksum: str
    only_in_target: int = 0
    only_in_recompute: int = 0
    columns_only_in_target: tuple[str, ...] = ()
    columns_only_in_recompute: tuple[str, ...] = ()
    example_keys: Mapping[str, list[dict[str, Any]]] = field(
        default_factory=dict[str, list[dict[str, Any]]]
    )

    @property
    def equal(self) -> bool:
        """True when both sides hold the same rows (as a multiset) and the same columns."""
        return (
            self.target_rows == self.recompute_rows
            and self.target_checksum == self.recompute_checksum
            and not self.columns_only_in_target
            and not self.columns_only_in_recompute
        )


def _fingerprint(df: "DataFrame", columns: Sequence[str]) -> tuple[int, str]:
    """Row count and an order-independent checksum: the sum of each row's 64-bit hash."""
    from pyspark.sql import functions as F

    row_hash = F.xxhash64(F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns])))
    [row] = df.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(row_hash.cast("decimal(38,0)")).alias("total"),
    ).collect()
    total = int(row["total"] or 0) % 2**64
    return int(row["rows"]), f"{total:016x}"


def compare_with_recompute(
    target: "DataFrame", recompute: "DataFrame", *, keys: Sequence[str]
) -> Comparison:
    """Compare ``target`` with ``recompute`` on the target's non-``_wm_`` columns.

    The recompute's columns are cast to the target's types, so an int the transform
    produces and the long the target stores compare equal.
    """
    from pyspark import StorageLevel

    wanted = [c for c in target.columns if not c.startswith(RESERVED_PREFIX)]
    produced = [c for c in recompute.columns if not c.startswith(RESERVED_PREFIX)]
    columns = [c for c in wanted if c in produced]
    types = {f.name: f.dataType for f in target.schema.fields}
    left = target.select(*[f"`{c}`" for c in columns])
    right = recompute.select(*[recompute[f"`{c}`"].cast(types[c]).alias(c) for c in columns])
    right = right.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        target_rows, target_sum = _fingerprint(left, columns)
        recompute_rows, recompute_sum = _fingerprint(right, columns)
        result = Comparison(
            columns=tuple(columns),
            target_rows=target_rows,
            recompute_rows=recompute_rows,
            target_checksum=target_sum,
            recompute_checksum=recompute_sum,
            columns_only_in_target=tuple(c for c in wanted if c not in produced),
            columns_only_in_recompute=tuple(c for c in produced if c not in wanted),
        )
        if (target_rows, target_sum) == (recompute_rows, recompute_sum):
            return result
        key_cols = [k for k in keys if k in columns] or columns[:3]
        only_target = left.exceptAll(right)
        only_recompute = right.exceptAll(left)

        def examples(df: "DataFrame") -> list[dict[str, Any]]:
            rows = df.select(*[f"`{k}`" for k in key_cols]).limit(EXAMPLES).collect()
            return [r.asDict() for r in rows]

        return replace(
            result,
            only_in_target=only_target.count(),
            only_in_recompute=only_recompute.count(),
            example_keys={
                "only_in_target": examples(only_target),
                "only_in_recompute": examples(only_recompute),
            },
        )
    finally:
        right.unpersist()


@dataclass(frozen=True)
class Verification:
    """A pipeline's target checked against its recompute at ``versions`` (chosen because
    of ``basis``); ``comparison`` is None when the target table does not exist."""

    pipeline: str
    target: str
    versions: dict[str, int]
    basis: str
    comparison: Comparison | None

    @property
    def equal(self) -> bool:
        """True when the target exists and holds exactly the recompute's rows."""
        return self.comparison is not None and self.comparison.equal


def versions_to_verify(
    store: "WatermarkStore", registry: "Registry", pipeline: str
) -> tuple[dict[str, int], str]:
    """The upstream versions ``pipeline``'s target should reflect now, and why.

    The committed watermarks, unless the pipeline already applied the open batch (its
    other consumers have not yet): then that batch's end versions.

    Raises:
        UsageError: an upstream of the pipeline has nothing committed.
    """
    from watermark_dagster.core.records import CheckpointStatus

    upstreams = registry.upstreams
    versioned = [u for u in registry.pipelines[pipeline].upstreams if not upstreams[u].is_cursor]
    batch = store.open_batch()
    if batch is not None and pipeline in batch.pipelines:
        attempts = store.checkpoints(batch_id=batch.batch_id, pipeline=pipeline)
        ends = {
            u: v
            for u in versioned
            if u in batch.inputs and (v := batch.inputs[u].snapshot_version) is not None
        }
        if len(ends) == len(versioned) and any(
            c.status is CheckpointStatus.SUCCESS for c in attempts
        ):
            return ends, f"the open batch {batch.batch_id}, which {pipeline} already applied"
    committed = store.committed_versions()
    found = {u: v for u in versioned if (v := committed.get(u)) is not None}
    missing = [u for u in versioned if u not in found]
    if missing:
        raise UsageError(
            f"upstream(s) {missing} of pipeline {pipeline!r} have nothing committed (never "
            "run, or reset), so there is no version to recompute at. Run a batch first "
            "(`watermark run`), then verify."
        )
    return found, "the committed watermarks"


def verify_pipeline(
    store: "WatermarkStore",
    registry: "Registry",
    pipeline: str,
    *,
    open_spark: Callable[[], "SparkSession"],
) -> Verification:
    """Recompute ``pipeline``'s target from its upstreams and compare. Writes nothing.

    ``open_spark`` starts the Spark session, only when the target exists; it is stopped
    before returning.

    Raises:
        UsageError: ``pipeline`` is unknown, or an upstream of it has nothing committed.
    """
    from deltalake import DeltaTable

    from watermark_dagster.operations.recompute import recompute_pipeline

    found = registry.pipelines.get(pipeline)
    if found is None:
        raise UsageError(
            f"unknown pipeline {pipeline!r}; the code location has {sorted(registry.pipelines)}."
        )
    versions, basis = versions_to_verify(store, registry, pipeline)
    storage = resolved_options(found.storage_options)
    comparison = None
    if found.warehouse is not None:
        from watermark_dagster.observe.warehouse_state import table_exists
        from watermark_dagster.read.warehouse import read_warehouse

        if table_exists(found.warehouse, pipeline):
            spark = open_spark()
            try:
                with contextlib.suppress(Exception):  # Spark Connect has no SparkContext
                    spark.sparkContext.setLogLevel("ERROR")
                target = read_warehouse(spark, found.warehouse)
                recompute = recompute_pipeline(spark, registry, pipeline, versions)
                comparison = compare_with_recompute(target, recompute, keys=found.keys)
            finally:
                spark.stop()
    elif DeltaTable.is_deltatable(found.target, storage_options=storage):
        spark = open_spark()
        try:
            with contextlib.suppress(Exception):  # Spark Connect has no SparkContext
                spark.sparkContext.setLogLevel("ERROR")
            target = spark.read.format("delta").load(found.target)
            recompute = recompute_pipeline(spark, registry, pipeline, versions)
            comparison = compare_with_recompute(target, recompute, keys=found.keys)
        finally:
            spark.stop()
    return Verification(
        pipeline=pipeline,
        target=found.target,
        versions=versions,
        basis=basis,
        comparison=comparison,
    )
