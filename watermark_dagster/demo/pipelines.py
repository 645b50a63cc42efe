"""Demo pipelines: two pipelines sharing the ``customers`` upstream.

* ``orders_enriched`` (orders + customers): each order with its customer's name.
* ``customer_payments`` (customers + payments): each customer with payment totals.

Both are declared: the full transform is written once, and each upstream says how its
rows reach the target's key; the library derives the incremental transform (the keys a
batch touched, recomputed from the pinned snapshots). ``customer_payments`` is declared
in SQL (:data:`CUSTOMER_PAYMENTS_SQL`), whose payment totals are sums over one upstream:
``auto`` maintains them from the change rows (the ``maintain`` strategy) instead of
reading every payment of the touched customers again. :func:`full_customer_payments` is
the same target in PySpark, the reference the tests and ``demo verify`` compare with. The
same pipelines written by hand are in :mod:`watermark_dagster.demo.handwritten`.
"""

from typing import TYPE_CHECKING

from watermark_dagster.config.pipeline import Pipeline, declared_pipeline, sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.demo.paths import DemoPaths

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def full_orders_enriched(orders: "DataFrame", customers: "DataFrame") -> "DataFrame":
    """orders_enriched computed from scratch (also the reference the tests compare with)."""
    from pyspark.sql import functions as F

    names = customers.select("customer_id", F.col("name").alias("customer_name"))
    return orders.join(names, "customer_id", "left").select(
        "order_id", "customer_id", "customer_name", "amount_cents", "status"
    )


def full_customer_payments(customers: "DataFrame", payments: "DataFrame") -> "DataFrame":
    """customer_payments computed from scratch (also the tests' reference)."""
    from pyspark.sql import functions as F

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


CUSTOMER_PAYMENTS_SQL = """SELECT c.customer_id, c.name,
       CAST(COALESCE(t.total_paid_cents, 0) AS BIGINT) AS total_paid_cents,
       CAST(COALESCE(t.payment_count, 0) AS BIGINT) AS payment_count
FROM customers c
LEFT JOIN (
  SELECT customer_id, SUM(amount_cents) AS total_paid_cents, COUNT(*) AS payment_count
  FROM payments
  GROUP BY customer_id
) t ON t.customer_id = c.customer_id"""


def demo_upstreams(paths: DemoPaths) -> list[DeltaUpstream]:
    """The demo's three upstreams, rooted at ``paths``."""
    return [
        DeltaUpstream(
            name="customers", path=paths.upstream("customers"), description="Demo customers"
        ),
        DeltaUpstream(name="orders", path=paths.upstream("orders"), description="Demo orders"),
        DeltaUpstream(
            name="payments", path=paths.upstream("payments"), description="Demo payments"
        ),
    ]


def build_demo_registry(paths: DemoPaths) -> Registry:
    """The demo's upstreams and declared pipelines, rooted at ``paths``."""
    orders_enriched = declared_pipeline(
        upstreams={
            "orders": "order_id",
            # A customer's change reaches the orders that carry its id.
            "customers": "customers.customer_id -> orders.customer_id -> orders.order_id",
        },
        target=paths.target("orders_enriched"),
        keys=["order_id"],
        name="orders_enriched",
        description="Orders with their customer's name; reads orders and customers.",
    )(full_orders_enriched)
    customer_payments = sql_pipeline(
        name="customer_payments",
        sql=CUSTOMER_PAYMENTS_SQL,
        upstreams={"customers": "customer_id", "payments": "customer_id"},
        target=paths.target("customer_payments"),
        keys=["customer_id"],
        description="Payment totals per customer; reads customers and payments.",
    )

    pipelines: list[Pipeline] = [orders_enriched, customer_payments]
    return Registry(upstreams=demo_upstreams(paths), pipelines=pipelines)
