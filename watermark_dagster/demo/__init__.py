"""The demo: three CDF upstreams and two pipelines sharing one of them."""

from watermark_dagster.demo.data import DemoPaths, apply_round, seed
from watermark_dagster.demo.pipelines import (
    build_demo_registry,
    full_customer_payments,
    full_orders_enriched,
)

__all__ = [
    "DemoPaths",
    "apply_round",
    "build_demo_registry",
    "full_customer_payments",
    "full_orders_enriched",
    "seed",
]
