"""One batch cycle in process: plan (or resume), run every pipeline of the batch, finalize."""

from pyspark.sql import SparkSession

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.outcomes import succeeded_pipelines
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import finalize_batch, look_before_planning, plan_next
from watermark_dagster.operations.decide import PipelineOutcome
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.store import WatermarkStore


def run_cycle(spark: SparkSession, registry: Registry, store: WatermarkStore) -> str:
    """Plan the next batch of ``registry``, run each of its pipelines on ``spark`` and
    finalize it; the batch's id. Fails when there is nothing to plan."""
    assert store.open_batch() is None
    batch_id, _ = cycle_outcomes(spark, registry, store)
    return batch_id


def cycle_outcomes(
    spark: SparkSession, registry: Registry, store: WatermarkStore
) -> tuple[str, list[PipelineOutcome]]:
    """:func:`run_cycle`, resuming the open batch if there is one (its pipelines that
    succeeded are not run again); the batch's id and the outcomes of the runs."""
    batch = store.open_batch()
    if batch is None:
        look = look_before_planning(registry, Observer(), store, actor="test")
        batch, _ = plan_next(store, look, actor="test")
        assert batch is not None
    done = succeeded_pipelines(batch.batch_id, store.checkpoints(batch_id=batch.batch_id))
    outcomes = [
        execute_pipeline(
            spark=spark,
            store=store,
            registry=registry,
            pipeline_name=name,
            batch_id=batch.batch_id,
            run_id="test",
        )
        for name in batch.pipelines
        if name not in done
    ]
    finalize_batch(store, store.get_batch(batch.batch_id), registry=registry, actor="test")
    return batch.batch_id, outcomes
