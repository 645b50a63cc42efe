"""Demo pipelines: two pipelines sharing the ``customers`` upstream.

* ``orders_enriched`` (orders + customers): each order with its customer's name.
* ``customer_payments`` (customers + payments): each customer with payment totals.

Each transform finds the keys a batch touched, recomputes them from the pinned snapshots
with the same function a full recompute uses, and hands back upserts and deletes.
"""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from watermark_dagster.config.pipeline import BatchContext, Pipeline, pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.demo.data import DemoPaths
from watermark_dagster.read.changes import recompute


def full_orders_enriched(orders: DataFrame, customers: DataFrame) -> DataFrame:
    """orders_enriched computed from scratch (also the reference the tests compare with)."""
    names = customers.select("customer_id", F.col("name").alias("customer_name"))
    return orders.join(names, "customer_id", "left").select(
        "order_id", "customer_id", "customer_name", "amount_cents", "status"
    )


def full_customer_payments(customers: DataFrame, payments: DataFrame) -> DataFrame:
    """customer_payments computed from scratch (also the tests' reference)."""
    totals = payments.groupBy("customer_id").agg(
        F.sum("amount_cents").alias("total_paid_cents"),
        F.count(F.lit(1)).alias("payment_count"),
    )
    return customers.join(totals, "customer_id", "left").select(
        "customer_id",
        "name",
        F.coalesce("total_paid_cents", F.lit(0)).cast("long").alias("total_paid_cents"),
        F.coalesce("payment_count", F.lit(0)).cast("long").alias("payment_count"),
    )


def build_demo_registry(paths: DemoPaths) -> Registry:
    """The demo's upstreams and pipelines, rooted at ``paths``."""
    upstreams = [
        DeltaUpstream(
            name="customers", path=paths.upstream("customers"), description="Demo customers"
        ),
        DeltaUpstream(name="orders", path=paths.upstream("orders"), description="Demo orders"),
        DeltaUpstream(
            name="payments", path=paths.upstream("payments"), description="Demo payments"
        ),
    ]

    @pipeline(
        upstreams=["orders", "customers"],
        target=paths.target("orders_enriched"),
        keys=["order_id"],
    )
    def orders_enriched(batch: BatchContext) -> DataFrame:
        """Orders with their customer's name; reads orders and customers."""
        orders, customers = batch["orders"], batch["customers"]
        by_customer = orders.snapshot.join(
            customers.changed_keys(["customer_id"]), "customer_id", "left_semi"
        ).select("order_id")
        touched = orders.changed_keys(["order_id"]).unionByName(by_customer).distinct()
        current = full_orders_enriched(
            orders.snapshot.join(touched, "order_id", "left_semi"), customers.snapshot
        )
        return recompute(touched, current, ["order_id"])

    @pipeline(
        upstreams=["customers", "payments"],
        target=paths.target("customer_payments"),
        keys=["customer_id"],
    )
    def customer_payments(batch: BatchContext) -> DataFrame:
        """Payment totals per customer; reads customers and payments."""
        customers, payments = batch["customers"], batch["payments"]
        touched = (
            customers.changed_keys(["customer_id"])
            .unionByName(payments.changed_keys(["customer_id"]))
            .distinct()
        )
        current = full_customer_payments(
            customers.snapshot.join(touched, "customer_id", "left_semi"),
            payments.snapshot.join(touched, "customer_id", "left_semi"),
        )
        return recompute(touched, current, ["customer_id"])

    pipelines: list[Pipeline] = [orders_enriched, customer_payments]
    return Registry(upstreams=upstreams, pipelines=pipelines)
