"""The tutorial (docs/first-pipeline.md) run end to end against data.

Its first example, a declared Python pipeline and a SQL pipeline over three upstreams, is
taken from the page as written, with its ``s3://lake`` paths pointed at a temporary
folder; the tables it names are created with change data feed, and the code location it
builds runs batches through Dagster (the headless runner: coordinator, runs, finalizer).
Its hand-written pipeline (the page's second example) runs too, against the same
upstreams. After the first load and after each round of inserts, updates and deletes,
every target must equal its query computed from scratch over the upstreams.
"""

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance
from pyspark.sql import DataFrame, SparkSession

from watermark_dagster import Registry, build_definitions
from watermark_dagster.dagster_defs.headless import HeadlessRunner

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "first-pipeline.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)


def _lake(spark: SparkSession, root: Path) -> None:
    """The three upstreams the page names, with change data feed on."""
    tables = {
        "customers": ("customer_id BIGINT, name STRING", [(1, "Ada"), (2, "Grace"), (3, "Ken")]),
        "orders": (
            "order_id BIGINT, customer_id BIGINT, amount_cents BIGINT",
            [(10, 1, 500), (11, 1, 700), (12, 2, 300), (13, None, 100)],
        ),
        "payments": (
            "payment_id BIGINT, customer_id BIGINT, amount_cents BIGINT",
            [(100, 1, 250), (101, 1, 250), (102, 3, 900)],
        ),
    }
    for name, (schema, rows) in tables.items():
        (
            spark.createDataFrame(rows, schema)
            .write.format("delta")
            .option("delta.enableChangeDataFeed", "true")
            .save(str(root / name))
        )


def _round(spark: SparkSession, root: Path, n: int) -> None:
    """Inserts, updates and deletes in every upstream, some crossing the join paths."""
    customers, orders, payments = (
        f"delta.`{root / t}`" for t in ("customers", "orders", "payments")
    )
    spark.sql(f"UPDATE {customers} SET name = 'Ada {n}' WHERE customer_id = 1")
    spark.sql(f"INSERT INTO {customers} VALUES ({10 + n}, 'New {n}')")
    spark.sql(f"UPDATE {orders} SET customer_id = {10 + n} WHERE order_id = 12")
    spark.sql(f"INSERT INTO {orders} VALUES ({20 + n}, 3, {n * 100}), ({30 + n}, 2, 50)")
    spark.sql(f"DELETE FROM {orders} WHERE order_id = 11")
    spark.sql(f"INSERT INTO {payments} VALUES ({200 + n}, {10 + n}, 75)")
    spark.sql(f"DELETE FROM {payments} WHERE payment_id = 102")
    if n == 2:
        spark.sql(f"DELETE FROM {customers} WHERE customer_id = 2")


def _expected(spark: SparkSession, root: Path) -> dict[str, DataFrame]:
    """Each target computed from scratch, written here independently of the page."""
    for t in ("customers", "orders", "payments"):
        spark.read.format("delta").load(str(root / t)).createOrReplaceTempView(f"tut_{t}")
    return {
        "orders_enriched": spark.sql(
            "SELECT o.order_id, o.customer_id, o.amount_cents, c.name FROM tut_orders o "
            "LEFT JOIN tut_customers c ON o.customer_id = c.customer_id"
        ),
        "customer_payments": spark.sql(
            "SELECT c.customer_id, c.name, COALESCE(SUM(p.amount_cents), 0) AS total_paid_cents "
            "FROM tut_customers c LEFT JOIN tut_payments p ON c.customer_id = p.customer_id "
            "GROUP BY c.customer_id, c.name"
        ),
    }


def _rows(frame: DataFrame) -> list[tuple[Any, ...]]:
    columns = sorted(c for c in frame.columns if not c.startswith("_wm_"))
    return sorted((tuple(r) for r in frame.select(*columns).collect()), key=repr)


def _check_targets(spark: SparkSession, root: Path, targets: dict[str, str]) -> None:
    expected = _expected(spark, root)
    for name, path in targets.items():
        found = spark.read.format("delta").load(path)
        assert _rows(found) == _rows(expected[name]), name


def test_the_tutorial_runs_end_to_end_against_data(
    spark: SparkSession, tmp_path: Path, dagster_home: Path
) -> None:
    declared_example, handwritten_example, *_ = _python_blocks()
    lake = tmp_path / "lake"
    _lake(spark, lake)
    namespace: dict[str, Any] = {}
    exec(compile(declared_example.replace("s3://lake", str(lake)), str(PAGE), "exec"), namespace)
    defs = namespace["defs"]
    # The page's hand-written pipeline, as written, into a target of its own.
    handwritten: dict[str, Any] = {"DataFrame": DataFrame}
    code = handwritten_example.replace("s3://lake/orders_enriched", str(lake / "by_hand"))
    exec(compile(code, str(PAGE), "exec"), handwritten)
    by_hand = Registry(
        upstreams=[namespace["orders"], namespace["customers"]],
        pipelines=[handwritten["orders_enriched"]],
    )
    by_hand_defs = build_definitions(by_hand, control_root=str(lake / "_by_hand"))
    targets = {"orders_enriched": str(lake / "orders_enriched")}
    targets["customer_payments"] = str(lake / "customer_payments")

    # Each code location in an instance of its own: both name their batches b000001, ...
    other_home = tmp_path / "dagster_by_hand"
    other_home.mkdir()
    shutil.copy(dagster_home / "dagster.yaml", other_home / "dagster.yaml")
    instances = [DagsterInstance.get(), DagsterInstance.from_config(str(other_home))]
    try:
        runners = [
            HeadlessRunner(defs, instances[0]),
            HeadlessRunner(by_hand_defs, instances[1]),
        ]
        for n in range(3):
            if n:
                _round(spark, lake, n)
            for runner in runners:
                report = runner.run_until_idle()
                assert report.completed, report
                assert not report.failed_runs, report
            _check_targets(spark, lake, targets)
            _check_targets(spark, lake, {"orders_enriched": str(lake / "by_hand")})
    finally:
        for instance in instances:
            instance.dispose()
