"""Checking the demo targets against a full recompute from the upstreams' latest snapshots."""

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from watermark_dagster.core.columns import BATCH_COLUMN, SEQ_COLUMN
from watermark_dagster.demo.paths import DemoPaths
from watermark_dagster.demo.pipelines import full_customer_payments, full_orders_enriched


@dataclass(frozen=True)
class TargetCheck:
    """One target compared with its full recompute."""

    target: str
    rows: int
    expected_rows: int
    missing: tuple[tuple, ...]
    unexpected: tuple[tuple, ...]

    @property
    def ok(self) -> bool:
        """True when the target holds exactly the recomputed rows."""
        return not self.missing and not self.unexpected and self.rows == self.expected_rows


def _rows(df: DataFrame) -> list[tuple]:
    return sorted(map(tuple, df.collect()), key=repr)


def compare_with_full_recompute(spark: SparkSession, paths: DemoPaths) -> list[TargetCheck]:
    """Compare each demo target with the same pipeline recomputed from scratch."""

    def load(path: str) -> DataFrame:
        return spark.read.format("delta").load(path)

    expected = {
        "orders_enriched": full_orders_enriched(
            load(paths.upstream("orders")), load(paths.upstream("customers"))
        ),
        "customer_payments": full_customer_payments(
            load(paths.upstream("customers")), load(paths.upstream("payments"))
        ),
    }
    checks = []
    for name, reference in expected.items():
        target = load(paths.target(name)).drop(SEQ_COLUMN, BATCH_COLUMN)
        got = _rows(target.select(*reference.columns))
        want = _rows(reference)
        checks.append(
            TargetCheck(
                target=name,
                rows=len(got),
                expected_rows=len(want),
                missing=tuple(r for r in want if r not in got),
                unexpected=tuple(r for r in got if r not in want),
            )
        )
    return checks
