"""Adversarial checks of computed keys in declared SQL (a key computed from one column:
``COALESCE(x, 0) AS k``, ``FLOOR(o.customer_id / 10) AS grp``): every pipeline is loaded,
run incrementally batch after batch through the production functions, and its target
compared with the same SQL recomputed over the same snapshots.

The guards (the shapes that must stay exact: NULL and a real value on one key, CASE,
non-injective expressions, hops, self-joins, HAVING, GROUP BY ALL, the plan form past
INLINE_KEYS_LIMIT, a session time zone) pass. The attacks below them are shapes the
definitions accept whose incremental batches write a wrong target with exit 0; each test
names the root cause it shows.
"""

import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.support.cycles import run_cycle
from watermark_dagster.config.pipeline import Pipeline, sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.errors import TerminalError
from watermark_dagster.store import WatermarkStore

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

Tables = dict[str, tuple[str, list[tuple]]]  # name -> (DDL schema, seed rows)
Shape = tuple[str, str, dict[str, str], list[str]]  # name, SQL, key paths, keys
Change = tuple[str, str, str | None, object]  # table, insert/update/delete, condition, values


def _apply(spark: SparkSession, root: Path, tables: Tables, change: Change) -> None:
    from delta.tables import DeltaTable

    table, kind, condition, values = change
    path = str(root / table)
    if kind == "insert":
        rows = spark.createDataFrame(values, tables[table][0])  # type: ignore[arg-type]
        rows.write.format("delta").mode("append").save(path)
    elif kind == "update":
        DeltaTable.forPath(spark, path).update(condition, values)  # type: ignore[arg-type]
    else:
        DeltaTable.forPath(spark, path).delete(condition)


def _sorted(rows: list) -> list[tuple]:
    return sorted((tuple(r) for r in rows), key=repr)


def _recomputed(spark: SparkSession, root: Path, pipeline: Pipeline) -> list[tuple]:
    assert pipeline.declared is not None
    assert pipeline.declared.sql is not None
    for table in pipeline.upstreams:
        spark.read.format("delta").load(str(root / table)).createOrReplaceTempView(table)
    return _sorted(spark.sql(pipeline.declared.sql).collect())


def _run(
    spark: SparkSession,
    tmp_path: Path,
    tables: Tables,
    shapes: list[Shape],
    rounds: list[list[Change]],
) -> list[tuple[str, int, list[tuple], list[tuple]]]:
    """Each pipeline of ``shapes`` loaded, then run incrementally after each round of
    changes; the (pipeline, round, target, recompute) of every target that differs."""
    root = tmp_path / "lake"
    for name, (schema, rows) in tables.items():
        spark.createDataFrame(rows, schema).write.format("delta").option(
            "delta.enableChangeDataFeed", "true"
        ).save(str(root / name))
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
    read = {u for p in pipelines for u in p.upstreams}
    registry = Registry(
        upstreams=[DeltaUpstream(name=t, path=str(root / t)) for t in tables if t in read],
        pipelines=pipelines,
    )
    store = WatermarkStore(str(tmp_path / "control"))
    run_cycle(spark, registry, store)  # first loads (the full SQL)
    wrong = []
    for number, changes in enumerate(rounds, start=1):
        for change in changes:
            _apply(spark, root, tables, change)
        run_cycle(spark, registry, store)
        for pipeline in pipelines:
            expected = _recomputed(spark, root, pipeline)
            columns = spark.sql(pipeline.declared.sql).columns  # type: ignore[union-attr]
            target = spark.read.format("delta").load(pipeline.target).select(*columns)
            found = _sorted(target.collect())
            if found != expected:
                wrong.append((pipeline.name, number, found, expected))
    for pipeline in pipelines:  # every batch after the load ran the derived form
        runs = [str(r.strategy) for r in store.strategy_runs(pipeline.name)]
        assert runs[-len(rounds) :] == ["incremental"] * len(rounds), (pipeline.name, runs)
    return wrong


# ----------------------------------------------------------------------------- guards

