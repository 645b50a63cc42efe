"""Shapes of declared SQL that wrote wrong targets (a self-join, a join on a column other
than the one declared) or were refused though exact (an aggregate through a hop, a
renamed key column, the latest row per key), each run incrementally batch after batch
with inserts, updates and deletes that exercise it: every target equals the same SQL
recomputed over the upstreams. tests/unit/test_declared_proofs.py holds the refusals."""

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from tests.support.cycles import run_cycle
from watermark_dagster.config.pipeline import Pipeline, sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.observe.observer import Observer
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.spark

_LONG = T.LongType()
SCHEMAS = {
    "employees": [("emp_id", _LONG), ("name", T.StringType()), ("manager_id", _LONG)],
    "customers": [("customer_id", _LONG), ("name", T.StringType())],
    "orders": [("order_id", _LONG), ("customer_id", _LONG), ("referrer_id", _LONG)],
    "payments": [("payment_id", _LONG), ("order_id", _LONG), ("amount", _LONG)],
    "updates": [("update_id", _LONG), ("customer_id", _LONG), ("amount", _LONG), ("ts", _LONG)],
}

SEED = {
    # Ann (1) manages Bob (2) and Cid (3); Bob manages Dee (4) and Eve (5).
    "employees": [(1, "Ann", None), (2, "Bob", 1), (3, "Cid", 1), (4, "Dee", 2), (5, "Eve", 2)],
    "customers": [(1, "c1"), (2, "c2"), (3, "c3"), (4, "c4")],
    "orders": [(10, 1, 2), (11, 1, 3), (12, 2, 1), (13, 3, None), (14, 4, 2)],
    "payments": [(100, 10, 5), (101, 10, 7), (102, 11, 1), (103, 12, 4), (104, 14, 9)],
    "updates": [(1, 1, 10, 1), (2, 1, 11, 2), (3, 2, 20, 1), (4, 3, 30, 5), (5, 3, 31, 4)],
}

# Each round: (table, SQL condition or None for inserts, assignments or rows).
ROUNDS = [
    [
        ("employees", "update", "emp_id = 2", {"name": "'Bobby'"}),  # a manager renamed
        ("employees", "update", "emp_id = 5", {"manager_id": "3"}),  # a report moves
        ("employees", "insert", None, [(6, "Fay", 3)]),
        ("customers", "update", "customer_id = 2", {"name": "'c2-renamed'"}),  # a referrer
        ("customers", "insert", None, [(6, "C1")]),  # joins c1's group by LOWER(name)
        ("orders", "update", "order_id = 11", {"customer_id": "2"}),  # moves its payments
        ("payments", "delete", "payment_id = 100", None),
        ("payments", "insert", None, [(105, 13, 6)]),
        ("updates", "insert", None, [(6, 1, 12, 3)]),  # a newer row for customer 1
        ("updates", "delete", "update_id = 4", None),  # customer 3's latest goes
    ],
    [
        ("employees", "delete", "emp_id = 2", None),  # a manager leaves: reports orphaned
        ("employees", "update", "emp_id = 1", {"name": "'Annie'"}),
        ("customers", "delete", "customer_id = 3", None),
        ("customers", "insert", None, [(5, "c5")]),
        ("orders", "update", "order_id = 13", {"referrer_id": "5"}),  # leaves the NULL group
        ("customers", "update", "customer_id = 1", {"name": "'C2-RENAMED'"}),  # c1 -> c2-renamed
        ("orders", "delete", "order_id = 14", None),  # its payment reaches no customer
        ("payments", "update", "payment_id = 102", {"amount": "50"}),
        ("updates", "update", "update_id = 6", {"ts": "0"}),  # no longer the latest
    ],
]

