"""A NULL key is a key like any other, on every path that matches keys.

Customers without a region form a NULL group in a per-region aggregate (Spark's ``GROUP
BY`` keeps it). Batches move customers into and out of that group, add orders to it, empty
it and fill it again; after each batch the targets equal a full recompute done in plain
Python over delta-rs reads (no Spark, no derived transform), for the aggregate declared in
SQL and written by hand, and for a keyed copy whose own key is NULL in some rows. With
``=`` anywhere a key is matched (touched keys, semi-joins, the MERGE, its file skipping),
the NULL group kept its first-load figures while exit codes said success.
"""

from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.support.cycles import run_cycle
from watermark_dagster.config.batch_context import BatchContext
from watermark_dagster.config.pipeline import Pipeline, pipeline, sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.read.changes import matching_keys, recompute
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.spark

CDF = {"delta.enableChangeDataFeed": "true"}
BY_REGION_SQL = """
    SELECT c.region_id, COUNT(*) AS orders, SUM(o.amount) AS amount
    FROM customers AS c JOIN orders AS o ON o.customer_id = c.customer_id
    GROUP BY c.region_id
"""
ORDERS_PATH = "orders.customer_id -> customers.customer_id -> customers.region_id"


def _customers(rows: list[tuple[int, int | None]]) -> pa.Table:
    return pa.table(
        {
            "customer_id": pa.array([r[0] for r in rows], pa.int64()),
            "region_id": pa.array([r[1] for r in rows], pa.int64()),
        }
    )


def _orders(rows: list[tuple[int, int, int]]) -> pa.Table:
    return pa.table(
        {
            "order_id": pa.array([r[0] for r in rows], pa.int64()),
            "customer_id": pa.array([r[1] for r in rows], pa.int64()),
            "amount": pa.array([r[2] for r in rows], pa.int64()),
        }
    )


def _tags(rows: list[tuple[int | None, str]]) -> pa.Table:
    return pa.table(
        {
            "tag_id": pa.array([r[0] for r in rows], pa.int64()),
            "label": pa.array([r[1] for r in rows], pa.string()),
        }
    )


def _registry(root: Path) -> Registry:
    by_sql = sql_pipeline(
        name="by_region_sql",
        sql=BY_REGION_SQL,
        upstreams={"customers": "region_id", "orders": ORDERS_PATH},
        target=str(root / "by_region_sql"),
        keys=["region_id"],
        strategy="incremental",  # the derived form (small tables would be recomputed)
    )

    @pipeline(
        upstreams=["customers", "orders"], target=str(root / "by_region_hand"), keys=["region_id"]
    )
    def by_region_hand(batch: BatchContext) -> DataFrame:
        """The same aggregate, written by hand with matching_keys and recompute."""
        customers, orders = batch["customers"], batch["orders"]
        moved = matching_keys(
            customers.snapshot, orders.changed_keys(["customer_id"]), ["customer_id"]
        ).select("region_id")
        touched = customers.changed_keys(["region_id"]).unionByName(moved).distinct()
        members = matching_keys(customers.snapshot, touched, ["region_id"])
        current = (
            members.join(orders.snapshot, "customer_id")
            .groupBy("region_id")
            .agg(F.count(F.lit(1)).alias("orders"), F.sum("amount").alias("amount"))
        )
        return recompute(touched, current, ["region_id"])

    @pipeline(upstreams=["tags"], target=str(root / "tags_copy"), keys=["tag_id"])
    def tags_copy(batch: BatchContext) -> DataFrame:
        """The latest change per tag id, a NULL id included."""
        return batch["tags"].net_changes(["tag_id"]).drop("_commit_timestamp")

    pipelines: list[Pipeline] = [by_sql, by_region_hand, tags_copy]
    return Registry(
        upstreams=[
            DeltaUpstream(name=n, path=str(root / n)) for n in ("customers", "orders", "tags")
        ],
        pipelines=pipelines,
    )