GUARD_TABLES: Tables = {
    "t": (
        "id LONG, x LONG, email STRING",
        [
            (1, 0, "ann@a"),
            (2, None, "bob@b"),
            (3, 3, "anna@a"),
            (4, 13, "cid@c"),
            (5, 23, "bob2@b"),
            (6, 5, "dee@d"),
        ],
    ),
    "orders": (
        "order_id LONG, customer_id LONG, amount LONG",
        [(10, 1, 5), (11, 1, 7), (12, 12, 4), (13, 25, 9), (14, None, 2)],
    ),
    "payments": (
        "payment_id LONG, order_id LONG, amount LONG",
        [(100, 10, 5), (101, 11, 7), (102, 12, 4), (103, 13, 9), (104, 14, 2)],
    ),
    "customers": ("customer_id LONG, name STRING", [(1, "c1"), (12, "c12"), (25, "c25")]),
    "employees": ("emp_id LONG, manager_id LONG", [(1, None), (2, 1), (11, 1), (12, 11), (21, 12)]),
}

GUARD_ROUNDS: list[list[Change]] = [
    [
        ("t", "insert", None, [(7, 0, "ann2@a")]),  # a real 0 beside the NULL mapped to 0
        ("t", "update", "id = 2", {"x": "5"}),  # NULL -> 5: leaves the 0 group
        ("t", "update", "id = 3", {"x": "13"}),  # same last digit, other tens and size
        ("t", "update", "id = 5", {"email": "'zed@z'"}),  # moves prefix group
        ("t", "delete", "id = 6", None),
        ("orders", "update", "order_id = 11", {"customer_id": "25"}),  # decade 0 -> 2
        ("payments", "insert", None, [(105, 14, 8)]),  # the NULL customer's decade
        ("payments", "delete", "payment_id = 100", None),
        ("customers", "insert", None, [(31, "c31")]),
        ("customers", "update", "customer_id = 12", {"name": "'C12'"}),
        ("employees", "update", "emp_id = 21", {"manager_id": "2"}),  # team 2's manager
    ],
    [
        ("t", "update", "id = 7", {"x": "NULL"}),  # 0 -> NULL: the same key 0
        ("t", "update", "id = 1", {"x": "NULL"}),
        ("t", "delete", "id = 4", None),
        ("t", "insert", None, [(8, None, "nul@n")]),
        ("orders", "delete", "order_id = 12", None),
        ("orders", "update", "order_id = 14", {"customer_id": "3"}),  # leaves the NULL group
        ("customers", "delete", "customer_id = 25", None),
        ("employees", "delete", "emp_id = 11", None),  # a manager leaves
        ("payments", "update", "payment_id = 103", {"amount": "90"}),
    ],
]

GUARDS: list[Shape] = [
    (  # NULL and a real 0 on one key; the key's expression selected twice
        "coalesce_zero",
        "SELECT COALESCE(x, 0) AS k, COUNT(*) AS n, SUM(id) AS ids, COALESCE(x, 0) AS k_again\n"
        "FROM t GROUP BY 1",
        {"t": "x"},
        ["k"],
    ),
    (  # CASE buckets, GROUP BY ALL, HAVING on the computed group
        "size",
        "SELECT CASE WHEN x IS NULL THEN 'none' WHEN x < 10 THEN 'small' ELSE 'big' END\n"
        "AS size, COUNT(*) AS n FROM t GROUP BY ALL HAVING MAX(id) > 2",
        {"t": "x"},
        ["size"],
    ),
    (  # two computed keys, in another order than selected: the multi-column match
        "prefix_tens",
        "SELECT SUBSTR(email, 1, 3) AS prefix, FLOOR(x / 10) AS tens, COUNT(*) AS n\n"
        "FROM t GROUP BY 1, 2",
        {"t": "x, email"},
        ["tens", "prefix"],
    ),
    (  # a computed key reached through a hop; an order moves between decades
        "paid_by_decade",
        "SELECT FLOOR(o.customer_id / 10) AS grp, SUM(p.amount) AS paid\n"
        "FROM payments p JOIN orders o ON p.order_id = o.order_id GROUP BY 1",
        {
            "orders": "customer_id",
            "payments": "payments.order_id -> orders.order_id -> orders.customer_id",
        },
        ["grp"],
    ),
    (  # computed over a column that is the other upstream's own key
        "customers_by_decade",
        "SELECT FLOOR(c.customer_id / 10) AS grp, COUNT(o.order_id) AS n, MAX(c.name) AS top\n"
        "FROM customers c LEFT JOIN orders o ON o.customer_id = c.customer_id GROUP BY 1",
        {"customers": "customer_id", "orders": "customer_id"},
        ["grp"],
    ),
    (  # a self-join: the managers' rows reach their reports' teams
        "team_managers",
        "SELECT FLOOR(e.emp_id / 10) AS team, COUNT(m.emp_id) AS managed\n"
        "FROM employees e LEFT JOIN employees m ON m.emp_id = e.manager_id GROUP BY 1",
        {"employees": "emp_id"},
        ["team"],
    ),
]


