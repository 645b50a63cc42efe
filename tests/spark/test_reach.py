"""The other side of a join read only for the touched keys
(watermark_dagster/read/reach.py): each path walked backwards from the keys over real
Spark frames, NULL matched to NULL, a self-join's two paths kept as one filter (no row
twice), a key computed from the walk's end, and the whole snapshot read past the limit.
The batches that use it are checked against a recompute in tests/spark/test_declared.py,
test_declared_proofs.py and the model tests: off by default, it is on in the test
process's session (tests/conftest.py)."""

import pytest
from pyspark.sql import SparkSession

from watermark_dagster.config.key_paths import Hop, KeyPath, key_input
from watermark_dagster.errors import TerminalError
from watermark_dagster.read.reach import BY_KEYS_CONF, reaching_rows

pytestmark = pytest.mark.spark

LIMIT = 1_000


def _frames(spark: SparkSession) -> dict:
    return {
        "customers": spark.createDataFrame(
            [(1, "a"), (2, "b"), (3, "c"), (None, "nobody"), (4, "d")],
            "customer_id bigint, name string",
        ),
        "orders": spark.createDataFrame(
            [(10, 1), (11, 1), (12, 2), (13, None), (14, 3)],
            "order_id bigint, customer_id bigint",
        ),
        "payments": spark.createDataFrame(
            [(100, 10), (101, 11), (102, 12), (103, 14), (104, 14), (105, None)],
            "payment_id bigint, order_id bigint",
        ),
        "employees": spark.createDataFrame(
            [(1, None), (2, 1), (3, 1), (4, 2), (5, 2)], "emp_id bigint, manager_id bigint"
        ),
    }


def _ids(frame, column: str) -> list:
    return sorted((r[0] for r in frame.select(column).collect()), key=lambda v: (v is None, v))


def test_a_joined_upstream_is_read_for_the_touched_keys_rows_only(spark: SparkSession) -> None:
    frames = _frames(spark)
    # orders_enriched: customers reach an order through its customer_id.
    path = KeyPath("customers", ("customer_id",), (Hop("orders", ("customer_id",), ("order_id",)),))
    reached = reaching_rows("customers", [path], frames, [(11,), (12,)], LIMIT)
    assert reached is not None
    assert _ids(reached, "customer_id") == [1, 2]
    # An order without a customer reaches the NULL customer (more than `=` would, never less).
    reached = reaching_rows("customers", [path], frames, [(13,)], LIMIT)
    assert reached is not None
    assert _ids(reached, "customer_id") == [None]
    # A deleted key (no order has it any more) needs no customer.
    reached = reaching_rows("customers", [path], frames, [(99,)], LIMIT)
    assert reached is not None
    assert reached.count() == 0


def test_two_hops_are_walked_back_from_the_keys(spark: SparkSession) -> None:
    frames = _frames(spark)
    # Payments reach a customer through their order: payments.order_id -> orders.order_id
    # -> orders.customer_id (the target keyed by customer).
    path = KeyPath(
        "payments",
        ("order_id",),
        (Hop("orders", ("order_id",), ("customer_id",)),),
    )
    reached = reaching_rows("payments", [path], frames, [(1,), (3,)], LIMIT)
    assert reached is not None
    assert _ids(reached, "payment_id") == [100, 101, 103, 104]
    # customers -> orders -> payments, two hops: a customer reaches a payment's key.
    deep = KeyPath(
        "customers",
        ("customer_id",),
        (
            Hop("orders", ("customer_id",), ("order_id",)),
            Hop("payments", ("order_id",), ("payment_id",)),
        ),
    )
    reached = reaching_rows("customers", [deep], frames, [(102,), (104,)], LIMIT)
    assert reached is not None
    assert _ids(reached, "customer_id") == [2, 3]


def test_a_self_join_keeps_each_row_once_for_either_path(spark: SparkSession) -> None:
    frames = _frames(spark)
    # Each employee with their manager's name: a row reaches its own key and its reports'.
    own = KeyPath("employees", ("emp_id",))
    as_manager = KeyPath(
        "employees", ("emp_id",), (Hop("employees", ("manager_id",), ("emp_id",)),)
    )
    reached = reaching_rows("employees", [own, as_manager], frames, [(2,), (4,)], LIMIT)
    assert reached is not None
    # 2 and 4 themselves, and their managers 1 and 2: employee 2 once, not twice.
    assert _ids(reached, "emp_id") == [1, 2, 4]


def test_a_key_computed_from_the_walks_end(spark: SparkSession) -> None:
    frames = _frames(spark)
    # Orders keyed by their parity: customers reach parity (order_id % 2).
    path = KeyPath(
        "customers",
        ("customer_id",),
        (Hop("orders", ("customer_id",), ("order_id",)),),
        (f"{key_input(0)} % 2",),
    )
    reached = reaching_rows("customers", [path], frames, [(0,)], LIMIT)
    assert reached is not None
    # Even orders 10, 12 and 14: customers 1, 2 and 3.
    assert _ids(reached, "customer_id") == [1, 2, 3]


def test_past_the_limit_the_whole_snapshot_is_read(spark: SparkSession) -> None:
    frames = _frames(spark)
    path = KeyPath("customers", ("customer_id",), (Hop("orders", ("customer_id",), ("order_id",)),))
    # Orders 10, 11, 12 and 14 give three customer ids: more than a limit of 2.
    assert reaching_rows("customers", [path], frames, [(10,), (11,), (12,), (14,)], 2) is None
    # A path from several columns beside another: not said by one filter, read whole.
    pair = KeyPath("orders", ("order_id", "customer_id"))
    other = KeyPath("orders", ("order_id",), (Hop("orders", ("customer_id",), ("order_id",)),))
    assert reaching_rows("orders", [pair, other], frames, [(10,)], LIMIT) is None


def test_the_setting_is_off_by_default_and_a_bad_value_is_refused(spark: SparkSession) -> None:
    frames = _frames(spark)
    path = KeyPath("customers", ("customer_id",), (Hop("orders", ("customer_id",), ("order_id",)),))
    # This process's session turns it on (tests/conftest.py); restored as found.
    saved = spark.conf.get(BY_KEYS_CONF, None)
    try:
        spark.conf.unset(BY_KEYS_CONF)
        assert reaching_rows("customers", [path], frames, [(11,)], LIMIT) is None
        spark.conf.set(BY_KEYS_CONF, "false")
        assert reaching_rows("customers", [path], frames, [(11,)], LIMIT) is None
        spark.conf.set(BY_KEYS_CONF, "sometimes")
        with pytest.raises(
            TerminalError, match=r"readJoinedByKeys='sometimes' is neither true nor false"
        ):
            reaching_rows("customers", [path], frames, [(11,)], LIMIT)
        spark.conf.set(BY_KEYS_CONF, "true")
        assert reaching_rows("customers", [path], frames, [(11,)], LIMIT) is not None
    finally:
        if saved is None:
            spark.conf.unset(BY_KEYS_CONF)
        else:
            spark.conf.set(BY_KEYS_CONF, saved)
