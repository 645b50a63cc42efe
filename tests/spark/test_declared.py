"""Declared pipelines on Spark: the SQL form runs against views of the pinned snapshots,
and a declaration that only the data can refute (a key path naming a column the upstream
lacks, a full transform dropping the key) is refused before anything is written.

The derived transforms' exactness over random histories, crashes and replays is proven by
tests/model/test_declared.py; their cost against the hand-written form by
tests/bench/test_benchmark_declared.py (``-m slow``). Here, a plan-metrics check that
only the touched keys reach the join keeps the derived form incremental in the default
suite.
"""

from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from benchmarks.declared import PlanWork, measuring
from watermark_dagster.config.pipeline import Pipeline, declared_pipeline, sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.demo.data import ORDERS, DemoPaths, apply_round, seed
from watermark_dagster.demo.pipelines import demo_upstreams, full_orders_enriched
from watermark_dagster.errors import TerminalError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import finalize_batch, look_before_planning, plan_next
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.spark

JOIN = "customers.customer_id -> orders.customer_id -> orders.order_id"
ENRICHED_SQL = """
    SELECT o.order_id, o.customer_id, c.name AS customer_name, o.amount_cents, o.status
    FROM orders AS o LEFT JOIN customers AS c ON o.customer_id = c.customer_id
"""


def _cycle(spark: SparkSession, registry: Registry, store: WatermarkStore) -> str:
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


def _rows(frame: DataFrame, columns: list[str]) -> list[tuple]:
    return sorted(tuple(r) for r in frame.select(*columns).collect())


def test_sql_and_function_forms_match_a_full_recompute_batch_after_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    # More orders than a round touches, so a recompute of every order would show.
    more = [(1000 + i, 1 + i % 5, 100 + i, "new") for i in range(200)]
    spark.createDataFrame(more, ORDERS).write.format("delta").mode("append").save(
        paths.upstream("orders")
    )
    function = declared_pipeline(
        upstreams={"orders": "order_id", "customers": JOIN},
        target=paths.target("by_function"),
        keys=["order_id"],
        name="by_function",
    )(full_orders_enriched)
    sql = sql_pipeline(
        name="by_sql",
        sql=ENRICHED_SQL,
        upstreams={"orders": "order_id", "customers": JOIN},
        target=paths.target("by_sql"),
        keys=["order_id"],
    )
    # Each batch's derived output is executed once more and its plan's metrics kept.
    work: dict[str, list[PlanWork]] = {}
    registry = measuring(Registry(upstreams=demo_upstreams(paths), pipelines=[function, sql]), work)
    store = WatermarkStore(paths.control_root)
    for round_no in range(3):
        if round_no:
            apply_round(spark, paths, round_no)  # renames, moved and deleted orders
        _cycle(spark, registry, store)
        orders = spark.read.format("delta").load(paths.upstream("orders"))
        customers = spark.read.format("delta").load(paths.upstream("customers"))
        full = full_orders_enriched(orders, customers)
        expected = _rows(full, full.columns)
        for name in ("by_function", "by_sql"):
            target = spark.read.format("delta").load(paths.target(name))
            assert _rows(target, full.columns) == expected, (name, round_no)
            if round_no:
                # Only the touched orders reach the join: the direct upstream is cut down
                # to the touched keys before the full transform runs.
                largest = work[name][-1].largest_intermediate
                assert 0 < largest < orders.count(), (name, round_no, work[name][-1])


def _refused(spark: SparkSession, tmp_path: Path, pipeline: Pipeline, fragment: str) -> None:
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    registry = Registry(upstreams=demo_upstreams(paths), pipelines=[pipeline])
    store = WatermarkStore(paths.control_root)
    look = look_before_planning(registry, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None
    apply_round(spark, paths, 1)  # so a second batch would read changes, not a first load
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


def test_a_key_path_column_the_upstream_lacks_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path
) -> None:
    pipeline = declared_pipeline(
        upstreams={
            "orders": "order_id",
            "customers": "customers.cust_id -> orders.customer_id -> orders.order_id",
        },
        target=str(tmp_path / "wm" / "never"),
        keys=["order_id"],
        name="typo",
    )(full_orders_enriched)
    _refused(spark, tmp_path, pipeline, "names column 'cust_id', which upstream 'customers'")