def _expected_by_region(root: Path) -> dict[Any, tuple[int, int]]:
    """The aggregate in plain Python over delta-rs reads: region -> (orders, amount)."""
    customers = DeltaTable(str(root / "customers")).to_pyarrow_table().to_pylist()
    orders = DeltaTable(str(root / "orders")).to_pyarrow_table().to_pylist()
    region = {c["customer_id"]: c["region_id"] for c in customers}
    totals: dict[Any, list[int]] = defaultdict(lambda: [0, 0])
    for o in orders:
        if o["customer_id"] in region:
            group = totals[region[o["customer_id"]]]
            group[0] += 1
            group[1] += o["amount"]
    return {k: (n, amount) for k, (n, amount) in totals.items()}


def _target(spark: SparkSession, path: Path, key: str, columns: list[str]) -> dict[Any, tuple]:
    rows = spark.read.format("delta").load(str(path)).select(key, *columns).collect()
    keys = [r[0] for r in rows]
    assert len(keys) == len(set(keys)), (
        f"a key appears twice in {path.name}: {sorted(keys, key=str)}"
    )
    return {r[0]: tuple(r[1:]) for r in rows}


def _check(spark: SparkSession, root: Path, step: str) -> None:
    expected = _expected_by_region(root)
    for name in ("by_region_sql", "by_region_hand"):
        got = _target(spark, root / name, "region_id", ["orders", "amount"])
        assert got == expected, (step, name, got, expected)
    tags = DeltaTable(str(root / "tags")).to_pyarrow_table().to_pylist()
    want_tags = {t["tag_id"]: (t["label"],) for t in tags}
    assert _target(spark, root / "tags_copy", "tag_id", ["label"]) == want_tags, step


def test_null_groups_and_null_keys_follow_every_change(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "lake"
    # Customers 3 and 5 have no region: the NULL group.
    write_deltalake(
        str(root / "customers"),
        _customers([(1, 10), (2, 10), (3, None), (4, 20), (5, None), (6, 20)]),
        configuration=CDF,
    )
    write_deltalake(
        str(root / "orders"),
        _orders([(100 + c, c, 10 * c) for c in range(1, 7)] + [(200, 3, 7), (201, 5, 9)]),
        configuration=CDF,
    )
    write_deltalake(
        str(root / "tags"), _tags([(1, "a"), (None, "none"), (2, "b")]), configuration=CDF
    )
    registry = _registry(root)
    store = WatermarkStore(root / "_control")

    run_cycle(spark, registry, store)  # first loads: the NULL group holds 4 orders, 96
    _check(spark, root, "first load")
    assert _expected_by_region(root)[None] == (4, 96)

    customers = DeltaTable(str(root / "customers"))
    orders = DeltaTable(str(root / "orders"))
    tags = DeltaTable(str(root / "tags"))
    steps = {
        "an order added to the NULL group": lambda: write_deltalake(
            str(root / "orders"), _orders([(300, 3, 1000)]), mode="append"
        ),
        "a customer moves into the NULL group and one out of it": lambda: (
            customers.update(predicate="customer_id = 1", updates={"region_id": "NULL"}),
            customers.update(predicate="customer_id = 5", updates={"region_id": "30"}),
        ),
        "the NULL group emptied (its orders deleted); a NULL tag relabelled": lambda: (
            orders.delete(predicate="customer_id IN (1, 3)"),
            tags.update(predicate="tag_id IS NULL", updates={"label": "'renamed'"}),
        ),
        "the NULL group back (a customer loses its region); the NULL tag deleted": lambda: (
            customers.update(predicate="customer_id = 4", updates={"region_id": "NULL"}),
            tags.delete(predicate="tag_id IS NULL"),
        ),
    }
    for step, change in steps.items():
        change()
        customers, orders, tags = (
            DeltaTable(str(root / n)) for n in ("customers", "orders", "tags")
        )
        run_cycle(spark, registry, store)
        _check(spark, root, step)
    # The NULL group went away and came back: region 20 lost customer 4 to it.
    assert _expected_by_region(root)[None] == (1, 40)
