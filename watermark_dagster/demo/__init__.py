"""The demo: three CDF upstreams and two pipelines sharing one of them.

``seed`` and ``apply_round`` write the demo's tables with Spark; they are imported on first
use, so that loading the demo's code location does not import PySpark.
"""

from typing import TYPE_CHECKING, Any

from watermark_dagster.demo.paths import DemoPaths
from watermark_dagster.demo.pipelines import (
    build_demo_registry,
    full_customer_payments,
    full_orders_enriched,
)

if TYPE_CHECKING:
    from watermark_dagster.demo.data import apply_round, seed

__all__ = [
    "DemoPaths",
    "apply_round",
    "build_demo_registry",
    "full_customer_payments",
    "full_orders_enriched",
    "seed",
]


def __getattr__(name: str) -> Any:
    if name in ("apply_round", "seed"):
        from watermark_dagster.demo import data

        return getattr(data, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
