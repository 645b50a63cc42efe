"""The demo's pipelines written by hand: what the declared form derives, spelt out.

Kept as a documented example of the hand-written form (``@pipeline`` with a transform of
the batch), for a pipeline the declared form cannot express, and as the baseline the
incremental benchmark compares the declared form with. Each transform finds the keys a
batch touched, recomputes them from the pinned snapshots with the same function a full
recompute uses, and hands back upserts and deletes. Touched keys select rows through
``matching_keys`` (NULL matches NULL), never ``join(..., "left_semi")``.
"""

from pyspark.sql import DataFrame

from watermark_dagster.config.batch_context import BatchContext
from watermark_dagster.config.pipeline import Pipeline, pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.demo.paths import DemoPaths
from watermark_dagster.demo.pipelines import (
    demo_upstreams,
    full_customer_payments,
    full_orders_enriched,
)
from watermark_dagster.read.changes import matching_keys, recompute


def build_handwritten_registry(paths: DemoPaths) -> Registry:
    """The demo's upstreams and its two pipelines, hand-written, rooted at ``paths``."""

    @pipeline(
        upstreams=["orders", "customers"],
        target=paths.target("orders_enriched"),
        keys=["order_id"],
    )
    def orders_enriched(batch: BatchContext) -> DataFrame:
        """Orders with their customer's name; reads orders and customers."""
        orders, customers = batch["orders"], batch["customers"]
        by_customer = matching_keys(
            orders.snapshot, customers.changed_keys(["customer_id"]), ["customer_id"]
        ).select("order_id")
        touched = orders.changed_keys(["order_id"]).unionByName(by_customer).distinct()
        current = full_orders_enriched(
            matching_keys(orders.snapshot, touched, ["order_id"]), customers.snapshot
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
            matching_keys(customers.snapshot, touched, ["customer_id"]),
            matching_keys(payments.snapshot, touched, ["customer_id"]),
        )
        return recompute(touched, current, ["customer_id"])

    pipelines: list[Pipeline] = [orders_enriched, customer_payments]
    return Registry(upstreams=demo_upstreams(paths), pipelines=pipelines)