# Keys computed from one column, as (name, SQL, key paths as declared, keys).
COMPUTED_KEYS = [
    # Class 3: a key computed from one column under its own name. Each change touches
    # the key its before- and after-image compute: the NULL group is -1 here.
    (
        "per_referrer",
        "SELECT COALESCE(referrer_id, -1) AS referrer_id, COUNT(*) AS n\nFROM orders GROUP BY 1",
        {"orders": "referrer_id"},
        ["referrer_id"],
    ),
    (  # the same, computed in a WITH query and carried out of it
        "per_referrer_with",
        "WITH q AS (SELECT COALESCE(referrer_id, -1) AS referrer_id, COUNT(*) AS n\n"
        "FROM orders GROUP BY 1) SELECT q.referrer_id, q.n FROM q",
        {"orders": "referrer_id"},
        ["referrer_id"],
    ),
    (
        "per_name",
        "SELECT LOWER(name) AS name, COUNT(*) AS n FROM customers GROUP BY LOWER(name)",
        {"customers": "name"},
        ["name"],
    ),
    # GROUP BY an expression, reached through a hop: a payment's order moves between
    # the groups of its customer's parity.
    (
        "paid_by_parity",
        "SELECT o.customer_id % 2 AS parity, SUM(p.amount) AS total\n"
        "FROM payments p JOIN orders o ON p.order_id = o.order_id\n"
        "GROUP BY o.customer_id % 2",
        {
            "orders": "customer_id",
            "payments": "payments.order_id -> orders.order_id -> orders.customer_id",
        },
        ["parity"],
    ),
]

# (name, SQL, key paths as declared, keys)
PIPELINES = [
    # Class 1: an upstream joined to itself. A renamed manager must reach their reports.
    (
        "manager_names",
        "SELECT e.emp_id, e.name, m.name AS manager_name\n"
        "FROM employees e LEFT JOIN employees m ON e.manager_id = m.emp_id",
        {"employees": "emp_id"},
        ["emp_id"],
    ),
    (
        "reports",
        "SELECT m.emp_id, m.name, COUNT(e.emp_id) AS reports\n"
        "FROM employees m LEFT JOIN employees e ON e.manager_id = m.emp_id\n"
        "GROUP BY m.emp_id, m.name",
        {"employees": "emp_id"},
        ["emp_id"],
    ),
    # Class 2, declared as the query joins: the referrer's name, not the buyer's.
    (
        "referrers",
        "SELECT o.order_id, c.name AS referrer FROM orders o\n"
        "JOIN customers c ON c.customer_id = o.referrer_id",
        {
            "orders": "order_id",
            "customers": "customers.customer_id -> orders.referrer_id -> orders.order_id",
        },
        ["order_id"],
    ),
    # Refused before though exact: payments summed per customer through orders.
    (
        "paid_derived",
        "SELECT c.customer_id, COALESCE(t.total, 0) AS total FROM customers c LEFT JOIN\n"
        "(SELECT o.customer_id, SUM(p.amount) AS total FROM payments p JOIN orders o\n"
        "ON p.order_id = o.order_id GROUP BY o.customer_id) t ON t.customer_id = c.customer_id",
        {
            "customers": "customer_id",
            "orders": "customer_id",
            "payments": "payments.order_id -> orders.order_id -> orders.customer_id",
        },
        ["customer_id"],
    ),
    (
        "paid_scalar",
        "SELECT c.customer_id, (SELECT SUM(p.amount) FROM payments p JOIN orders o\n"
        "ON p.order_id = o.order_id WHERE o.customer_id = c.customer_id) AS total\n"
        "FROM customers c",
        {
            "customers": "customer_id",
            "orders": "customer_id",
            "payments": "payments.order_id -> orders.order_id -> orders.customer_id",
        },
        ["customer_id"],
    ),
    (
        "orders_per_customer",
        "SELECT customer_id AS buyer, COUNT(*) AS n FROM orders GROUP BY customer_id",
        {"orders": "customer_id"},
        ["buyer"],
    ),
    (
        "latest",
        "SELECT customer_id, amount FROM (SELECT *, ROW_NUMBER() OVER\n"
        "(PARTITION BY customer_id ORDER BY ts DESC) AS rn FROM updates) WHERE rn = 1",
        {"updates": "customer_id"},
        ["customer_id"],
    ),
    (
        "latest_qualify",
        "SELECT customer_id, amount FROM updates\n"
        "QUALIFY ROW_NUMBER() OVER (PARTITION BY customer_id ORDER BY ts DESC) = 1",
        {"updates": "customer_id"},
        ["customer_id"],
    ),
    *COMPUTED_KEYS,
]


