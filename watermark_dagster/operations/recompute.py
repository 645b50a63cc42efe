"""A pipeline's output recomputed from whole snapshots: what its target should hold once
given upstream versions are applied (``watermark verify``, the tests' oracle)."""

from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.columns import CDF_COLUMNS, CHANGE_TYPE
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import CursorWindow, ReadMode, VersionRange
from watermark_dagster.operations.run_pipeline import PinnedBatch
from watermark_dagster.read.derive import transform_of
from watermark_dagster.read.inputs import UpstreamInput


def recompute_pipeline(
    spark: SparkSession,
    registry: Registry,
    pipeline_name: str,
    versions: Mapping[str, int],
) -> DataFrame:
    """The pipeline's output when every upstream is read as a full snapshot at
    ``versions``: what its target should hold once those versions are applied (without the
    framework's ``_wm_`` columns and change columns).

    Cursor upstreams are read in full (their committed position is not a version).

    Raises:
        KeyError: the pipeline is unknown, or a versioned upstream has no version given.
    """
    pipeline = registry.pipelines[pipeline_name]
    inputs: dict[str, UpstreamInput] = {}
    for u in pipeline.upstreams:
        upstream = registry.upstreams[u]
        if upstream.is_cursor:
            planned = PlannedInput(u, ReadMode.TIMESTAMP, None, None, CursorWindow(None, None))
            inputs[u] = UpstreamInput.pinned(
                spark,
                upstream,
                planned,
                full_load=True,
                pin=lambda end, _recheck: CursorWindow(None, end or ()),
            )
            continue
        version = versions[u]
        planned = PlannedInput(u, ReadMode.SNAPSHOT, VersionRange(0, version), version)
        inputs[u] = UpstreamInput.pinned(spark, upstream, planned, full_load=True)
    context = PinnedBatch("recompute", 0, pipeline_name, inputs, spark, full_load=True)
    output = transform_of(pipeline)(context)
    if CHANGE_TYPE in output.columns:
        output = output.where(F.lower(F.col(CHANGE_TYPE)) != "delete")
    return output.drop(*CDF_COLUMNS)
