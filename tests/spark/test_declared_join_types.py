"""Declared joins between columns of different types compare in the query's own type
(issue 64 item 7). ``orders.customer_id`` is a STRING, ``customers.customer_id`` a BIGINT:
the query's ``=`` casts the string to a number (``'01' = 1``) with ANSI on or off, while
an ``IN`` of the touched values compared them as strings with ANSI off. Customer 1
renamed then missed order ``'01'`` (its row kept the old name), and an order moved to
customer ``'02'`` found no customer in the walk back from its key (its row was deleted),
both with exit 0. Each batch through the declared pipeline path, on real Delta tables,
against the SQL recomputed over the upstreams."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from tests.support.cycles import run_cycle
from watermark_dagster.config.key_paths import Hop, KeyPath
from watermark_dagster.config.pipeline import sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.errors import TerminalError
from watermark_dagster.read.reach import reaching_rows
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.spark

SCHEMAS = {
    "customers": "customer_id bigint, name string",
    "orders": "order_id bigint, customer_id string",
}
SQL = "SELECT o.order_id, c.name FROM orders o JOIN customers c ON c.customer_id = o.customer_id"
PATHS = {
    "orders": "order_id",
    "customers": "customers.customer_id -> orders.customer_id -> orders.order_id",
}


@pytest.fixture(params=["false", "true"], ids=["ansi-off", "ansi-on"])
def ansi(spark: SparkSession, request: pytest.FixtureRequest) -> Iterator[str]:
    before = spark.conf.get("spark.sql.ansi.enabled") or "true"
    spark.conf.set("spark.sql.ansi.enabled", request.param)
    yield request.param
    spark.conf.set("spark.sql.ansi.enabled", before)


def _lake(spark: SparkSession, root: Path, seed: dict[str, list[tuple]]) -> list[DeltaUpstream]:
    for table, rows in seed.items():
        spark.createDataFrame(rows, SCHEMAS[table]).write.format("delta").option(
            "delta.enableChangeDataFeed", "true"
        ).save(str(root / table))
    return [DeltaUpstream(name=t, path=str(root / t)) for t in seed]


def _recomputed(spark: SparkSession, root: Path, sql: str) -> list[tuple]:
    for table in SCHEMAS:
        spark.read.format("delta").load(str(root / table)).createOrReplaceTempView(table)
    return sorted(tuple(r) for r in spark.sql(sql).collect())


def _target(spark: SparkSession, path: Path) -> list[tuple]:
    frame = spark.read.format("delta").load(str(path)).select("order_id", "name")
    return sorted(tuple(r) for r in frame.collect())


def test_the_walk_back_compares_in_the_type_of_the_query_s_equality(
    spark: SparkSession, ansi: str
) -> None:
    """reach.py alone: order 10's customer '01' reaches customer 1 (as ``1 = '01'``
    does), with ANSI on or off; beside a second path the one filter of IN lists cannot
    say that, and the snapshot is read whole."""
    frames = {
        "customers": spark.createDataFrame([(1, "a"), (2, "b")], SCHEMAS["customers"]),
        "orders": spark.createDataFrame([(10, "01"), (11, "2")], SCHEMAS["orders"]),
    }
    path = KeyPath("customers", ("customer_id",), (Hop("orders", ("customer_id",), ("order_id",)),))
    reached = reaching_rows("customers", [path], frames, [(10,)], 1_000)
    assert reached is not None
    assert [r.customer_id for r in reached.collect()] == [1], ansi
    direct = KeyPath("customers", ("customer_id",))
    assert reaching_rows("customers", [direct, path], frames, [(10,)], 1_000) is None


def test_a_join_of_a_string_and_a_bigint_column_is_walked_as_the_query_compares(
    spark: SparkSession, tmp_path: Path, ansi: str
) -> None:
    root = tmp_path / "lake"
    upstreams = _lake(
        spark,
        root,
        {
            "customers": [(1, "c1"), (2, "c2")],
            "orders": [(10, "01"), (11, "1"), (12, "2"), (13, None)],
        },
    )
    pipeline = sql_pipeline(
        name="named",
        sql=SQL,
        upstreams=PATHS,
        keys=["order_id"],
        target=str(tmp_path / "named"),
        strategy="incremental",  # the derived form, however small the tables
    )
    registry = Registry(upstreams=upstreams, pipelines=[pipeline])
    store = WatermarkStore(str(tmp_path / "control"))
    run_cycle(spark, registry, store)
    assert _target(spark, tmp_path / "named") == [(10, "c1"), (11, "c1"), (12, "c2")]
    # Forward: customer 1 renamed touches orders '01' and '1' (the query's 1 = '01').
    DeltaTable.forPath(spark, str(root / "customers")).update("customer_id = 1", {"name": "'one'"})
    run_cycle(spark, registry, store)
    assert _target(spark, tmp_path / "named") == _recomputed(spark, root, SQL), ansi
    assert _target(spark, tmp_path / "named") == [(10, "one"), (11, "one"), (12, "c2")]
    # Back: order 12 moved to '02' reads customer 2 (its row stays, still 'c2').
    DeltaTable.forPath(spark, str(root / "orders")).update("order_id = 12", {"customer_id": "'02'"})
    run_cycle(spark, registry, store)
    assert _target(spark, tmp_path / "named") == _recomputed(spark, root, SQL), ansi
    assert _target(spark, tmp_path / "named") == [(10, "one"), (11, "one"), (12, "c2")]
    # Every batch after the first load ran the derived form.
    strategies = [str(r.strategy) for r in store.strategy_runs("named")]
    assert strategies[-2:] == ["incremental", "incremental"]


def test_a_key_reached_from_a_column_of_another_type_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path, ansi: str
) -> None:
    """The target keyed by the string ``o.customer_id``, and customers holding the key
    directly as a BIGINT: customer 1's change names the key 1, yet the query gives it to
    the rows '01' and '1', which no value of it names. Refused, nothing written."""
    root = tmp_path / "lake"
    upstreams = _lake(
        spark,
        root,
        {"customers": [(1, "c1")], "orders": [(10, "01"), (11, "1")]},
    )
    sql = (
        "SELECT o.customer_id, MAX(c.name) AS name, COUNT(*) AS n\n"
        "FROM orders o JOIN customers c ON c.customer_id = o.customer_id GROUP BY o.customer_id"
    )
    pipeline = sql_pipeline(
        name="per_customer",
        sql=sql,
        upstreams={"orders": "customer_id", "customers": "customer_id"},
        keys=["customer_id"],
        target=str(tmp_path / "per_customer"),
        strategy="incremental",
    )
    registry = Registry(upstreams=upstreams, pipelines=[pipeline])
    store = WatermarkStore(str(tmp_path / "control"))
    with pytest.raises(TerminalError) as refused:
        run_cycle(spark, registry, store)
    message = str(refused.value)
    assert "customers.customer_id bigint" in message, message
    assert "'customer_id' (string)" in message, message
    assert "Fix: give customers.customer_id the key's type string" in message, message
    assert not (tmp_path / "per_customer").exists()