def _schema(table: str) -> T.StructType:
    return T.StructType([T.StructField(n, t, True) for n, t in SCHEMAS[table]])


def _apply(spark: SparkSession, root: Path, change: tuple) -> None:
    from delta.tables import DeltaTable

    table, kind, condition, values = change
    path = str(root / table)
    if kind == "insert":
        spark.createDataFrame(values, _schema(table)).write.format("delta").mode("append").save(
            path
        )
    elif kind == "update":
        DeltaTable.forPath(spark, path).update(condition, values)
    else:
        DeltaTable.forPath(spark, path).delete(condition)


def _recomputed(spark: SparkSession, root: Path, pipeline: Pipeline) -> list[tuple]:
    assert pipeline.declared is not None
    assert pipeline.declared.sql is not None
    for table in pipeline.upstreams:
        spark.read.format("delta").load(str(root / table)).createOrReplaceTempView(table)
    frame = spark.sql(pipeline.declared.sql)
    return sorted((tuple(r) for r in frame.collect()), key=repr)


def _target(spark: SparkSession, pipeline: Pipeline, columns: list[str]) -> list[tuple]:
    frame = spark.read.format("delta").load(pipeline.target).select(*columns)
    return sorted((tuple(r) for r in frame.collect()), key=repr)


def test_proven_shapes_equal_a_recompute_batch_after_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    registry = _run_rounds(spark, tmp_path, PIPELINES)
    # The self-joins follow a second path through the managers' rows, so the employees'
    # view is not cut down to the touched keys.
    reports = registry.pipelines["manager_names"].declared
    assert reports is not None
    assert reports.inferred is not None
    assert [str(p) for p in reports.inferred["employees"]] == [
        "emp_id",
        "employees.emp_id -> employees.manager_id -> employees.emp_id",
    ]
    # A computed key is followed to its column, then computed as the query does.
    per_referrer = registry.pipelines["per_referrer"].declared
    assert per_referrer is not None
    assert per_referrer.inferred is not None
    assert [str(p) for p in per_referrer.inferred["orders"]] == [
        "referrer_id => COALESCE(referrer_id, -1)"
    ]


