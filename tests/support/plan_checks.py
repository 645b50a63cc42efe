"""What a Python full transform can hide in its plan, and the check that a batch refuses
it before writing: shared by the local session's tests (tests/spark/test_declared.py) and
the Spark Connect engine's (tests/spark/test_engine.py), which run the same cases."""

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from watermark_dagster.config.pipeline import Pipeline, declared_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.demo.data import DemoPaths, seed
from watermark_dagster.demo.pipelines import demo_upstreams, full_orders_enriched
from watermark_dagster.errors import TerminalError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import look_before_planning, plan_next
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.store import WatermarkStore

JOIN = "customers.customer_id -> orders.customer_id -> orders.order_id"


def refused(spark: SparkSession, tmp_path: Path, pipeline: Pipeline, fragment: str) -> str:
    """Run ``pipeline``'s first batch over the demo's upstreams: it must stop with a
    TerminalError saying ``fragment`` (its text is returned), write nothing and move no
    watermark. An incremental batch runs the same checks (tests/spark/test_declared.py
    refuses on one too)."""
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    registry = Registry(upstreams=demo_upstreams(paths), pipelines=[pipeline])
    store = WatermarkStore(paths.control_root)
    look = look_before_planning(registry, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None
    with pytest.raises(TerminalError) as caught:
        execute_pipeline(
            spark=spark,
            store=store,
            registry=registry,
            pipeline_name=pipeline.name,
            batch_id=batch.batch_id,
            run_id="test",
        )
    assert fragment in str(caught.value), caught.value
    assert f"Pipeline '{pipeline.name}'" in str(caught.value)
    assert "Fix: " in str(caught.value)
    assert not Path(pipeline.target).exists()  # nothing written
    assert store.committed_versions().get("orders") is None
    return str(caught.value)


def tiers_table(spark: SparkSession, tmp_path: Path) -> str:
    """A Delta table outside every upstream, for a full transform to read unasked."""
    tiers = str(tmp_path / "outside" / "tiers")
    spark.createDataFrame([(1, "gold")], "customer_id INT, tier STRING").write.format("delta").save(
        tiers
    )
    return tiers


def _outside_in_a_subquery(tiers: str) -> Callable[..., DataFrame]:
    """A full transform reading a table it was not given inside an EXISTS subquery (the
    plan's leaves do not show it: a subquery's plan is an expression's)."""

    def enriched_with_gold(orders: DataFrame, customers: DataFrame) -> DataFrame:
        tier = orders.sparkSession.read.format("delta").load(tiers)
        gold = tier.where(F.col("tier") == "gold").exists()
        return full_orders_enriched(orders, customers).withColumn("any_gold", gold)

    return enriched_with_gold


def _outside_in_sql_text(tiers: str) -> Callable[..., DataFrame]:
    """The same read in SQL text (over Spark Connect the client's plan shows only the
    text, and the server's ``inputFiles`` leave subqueries out)."""

    def enriched_with_gold_in_sql(orders: DataFrame, customers: DataFrame) -> DataFrame:
        full_orders_enriched(orders, customers).createOrReplaceTempView("hiding_enriched")
        return orders.sparkSession.sql(
            "SELECT e.*, EXISTS (SELECT 1 FROM delta.`" + tiers + "` t WHERE t.tier = 'gold') "
            "AS any_gold FROM hiding_enriched e"
        )

    return enriched_with_gold_in_sql


def _collected(tiers: str) -> Callable[..., DataFrame]:
    """A full transform joining a table it was not given, collected to the driver and
    made a frame again: no location is left in the plan to compare."""

    def enriched_with_collected_tiers(orders: DataFrame, customers: DataFrame) -> DataFrame:
        session = orders.sparkSession
        rows = session.read.format("delta").load(tiers).collect()
        tier = session.createDataFrame(rows, "customer_id INT, tier STRING")
        return full_orders_enriched(orders, customers).join(tier, "customer_id", "left")

    return enriched_with_collected_tiers


def _checkpointed(orders: DataFrame, customers: DataFrame) -> DataFrame:
    """A full transform joining rows computed before (a local checkpoint)."""
    return full_orders_enriched(orders, customers.localCheckpoint())


def _reflected(orders: DataFrame, customers: DataFrame) -> DataFrame:
    """A Java method per row: Spark marks it non-deterministic."""
    tag = F.expr("reflect('java.util.UUID', 'randomUUID')")
    return full_orders_enriched(orders, customers).withColumn("tag", tag)


def _share_of_all(orders: DataFrame, customers: DataFrame) -> DataFrame:
    """Each order's share of all orders' amounts, through an uncorrelated subquery."""
    total = orders.select(F.sum("amount_cents")).scalar()
    return full_orders_enriched(orders, customers).withColumn(
        "share", F.col("amount_cents") / total
    )


# (id, the transform given the outside table's path, what the refusal says)
HIDING: list[tuple[str, Callable[[str], Callable[..., DataFrame]], str]] = [
    ("outside-table-in-a-subquery", _outside_in_a_subquery, "outside its upstreams"),
    ("outside-table-in-sql-text", _outside_in_sql_text, "outside its upstreams"),
    # Rows made a frame again: a LocalRelation over Connect, an RDD in a local session.
    ("collected-rows", _collected, "its full transform reads rows "),
    ("local-checkpoint", lambda _: _checkpointed, "rows computed before the batch (LogicalRDD"),
    ("reflect", lambda _: _reflected, "non-deterministic"),
    ("uncorrelated-total", lambda _: _share_of_all, "aggregates all rows into one"),
]


def hiding_pipeline(name: str, tmp_path: Path, tiers: str) -> Pipeline:
    """The declared pipeline of the ``HIDING`` case ``name``."""
    build = next(b for n, b, _ in HIDING if n == name)
    return declared_pipeline(
        upstreams={"orders": "order_id", "customers": JOIN},
        target=str(tmp_path / "wm" / "never"),
        keys=["order_id"],
        name="hiding",
    )(build(tiers))