def test_a_full_transform_without_the_key_column_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path
) -> None:
    pipeline = sql_pipeline(
        name="no_key",
        sql="SELECT o.customer_id, c.name FROM orders o JOIN customers c USING (customer_id)",
        upstreams={"orders": "order_id", "customers": JOIN},
        target=str(tmp_path / "wm" / "never"),
        keys=["order_id"],
    )
    _refused(spark, tmp_path, pipeline, "output has no key column(s) ['order_id']")


def _reading_another_table(tiers: str):
    """A full transform that also reads a table by path, which it was not given."""

    def enriched_with_tiers(orders: DataFrame, customers: DataFrame) -> DataFrame:
        tier = orders.sparkSession.read.format("delta").load(tiers)
        return full_orders_enriched(orders, customers).join(tier, "customer_id", "left")

    return enriched_with_tiers


def test_a_full_transform_reading_a_table_it_was_not_given_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path
) -> None:
    tiers = str(tmp_path / "outside" / "tiers")
    spark.createDataFrame([(1, "gold")], "customer_id INT, tier STRING").write.format("delta").save(
        tiers
    )
    pipeline = declared_pipeline(
        upstreams={"orders": "order_id", "customers": JOIN},
        target=str(tmp_path / "wm" / "never"),
        keys=["order_id"],
        name="with_tiers",
    )(_reading_another_table(tiers))
    _refused(spark, tmp_path, pipeline, "outside its upstreams ['orders', 'customers']")


def test_a_changed_transform_reading_another_table_is_refused_on_an_incremental_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    tiers = str(tmp_path / "outside" / "tiers")
    spark.createDataFrame([(1, "gold")], "customer_id INT, tier STRING").write.format("delta").save(
        tiers
    )
    declare = declared_pipeline(
        upstreams={"orders": "order_id", "customers": JOIN},
        target=paths.target("enriched"),
        keys=["order_id"],
        name="enriched",
    )
    store = WatermarkStore(paths.control_root)
    first = Registry(upstreams=demo_upstreams(paths), pipelines=[declare(full_orders_enriched)])
    _cycle(spark, first, store)
    target = DeltaTable.forPath(spark, paths.target("enriched"))
    version = target.history(1).first()
    assert version is not None
    apply_round(spark, paths, 1)
    changed = Registry(
        upstreams=demo_upstreams(paths), pipelines=[declare(_reading_another_table(tiers))]
    )
    look = look_before_planning(changed, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None
    with pytest.raises(TerminalError, match="outside its upstreams") as caught:
        execute_pipeline(
            spark=spark,
            store=store,
            registry=changed,
            pipeline_name="enriched",
            batch_id=batch.batch_id,
            run_id="test",
        )
    assert str(Path(tiers)) in str(caught.value)
    latest = target.history(1).first()
    assert latest is not None
    assert latest["version"] == version["version"]  # nothing written


def _ranked(orders: DataFrame, customers: DataFrame) -> DataFrame:
    """Each order's rank among its customer's orders: a window over other keys' rows."""
    by_customer = Window.partitionBy("customer_id").orderBy(F.col("amount_cents").desc())
    return full_orders_enriched(orders, customers).withColumn("rank", F.rank().over(by_customer))


def _sampled(orders: DataFrame, customers: DataFrame) -> DataFrame:
    return full_orders_enriched(orders, customers).withColumn("draw", F.rand())


@pytest.mark.parametrize(
    ("function", "fragment"),
    [
        (_ranked, "its full transform uses Window: a window function"),
        (_sampled, "its full transform calls Rand, which is non-deterministic"),
    ],
    ids=["window", "rand"],
)
def test_a_python_full_transform_mixing_keys_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path, function, fragment: str
) -> None:
    pipeline = declared_pipeline(
        upstreams={"orders": "order_id", "customers": JOIN},
        target=str(tmp_path / "wm" / "never"),
        keys=["order_id"],
        name="mixing",
    )(function)
    _refused(spark, tmp_path, pipeline, fragment)