def test_computed_keys_equal_a_recompute_when_the_touched_keys_stay_a_plan(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past INLINE_KEYS_LIMIT the touched keys are joined as a plan (_derived_by_joins):
    the keys computed from their columns there too."""
    from watermark_dagster.read import derive

    monkeypatch.setattr(derive, "INLINE_KEYS_LIMIT", 0)
    _run_rounds(spark, tmp_path, COMPUTED_KEYS)


def _run_rounds(spark: SparkSession, tmp_path: Path, shapes: list[tuple]) -> Registry:
    """Every pipeline of ``shapes`` run incrementally through the rounds, each target
    compared with its SQL recomputed after every round."""
    root = tmp_path / "lake"
    for table, rows in SEED.items():
        spark.createDataFrame(rows, _schema(table)).write.format("delta").option(
            "delta.enableChangeDataFeed", "true"
        ).save(str(root / table))
    pipelines = [
        sql_pipeline(
            name=name,
            sql=sql,
            upstreams=paths,
            keys=keys,
            target=str(tmp_path / "targets" / name),
            strategy="incremental",  # the derived form, however small the tables
        )
        for name, sql, paths, keys in shapes
    ]
    registry = Registry(
        upstreams=[DeltaUpstream(name=t, path=str(root / t)) for t in SEED],
        pipelines=pipelines,
    )
    store = WatermarkStore(str(tmp_path / "control"))
    run_cycle(spark, registry, store)  # first loads
    for number, changes in enumerate(ROUNDS, start=1):
        for change in changes:
            _apply(spark, root, change)
        run_cycle(spark, registry, store)
        for pipeline in pipelines:
            expected = _recomputed(spark, root, pipeline)
            columns = spark.sql(pipeline.declared.sql).columns  # type: ignore[union-attr]
            assert _target(spark, pipeline, columns) == expected, (pipeline.name, number)
    # Every batch after the first load ran the derived (incremental) form.
    for pipeline in pipelines:
        strategies = [str(r.strategy) for r in store.strategy_runs(pipeline.name)]
        assert strategies[-len(ROUNDS) :] == ["incremental"] * len(ROUNDS), (pipeline.name,)
    return registry


def test_a_full_batch_finds_the_keys_a_wrong_derivation_left_stale(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deliberately wrong incremental derivation (a test-only hook: the touched keys lose
    customer 2's orders) leaves two target rows stale with exit 0. The next full batch
    counts exactly those as drift, though its own changes touched neither, says which, and
    writes the correct rows."""
    from watermark_dagster.dagster_defs.health_drift import drift_result
    from watermark_dagster.operations.coordinate import look_before_planning, plan_next
    from watermark_dagster.operations.run_pipeline import execute_pipeline
    from watermark_dagster.read import derive

    root = tmp_path / "lake"
    for table in ("customers", "orders"):
        spark.createDataFrame(SEED[table], _schema(table)).write.format("delta").option(
            "delta.enableChangeDataFeed", "true"
        ).save(str(root / table))
    sql = (
        "SELECT o.order_id, c.name FROM orders o JOIN customers c ON c.customer_id = o.customer_id"
    )
    paths = {
        "orders": "order_id",
        "customers": "customers.customer_id -> orders.customer_id -> orders.order_id",
    }

    def registry(strategy: str) -> Registry:
        pipeline = sql_pipeline(
            name="named",
            sql=sql,
            upstreams=paths,
            keys=["order_id"],
            target=str(tmp_path / "targets" / "named"),
            strategy=strategy,
        )
        upstreams = [DeltaUpstream(name=t, path=str(root / t)) for t in ("customers", "orders")]
        return Registry(upstreams=upstreams, pipelines=[pipeline])

    store = WatermarkStore(str(tmp_path / "control"))
    run_cycle(spark, registry("incremental"), store)  # the first load
    touched = derive._touched_values

    def dropping(*args, **kwargs):
        values = touched(*args, **kwargs)
        return None if values is None else [v for v in values if v[0] not in (10, 11)]

    # Customers 1 and 2 are renamed; the derivation "forgets" customer 1's orders 10, 11.
    _apply(spark, root, ("customers", "update", "customer_id IN (1, 2)", {"name": "'new'"}))
    monkeypatch.setattr(derive, "_touched_values", dropping)
    run_cycle(spark, registry("incremental"), store)
    monkeypatch.setattr(derive, "_touched_values", touched)
    stale = {
        r["order_id"]: r["name"]
        for r in spark.read.format("delta").load(str(tmp_path / "targets" / "named")).collect()
    }
    assert (stale[10], stale[11], stale[12]) == ("c1", "c1", "new")  # drifted, exit 0

    # A full batch for an unrelated change (customer 4 renamed: order 14).
    _apply(spark, root, ("customers", "update", "customer_id = 4", {"name": "'four'"}))
    full = registry("full")
    look = look_before_planning(full, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None
    outcome = execute_pipeline(
        spark=spark, store=store, registry=full, pipeline_name="named", batch_id=batch.batch_id
    )
    assert outcome.write is not None
    assert outcome.write.drift == 2  # orders 10 and 11; not 14, which the batch touched
    assert outcome.write.drift_sample == ({"order_id": 10}, {"order_id": 11})
    assert outcome.write.rows_updated == 3
    assert _target(spark, full.pipelines["named"], ["order_id", "name"]) == _recomputed(
        spark, root, full.pipelines["named"]
    )
    passed, description, _ = drift_result(
        "named", {"drift_keys": 2, "batch_id": batch.batch_id, "drift_keys_sample": [10, 11]}
    )
    assert not passed
    assert f"its full batch {batch.batch_id} found 2 key(s)" in description


def test_a_full_batch_refuses_a_key_its_transform_gives_twice(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A second row for customer 1 makes the join give orders 10 and 11 twice, one of the
    two rows equal to what the target holds. The diff used to keep only the differing one
    and write it with exit 0; a full batch now refuses it as an incremental batch does."""
    from watermark_dagster.errors import TerminalError

    root = tmp_path / "lake"
    for table in ("customers", "orders"):
        spark.createDataFrame(SEED[table], _schema(table)).write.format("delta").option(
            "delta.enableChangeDataFeed", "true"
        ).save(str(root / table))
    pipeline = sql_pipeline(
        name="named",
        sql="SELECT o.order_id, c.name FROM orders o JOIN customers c "
        "ON c.customer_id = o.customer_id",
        upstreams={
            "orders": "order_id",
            "customers": "customers.customer_id -> orders.customer_id -> orders.order_id",
        },
        keys=["order_id"],
        target=str(tmp_path / "targets" / "named"),
        strategy="full",
    )
    registry = Registry(
        upstreams=[DeltaUpstream(name=t, path=str(root / t)) for t in ("customers", "orders")],
        pipelines=[pipeline],
    )
    store = WatermarkStore(str(tmp_path / "control"))
    run_cycle(spark, registry, store)
    before = _target(spark, pipeline, ["order_id", "name"])
    _apply(spark, root, ("customers", "insert", None, [(1, "twin")]))
    with pytest.raises(TerminalError, match=r"several rows for key \{'order_id': 1[01]\}"):
        run_cycle(spark, registry, store)
    assert _target(spark, pipeline, ["order_id", "name"]) == before  # nothing written


def test_timestamp_keys_of_a_repeated_hour_stay_apart(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the driver in New York, 05:30Z and 06:30Z on 2024-11-03 are both 01:30 local.
    PySpark collects a TIMESTAMP as a naive local datetime and writes one back ignoring its
    fold, so the touched key of the 06:30Z row went back as 05:30Z: that row was never
    rewritten (found by an adversarial review; target v = {1, 2}, recompute {1, 20})."""
    import time
    from datetime import UTC, datetime

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        root = tmp_path / "lake"
        rows = [(datetime(2024, 11, 3, h, 30, tzinfo=UTC), v) for h, v in ((5, 1), (6, 2))]
        spark.createDataFrame(rows, "ts TIMESTAMP, v LONG").write.format("delta").option(
            "delta.enableChangeDataFeed", "true"
        ).save(str(root / "ev"))
        pipeline = sql_pipeline(
            name="events",
            sql="SELECT ts, v FROM ev",
            upstreams={"ev": "ts"},
            keys=["ts"],
            target=str(tmp_path / "targets" / "events"),
            strategy="incremental",
        )
        registry = Registry(
            upstreams=[DeltaUpstream(name="ev", path=str(root / "ev"))], pipelines=[pipeline]
        )
        store = WatermarkStore(str(tmp_path / "control"))
        run_cycle(spark, registry, store)
        _apply(spark, root, ("ev", "update", "v = 2", {"v": "20"}))
        run_cycle(spark, registry, store)
        target = spark.read.format("delta").load(pipeline.target)
        found = sorted(tuple(r) for r in target.selectExpr("unix_micros(ts)", "v").collect())
        start = int(datetime(2024, 11, 3, 5, 30, tzinfo=UTC).timestamp()) * 1_000_000
        assert found == [(start, 1), (start + 3_600_000_000, 20)], found
    finally:
        monkeypatch.undo()
        time.tzset()