def test_computed_keys_stay_exact_batch_after_batch(spark: SparkSession, tmp_path: Path) -> None:
    assert _run(spark, tmp_path, GUARD_TABLES, GUARDS, GUARD_ROUNDS) == []


def test_computed_keys_stay_exact_when_the_touched_keys_stay_a_plan(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from watermark_dagster.read import derive

    monkeypatch.setattr(derive, "INLINE_KEYS_LIMIT", 0)
    # Composite computed keys (the plan's multi-column match); the single-key shapes in
    # plan form are tests/spark/test_declared_proofs.py's.
    shapes = [s for s in GUARDS if s[0] == "prefix_tens"]
    assert _run(spark, tmp_path, GUARD_TABLES, shapes, GUARD_ROUNDS) == []


def test_keys_computed_from_timestamps_in_a_session_time_zone(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The key's expression runs in the session's time zone for the touched keys as for
    the query: a row moved across Tokyo's midnight touches both of its days."""
    from datetime import datetime

    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
    try:
        tables: Tables = {
            "ev": (
                "id LONG, ts TIMESTAMP, v LONG",
                [(1, datetime(2024, 1, 1, 14, 30), 1), (2, datetime(2024, 1, 1, 16, 0), 2)],
            )
        }
        shapes: list[Shape] = [
            (
                "per_day",
                "SELECT CAST(ts AS DATE) AS day, SUM(v) AS v FROM ev GROUP BY 1",
                {"ev": "ts"},
                ["day"],
            ),
            (
                "per_hour",
                "SELECT DATE_FORMAT(ts, 'yyyy-MM-dd HH') AS hour, SUM(v) AS v FROM ev GROUP BY 1",
                {"ev": "ts"},
                ["hour"],
            ),
        ]
        rounds: list[list[Change]] = [
            [("ev", "update", "id = 1", {"ts": "ts + INTERVAL 2 HOURS"})],  # next Tokyo day
        ]
        assert _run(spark, tmp_path, tables, shapes, rounds) == []
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


# ---------------------------------------------------------------------------- attacks
# Each writes a wrong target with exit 0 today.


def test_a_to_char_key_touches_the_key_the_query_computes(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``TO_CHAR(x, '000')`` gives '007'; sqlglot writes the key's expression back as
    ``CAST(x AS STRING)`` ('7'), so a new row of x = 7 touches key '7', the cut-down view
    holds no row of '007', and the target keeps n = 1 where the SQL gives 2.
    Root cause: key_inference._computed_keys.computed_key renders the expression with
    sqlglot's Spark generator, which is not a faithful round trip (TO_CHAR's format is
    dropped)."""
    tables: Tables = {"t": ("id LONG, x LONG", [(1, 7), (2, 12)])}
    shape: Shape = (
        "codes",
        "SELECT TO_CHAR(x, '000') AS code, COUNT(*) AS n FROM t GROUP BY 1",
        {"t": "x"},
        ["code"],
    )
    assert _run(spark, tmp_path, tables, [shape], [[("t", "insert", None, [(3, 7)])]]) == []


def test_a_date_format_key_with_a_quoted_literal(spark: SparkSession, tmp_path: Path) -> None:
    """``DATE_FORMAT(ts, 'yyyy''Q''Q')`` is '2024Q1' in Spark (a quote doubled inside a
    literal); sqlglot reads the literal as three adjacent ones and writes back
    ``CONCAT('yyyy', 'Q', 'Q')`` = 'yyyyQQ', which formats '202401': the batch touches a
    key no row has and the quarter's row stays stale (same root cause)."""
    from datetime import datetime

    tables: Tables = {
        "ev": (
            "id LONG, ts TIMESTAMP, v LONG",
            [(1, datetime(2024, 2, 1), 1), (2, datetime(2024, 5, 1), 2)],
        )
    }
    shape: Shape = (
        "per_quarter",
        "SELECT DATE_FORMAT(ts, 'yyyy''Q''Q') AS quarter, SUM(v) AS v FROM ev GROUP BY 1",
        {"ev": "ts"},
        ["quarter"],
    )
    rounds: list[list[Change]] = [[("ev", "insert", None, [(3, datetime(2024, 3, 1), 10)])]]
    assert _run(spark, tmp_path, tables, [shape], rounds) == []


def test_a_log10_bucket_key(spark: SparkSession, tmp_path: Path) -> None:
    """``FLOOR(LOG10(amount))`` is written back as ``FLOOR(LOG(10, amount))``: for 1000
    that is FLOOR(2.9999999999999996) = 2, not 3. A new payment of 1000 touches bucket 2
    and bucket 3 keeps its old count (same root cause)."""
    tables: Tables = {"p": ("id LONG, amount LONG", [(1, 1000), (2, 5000), (3, 150)])}
    shape: Shape = (
        "magnitudes",
        "SELECT FLOOR(LOG10(amount)) AS magnitude, COUNT(*) AS n FROM p GROUP BY 1",
        {"p": "amount"},
        ["magnitude"],
    )
    assert _run(spark, tmp_path, tables, [shape], [[("p", "insert", None, [(4, 1000)])]]) == []


def test_a_to_date_format_dropped_when_ansi_is_off(spark: SparkSession, tmp_path: Path) -> None:
    """``TO_DATE(s, 'yyyy-MM-dd')`` is written back as ``TO_DATE(s)``. With
    spark.sql.ansi.enabled=false (a common setting) the query maps '2024-1-5' to NULL and
    the template to 2024-01-05: a change to that row touches the wrong key and the NULL
    group keeps its old count (same root cause)."""
    ansi = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        tables: Tables = {"raw": ("id LONG, s STRING", [(1, "2024-01-05"), (2, "2024-1-5")])}
        shape: Shape = (
            "per_date",
            "SELECT TO_DATE(s, 'yyyy-MM-dd') AS day, COUNT(*) AS n FROM raw GROUP BY 1",
            {"raw": "s"},
            ["day"],
        )
        rounds: list[list[Change]] = [[("raw", "insert", None, [(3, "2024-1-5")])]]
        assert _run(spark, tmp_path, tables, [shape], rounds) == []
    finally:
        spark.conf.set("spark.sql.ansi.enabled", ansi)


def test_a_week_year_key_under_the_legacy_time_parser(spark: SparkSession, tmp_path: Path) -> None:
    """``DATE_FORMAT(ts, 'YYYY')`` (week-based year; 2024-12-30 is in 2025) is written back
    as 'yyyy' (calendar year). Under spark.sql.legacy.timeParserPolicy=LEGACY the query
    runs, and a row on 2024-12-30 touches '2024', not its key '2025' (same root cause)."""
    from datetime import datetime

    policy = spark.conf.get("spark.sql.legacy.timeParserPolicy")
    spark.conf.set("spark.sql.legacy.timeParserPolicy", "LEGACY")
    try:
        tables: Tables = {
            "ev": (
                "id LONG, ts TIMESTAMP, v LONG",
                [(1, datetime(2024, 12, 30, 12), 1), (2, datetime(2024, 6, 1), 2)],
            )
        }
        shape: Shape = (
            "per_week_year",
            "SELECT DATE_FORMAT(ts, 'YYYY') AS week_year, SUM(v) AS v FROM ev GROUP BY 1",
            {"ev": "ts"},
            ["week_year"],
        )
        rounds: list[list[Change]] = [
            [("ev", "insert", None, [(3, datetime(2024, 12, 31, 12), 5)])]
        ]
        assert _run(spark, tmp_path, tables, [shape], rounds) == []
    finally:
        spark.conf.set("spark.sql.legacy.timeParserPolicy", policy)


# A key class whose columns are equal under the query's `=` but not of one type: the key's
# expression is applied to each path's own end column, whose type differs from the one
# the query computed the key from.
MIXED_TYPES = [
    pytest.param(
        {
            "orders": ("order_id LONG, zip STRING", [(1, "07"), (2, "12")]),
            "payments": ("payment_id LONG, zip LONG, amount LONG", [(10, 7, 5), (11, 12, 3)]),
        },
        (
            "paid_per_zip",
            "SELECT TRIM(o.zip) AS zip, SUM(p.amount) AS total\n"
            "FROM orders o JOIN payments p ON p.zip = o.zip GROUP BY 1",
            {"orders": "zip", "payments": "zip"},
            ["zip"],
        ),
        [("payments", "insert", None, [(12, 7, 100)])],  # touches TRIM(7) = '7', not '07'
        id="join-string-with-long",
    ),
    pytest.param(
        {
            "a": ("id LONG, x INT", [(1, 7)]),
            "b": ("id LONG, y DOUBLE", [(1, 7.0)]),
        },
        (
            "per_value",
            "SELECT CAST(u.x AS STRING) AS k, COUNT(*) AS n\n"
            "FROM (SELECT x FROM a UNION ALL SELECT y AS x FROM b) u GROUP BY 1",
            {"a": "x", "b": "y"},
            ["k"],
        ),
        [("a", "insert", None, [(2, 7)])],  # the union widens x to DOUBLE: '7.0', not '7'
        id="union-widens-int-to-double",
    ),
    pytest.param(
        {
            "orders": ("order_id LONG, x DOUBLE", [(1, 0.0)]),
            "payments": ("payment_id LONG, x DOUBLE, amount LONG", [(10, 0.0, 5)]),
        },
        (
            "paid_per_x",
            "SELECT CAST(o.x AS STRING) AS k, SUM(p.amount) AS total\n"
            "FROM orders o JOIN payments p ON p.x = o.x GROUP BY 1",
            {"orders": "x", "payments": "x"},
            ["k"],
        ),
        [("payments", "insert", None, [(11, -0.0, 100)])],  # -0.0 = 0.0, but '-0.0'
        id="negative-zero",
    ),
]


@pytest.mark.parametrize(("tables", "shape", "changes"), MIXED_TYPES)
def test_a_key_class_whose_columns_differ_in_type(
    spark: SparkSession, tmp_path: Path, tables: Tables, shape: Shape, changes: list[Change]
) -> None:
    """infer() gives every reference in the key's class the same template
    (KeyPath.computed), and reach.with_keys evaluates it on that reference's own column.
    Equal under `=` (with Spark's coercions, -0.0 = 0.0) is not equal under the
    expression: the change touched a key the query never produces, and the batch wrote a
    stale target. Such a class is now refused by the batch, before anything is written."""
    with pytest.raises(TerminalError, match="computed from columns the query holds equal"):
        _run(spark, tmp_path, tables, [shape], [changes])


@pytest.mark.parametrize(
    ("column", "shape"),
    [
        pytest.param(
            "ts TIMESTAMP",
            (
                "per_local_time",
                "SELECT CAST(ts AS TIMESTAMP_NTZ) AS local_ts, SUM(v) AS v FROM ev GROUP BY 1",
                {"ev": "ts"},
                ["local_ts"],
            ),
            id="computed",
        ),
        pytest.param(
            "ts TIMESTAMP_NTZ",
            ("per_local_time", "SELECT ts, SUM(v) AS v FROM ev GROUP BY ts", {"ev": "ts"}, ["ts"]),
            id="plain",
        ),
    ],
)
def test_a_timestamp_ntz_key_with_the_driver_outside_utc(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    column: str,
    shape: Shape,
) -> None:
    """With the driver in New York and the session in UTC (the default), a TIMESTAMP_NTZ
    key collected to the driver comes back as a naive datetime, and ``Column.isin`` makes
    it a TIMESTAMP literal read in the driver's zone (10:00 -> 15:00Z), which equals no
    NTZ value. An update of v = 1 touches 10:00; the cut-down view and the recomputed rows
    hold nothing for it, so the batch DELETES the key's row.
    Root cause: key_values._one_of (used by where_in / _where_keys / changes_for_values /
    flag_untouched) writes collected TIMESTAMP_NTZ values as TIMESTAMP literals;
    key_values.collected keeps NTZ values naive. Plain NTZ keys hit it too; the plan form
    (past INLINE_KEYS_LIMIT) does not."""
    from datetime import datetime

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        tables: Tables = {
            "ev": (
                f"id LONG, {column}, v LONG",
                [(1, datetime(2024, 1, 1, 10), 1), (2, datetime(2024, 1, 1, 11), 2)],
            )
        }
        rounds: list[list[Change]] = [[("ev", "update", "id = 1", {"v": "10"})]]
        assert _run(spark, tmp_path, tables, [shape], rounds) == []
    finally:
        monkeypatch.undo()
        time.tzset()
