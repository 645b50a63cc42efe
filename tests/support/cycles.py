"""One batch cycle in process: plan, run every pipeline of the batch, finalize."""

from pyspark.sql import SparkSession

from watermark_dagster.config.registry import Registry
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import finalize_batch, look_before_planning, plan_next
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.store import WatermarkStore


def run_cycle(spark: SparkSession, registry: Registry, store: WatermarkStore) -> str:
    """Plan the next batch of ``registry``, run each of its pipelines on ``spark`` and
    finalize it; the batch's id. Fails when there is nothing to plan."""
    look = look_before_planning(registry, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None
    for name in batch.pipelines:
        execute_pipeline(
            spark=spark,
            store=store,
            registry=registry,
            pipeline_name=name,
            batch_id=batch.batch_id,
            run_id="test",
        )
    finalize_batch(store, store.get_batch(batch.batch_id), registry=registry, actor="test")
    return batch.batch_id
