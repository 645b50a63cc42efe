"""Declared SQL is accepted only when the query proves its incremental form: the eight
classes of shapes that wrote wrong targets with exit 0 are refused when the definitions
load (naming the line and a fix), or accepted with the key paths that make them exact
(tests/spark/test_declared_proofs.py runs those against a recompute). No JVM."""

from dataclasses import replace

import pytest

from watermark_dagster.config.declared import describe, paths_for_batch
from watermark_dagster.config.key_paths import Hop, KeyPath, key_input
from watermark_dagster.config.pipeline import Pipeline, sql_pipeline
from watermark_dagster.errors import ConfigurationError

BY_CUSTOMER = "customers.customer_id -> orders.customer_id -> orders.order_id"


def _load(sql: str, upstreams: dict[str, str], keys: list[str]) -> Pipeline:
    return sql_pipeline(name="p", sql=sql, upstreams=upstreams, target="/lake/p", keys=keys)


def _refused(sql: str, upstreams: dict[str, str], keys: list[str]) -> str:
    with pytest.raises(ConfigurationError) as caught:
        _load(sql, upstreams, keys)
    message = str(caught.value)
    assert message.startswith("Pipeline 'p': its SQL (line "), message
    assert "Fix: " in message, message
    return message


# (id, sql, upstreams, keys, what the refusal says, the SQL line it names)
REFUSED = [
    # 1. A recursive walk over one upstream's rows.
    (
        "recursive-cte",
        "WITH RECURSIVE chain AS (SELECT emp_id, manager_id FROM employees\n"
        "UNION ALL SELECT e.emp_id, c.manager_id FROM employees e JOIN chain c "
        "ON e.manager_id = c.emp_id)\nSELECT emp_id, manager_id FROM chain",
        {"employees": "emp_id"},
        ["emp_id"],
        "uses WITH RECURSIVE",
        1,
    ),
    # 2. A join or correlation on a column other than the declared path.
    (
        "join-on-another-column",
        "SELECT o.order_id, c.name\nFROM orders o\n"
        "JOIN customers c ON c.customer_id = o.referrer_id",
        {"orders": "order_id", "customers": BY_CUSTOMER},
        ["order_id"],
        "relates upstream 'customers' to the target keys as 'customers.customer_id -> "
        "orders.referrer_id -> orders.order_id', but its declared key path is '" + BY_CUSTOMER,
        3,
    ),
    (
        "join-on-expressions",
        "SELECT o.order_id, c.name FROM orders o\n"
        "JOIN customers c ON LOWER(o.email) = LOWER(c.email)",
        {"orders": "order_id", "customers": BY_CUSTOMER},
        ["order_id"],
        "reads upstream 'customers' (as 'c') with no equality between columns",
        2,
    ),
    (
        "exists-on-another-column",
        "SELECT o.order_id FROM orders o WHERE EXISTS\n"
        "(SELECT 1 FROM customers c WHERE c.email = o.email)",
        {"orders": "order_id", "customers": BY_CUSTOMER},
        ["order_id"],
        "relates upstream 'customers' to the target keys as 'customers.email -> "
        "orders.email -> orders.order_id'",
        2,
    ),
    (
        "in-on-another-column",
        "SELECT o.order_id FROM orders o\n"
        "WHERE o.referrer_id IN (SELECT c.customer_id FROM customers c)",
        {"orders": "order_id", "customers": BY_CUSTOMER},
        ["order_id"],
        "orders.referrer_id -> orders.order_id', but its declared key path",
        2,
    ),
    (
        "semi-join-on-another-column",
        "SELECT o.order_id FROM orders o\n"
        "LEFT SEMI JOIN customers c ON c.customer_id = o.referrer_id",
        {"orders": "order_id", "customers": BY_CUSTOMER},
        ["order_id"],
        "orders.referrer_id -> orders.order_id', but its declared key path",
        2,
    ),
    # 3. A key produced by an expression under its own name: derived when it computes the
    # key from one column (ACCEPTED below), refused when no change names its keys.
    (
        "key-from-two-columns",
        "SELECT CONCAT(first_name, last_name) AS full_name, COUNT(*) AS n\n"
        "FROM customers GROUP BY 1",
        {"customers": "first_name"},
        ["full_name"],
        "computes the key column 'full_name' from several columns",
        1,
    ),
    (
        "key-computed-in-a-set-operation",
        "SELECT k, COUNT(*) AS n FROM (SELECT DATE(created_at) AS k FROM orders\n"
        "UNION ALL SELECT DATE(shipped_at) FROM orders) u GROUP BY k",
        {"orders": "created_at"},
        ["k"],
        "computes the key column 'k' in a derived table, a WITH query or a set",
        1,
    ),
    (
        "key-computed-from-the-optional-side",
        "SELECT COALESCE(c.region_id, -1) AS region_id, COUNT(*) AS n\n"
        "FROM orders o LEFT JOIN customers c ON o.customer_id = c.customer_id GROUP BY 1",
        {
            "orders": "orders.customer_id -> customers.customer_id -> customers.region_id",
            "customers": "region_id",
        },
        ["region_id"],
        "takes the key column 'region_id' from the optional side of an outer join",
        1,
    ),
    (
        "key-by-a-window",
        "SELECT ROW_NUMBER() OVER (PARTITION BY customer_id ORDER BY order_id)\n"
        "AS position FROM orders",
        {"orders": "customer_id"},
        ["position"],
        "computes the key column 'position' with a window",
        1,
    ),
    (
        "key-by-a-generator",
        "SELECT explode(tags) AS tag, COUNT(*) AS n FROM orders GROUP BY 1",
        {"orders": "tags"},
        ["tag"],
        "computes the key column 'tag' with EXPLODE, which makes several rows",
        1,
    ),
    (
        "key-by-an-unknown-function",
        "SELECT my_bucket(amount) AS bucket, COUNT(*) AS n FROM orders GROUP BY 1",
        {"orders": "amount"},
        ["bucket"],
        "computes the key column 'bucket' with my_bucket, a function this analysis does not",
        1,
    ),
    (
        "key-by-a-subquery",
        "SELECT (SELECT MAX(o2.order_id) FROM orders o2 WHERE o2.order_id = o.order_id)\n"
        "AS last_id FROM orders o",
        {"orders": "order_id"},
        ["last_id"],
        "computes the key column 'last_id' with a subquery",
        1,
    ),
    # 4. NOT IN over a column that may hold NULL.
    (
        "not-in",
        "SELECT o.order_id FROM orders o\n"
        "WHERE o.customer_id NOT IN (SELECT b.customer_id FROM blocked b)",
        {
            "orders": "order_id",
            "blocked": "blocked.customer_id -> orders.customer_id -> orders.order_id",
        },
        ["order_id"],
        "uses NOT IN (subquery)",
        2,
    ),
    # 5. An outer join grouped by, or keyed on, its nullable side.
    (
        "left-join-grouped-by-its-right-side",
        "SELECT c.customer_id, SUM(o.amount) AS total\n"
        "FROM orders o LEFT JOIN customers c ON o.customer_id = c.customer_id\n"
        "GROUP BY c.customer_id",
        {"orders": "customer_id", "customers": "customer_id"},
        ["customer_id"],
        "takes the key column 'customer_id' from the optional side of an outer join",
        1,
    ),
    (
        "right-join-keyed-on-its-left-side",
        "SELECT o.order_id, c.name FROM orders o RIGHT JOIN customers c "
        "ON o.customer_id = c.customer_id",
        {"orders": "order_id", "customers": BY_CUSTOMER},
        ["order_id"],
        "takes the key column 'order_id' from the optional side of an outer join",
        1,
    ),
    (
        "full-join",
        "SELECT a.customer_id, a.total, b.refunded FROM totals a FULL JOIN refunds b "
        "ON a.customer_id = b.customer_id",
        {"totals": "customer_id", "refunds": "customer_id"},
        ["customer_id"],
        "takes the key column 'customer_id' from the optional side of an outer join",
        1,
    ),
    # 6. "Correlation" by an equality inside CASE, OR or NOT.
    (
        "correlated-inside-case",
        "SELECT c.customer_id,\n(SELECT SUM(CASE WHEN p.customer_id = c.customer_id "
        "THEN p.amount END) / SUM(p.amount) FROM payments p) AS share\nFROM customers c",
        {"customers": "customer_id", "payments": "customer_id"},
        ["customer_id"],
        "reads upstream 'payments' (as 'p', in a subquery) with no equality",
        2,
    ),
    (
        "correlated-inside-or",
        "SELECT c.customer_id FROM customers c WHERE EXISTS (SELECT 1 FROM payments p\n"
        "WHERE p.customer_id = c.customer_id OR p.amount > 100)",
        {"customers": "customer_id", "payments": "customer_id"},
        ["customer_id"],
        "reads upstream 'payments' (as 'p', in a subquery) with no equality",
        1,
    ),
    (
        "correlated-inside-not",
        "SELECT c.customer_id FROM customers c WHERE EXISTS (SELECT 1 FROM payments p\n"
        "WHERE NOT (p.customer_id = c.customer_id AND p.amount < 0))",
        {"customers": "customer_id", "payments": "customer_id"},
        ["customer_id"],
        "reads upstream 'payments' (as 'p', in a subquery) with no equality",
        1,
    ),
    # 7. PIVOT inside a derived table.
    (
        "pivot-in-a-derived-table",
        "SELECT c.customer_id, s.paid FROM customers c JOIN (SELECT * FROM\n"
        "(SELECT customer_id, status, amount FROM payments)\n"
        "PIVOT (SUM(amount) FOR status IN ('paid' AS paid))) s ON s.customer_id = c.customer_id",
        {"customers": "customer_id", "payments": "customer_id"},
        ["customer_id"],
        "uses PIVOT",
        3,
    ),
    # Two keys that are one column (the batch's key walk would fail on an ambiguous name).
    (
        "one-column-two-keys",
        "SELECT o.order_id AS k1, o.order_id AS k2, o.amount FROM orders o",
        {"orders": "k1, k2"},
        ["k1", "k2"],
        "gives the key column 'k2' the same column as another key",
        1,
    ),
    # 8. Functions that call arbitrary Java methods.
    (
        "reflect",
        "SELECT order_id, reflect('java.util.UUID', 'randomUUID') AS tag FROM orders",
        {"orders": "order_id"},
        ["order_id"],
        "calls reflect, which is non-deterministic",
        1,
    ),
    (
        "java-method",
        "SELECT order_id, java_method('java.lang.Math', 'random') AS r FROM orders",
        {"orders": "order_id"},
        ["order_id"],
        "calls java_method, which is non-deterministic",
        1,
    ),
    (
        "try-reflect",
        "SELECT order_id, try_reflect('java.lang.Math', 'random') AS r FROM orders",
        {"orders": "order_id"},
        ["order_id"],
        "calls try_reflect, which is non-deterministic",
        1,
    ),
    # Aggregates that list a group's rows in the order Spark reads them: a key recomputed
    # from fewer files may list them in another order than a full recompute.
    (
        "collect-list",
        "SELECT customer_id,\nsort_array(collect_list(amount)) AS amounts\n"
        "FROM orders GROUP BY customer_id",
        {"orders": "customer_id"},
        ["customer_id"],
        "uses collect_list, whose result follows the order Spark happens to read the rows",
        2,
    ),
    (
        "string-agg",
        "SELECT customer_id, string_agg(status, ',') AS statuses\nFROM orders GROUP BY customer_id",
        {"orders": "customer_id"},
        ["customer_id"],
        "whose result follows the order Spark happens to read the rows",
        1,
    ),
]


@pytest.mark.parametrize(
    ("sql", "upstreams", "keys", "fragment", "line"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_shapes_whose_incremental_form_differs_are_refused_when_they_load(
    sql: str, upstreams: dict[str, str], keys: list[str], fragment: str, line: int
) -> None:
    message = _refused(sql, upstreams, keys)
    assert fragment in message, message
    assert message.startswith(f"Pipeline 'p': its SQL (line {line})"), message


def test_a_self_join_gets_a_key_path_per_reference_and_is_not_cut_down() -> None:
    managers = _load(
        "SELECT e.emp_id, e.name, m.name AS manager_name\n"
        "FROM employees e LEFT JOIN employees m ON e.manager_id = m.emp_id",
        {"employees": "emp_id"},
        ["emp_id"],
    )
    assert managers.declared is not None
    assert managers.declared.inferred == {
        "employees": (
            KeyPath("employees", ("emp_id",)),
            # A manager's row reaches their reports' keys through their manager_id.
            KeyPath("employees", ("emp_id",), (Hop("employees", ("manager_id",), ("emp_id",)),)),
        )
    }
    reports = _load(
        "SELECT m.emp_id, COUNT(e.emp_id) AS reports\n"
        "FROM employees m LEFT JOIN employees e ON e.manager_id = m.emp_id GROUP BY m.emp_id",
        {"employees": "emp_id"},
        ["emp_id"],
    )
    assert reports.declared is not None
    assert reports.declared.inferred is not None
    # A report's row reaches its manager's key: a second direct path, by manager_id.
    assert [str(p) for p in reports.declared.inferred["employees"]] == ["emp_id", "manager_id"]


# Shapes the denylist refused that the query proves exact (each runs against a recompute
# in tests/spark/test_declared_proofs.py).
ACCEPTED = [
    (
        "hop-aggregate-in-a-derived-table",
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
        "hop-aggregate-in-a-scalar-subquery",
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
        "renamed-direct-path",
        "SELECT cust_id AS customer_id, COUNT(*) AS n FROM orders GROUP BY cust_id",
        {"orders": "cust_id"},
        ["customer_id"],
    ),
    (
        "latest-row-per-key",
        "SELECT customer_id, amount FROM (SELECT *, ROW_NUMBER() OVER\n"
        "(PARTITION BY customer_id ORDER BY ts DESC) AS rn FROM updates) WHERE rn = 1",
        {"updates": "customer_id"},
        ["customer_id"],
    ),
    (
        "aliased-cte",
        "WITH t AS (SELECT customer_id, SUM(amount) AS s FROM orders GROUP BY customer_id)\n"
        "SELECT c.customer_id, a.s FROM customers c JOIN t a ON a.customer_id = c.customer_id",
        {"customers": "customer_id", "orders": "customer_id"},
        ["customer_id"],
    ),
    (
        "using-chain",
        "SELECT a.k, b.v, c.w FROM a JOIN b USING (k) JOIN c USING (k)",
        {"a": "k", "b": "k", "c": "k"},
        ["k"],
    ),
    # Keys computed from one column (class 3, GROUP BY an expression): paths end at the
    # column, and the batch computes each touched key as the query does.
    (
        "coalesced-key",
        "SELECT COALESCE(region_id, -1) AS region_id, COUNT(*) AS n\nFROM customers GROUP BY 1",
        {"customers": "region_id"},
        ["region_id"],
    ),
    (
        "lowered-key",
        "SELECT LOWER(email) AS email, name FROM customers",
        {"customers": "email"},
        ["email"],
    ),
    (
        "key-computed-in-a-with-query",
        "WITH q AS (SELECT COALESCE(region_id, -1) AS region_id, COUNT(*) AS n\n"
        "FROM customers GROUP BY 1) SELECT q.region_id, q.n FROM q",
        {"customers": "region_id"},
        ["region_id"],
    ),
    (
        "key-computed-in-a-renamed-derived-table",
        "SELECT d.day, d.n FROM (SELECT DATE(created_at), COUNT(*) FROM orders GROUP BY 1)\n"
        "AS d (day, n)",
        {"orders": "created_at"},
        ["day"],
    ),
    (
        "group-by-an-expression-through-a-hop",
        "SELECT DATE(o.created_at) AS day, SUM(p.amount) AS paid FROM payments p\n"
        "JOIN orders o ON p.order_id = o.order_id GROUP BY DATE(o.created_at)",
        {
            "orders": "created_at",
            "payments": "payments.order_id -> orders.order_id -> orders.created_at",
        },
        ["day"],
    ),
    (
        "qualify-per-key",
        "SELECT customer_id, amount FROM updates\n"
        "QUALIFY ROW_NUMBER() OVER (PARTITION BY customer_id ORDER BY ts DESC) = 1",
        {"updates": "customer_id"},
        ["customer_id"],
    ),
]


@pytest.mark.parametrize(
    ("sql", "upstreams", "keys"),
    [case[1:] for case in ACCEPTED],
    ids=[case[0] for case in ACCEPTED],
)
def test_shapes_the_query_proves_are_accepted(
    sql: str, upstreams: dict[str, str], keys: list[str]
) -> None:
    pipeline = _load(sql, upstreams, keys)
    assert pipeline.declared is not None
    assert pipeline.declared.inferred is not None
    for upstream, path in pipeline.declared.key_paths.items():
        assert replace(pipeline.declared.inferred[upstream][0], computed=()) == path


def test_a_computed_key_is_followed_to_its_column_and_computed_as_the_query_does() -> None:
    by_day = _load(
        "SELECT DATE(o.created_at) AS day, SUM(p.amount) AS paid FROM payments p\n"
        "JOIN orders o ON p.order_id = o.order_id GROUP BY 1",
        {
            "orders": "created_at",
            "payments": "payments.order_id -> orders.order_id -> orders.created_at",
        },
        ["day"],
    )
    assert by_day.declared is not None
    assert by_day.declared.inferred is not None
    assert {u: [str(p) for p in ps] for u, ps in by_day.declared.inferred.items()} == {
        "orders": ["created_at => DATE(created_at)"],
        "payments": [
            "payments.order_id -> orders.order_id -> orders.created_at => DATE(created_at)"
        ],
    }
    # `watermark list` and the UI show the declared path as a batch follows it.
    assert describe(by_day.declared)["key_paths"] == {
        "orders": "created_at => DATE(created_at)",
        "payments": "payments.order_id -> orders.order_id -> orders.created_at => DATE(created_at)",
    }
    # The expression is the query's own text, reading the path's end column under a name
    # of its own, so that it applies to any path's end whatever the column is called there.
    assert by_day.declared.inferred["orders"][0].computed == (f"DATE(`{key_input(0)}`)",)
    # A plain key beside a computed one computes nothing.
    two = _load(
        "SELECT o.customer_id, DATE(o.created_at) AS day, COUNT(*) AS n FROM orders o\n"
        "GROUP BY o.customer_id, DATE(o.created_at)",
        {"orders": "customer_id, created_at"},
        ["customer_id", "day"],
    )
    assert two.declared is not None
    assert two.declared.inferred is not None
    assert two.declared.inferred["orders"][0].computed == (
        None,
        f"DATE(`{key_input(1)}`)",
    )


def test_the_batch_proves_what_the_definitions_could_not_place() -> None:
    # Unqualified in a join, `name` and `zone` could be either table's without the schemas.
    upstreams = {
        "customers": "customer_id",
        "regions": "regions.region_id -> customers.region_id -> customers.customer_id",
    }
    by_zone = _load(
        "SELECT customer_id, name FROM customers JOIN regions USING (region_id)\n"
        "QUALIFY RANK() OVER (PARTITION BY zone ORDER BY name) < 3",
        upstreams,
        ["customer_id"],
    )
    assert by_zone.declared is not None
    assert by_zone.declared.inferred is None
    schemas = {"customers": ["customer_id", "name", "region_id"], "regions": ["region_id", "zone"]}
    with pytest.raises(ConfigurationError) as caught:
        paths_for_batch("p", by_zone.declared, ["customer_id"], schemas)
    assert "(line 2) uses a window not partitioned by the target keys" in str(caught.value)
    # Partitioned by the key, the same query is proven once the schemas place the columns.
    per_key = _load(
        "SELECT customer_id, name FROM customers JOIN regions USING (region_id)\n"
        "QUALIFY RANK() OVER (PARTITION BY customer_id ORDER BY zone) < 3",
        upstreams,
        ["customer_id"],
    )
    assert per_key.declared is not None
    assert per_key.declared.inferred is None
    paths = paths_for_batch("p", per_key.declared, ["customer_id"], schemas)
    assert {u: [str(p) for p in ps] for u, ps in paths.items()} == {
        "customers": ["customer_id"],
        "regions": ["regions.region_id -> customers.region_id -> customers.customer_id"],
    }


# An equality that holds only for the rows of one side (an outer join's ON, a correlated
# subquery's WHERE) does not make two columns of the other side equal: an order whose
# customer is missing, or has no blocked row, keeps customer_id <> referrer_id.
CONDITIONAL = [
    (
        "outer-join-on",
        "SELECT o.order_id, x.label FROM orders o\n"
        "LEFT JOIN customers c ON c.customer_id = o.customer_id AND c.customer_id = o.referrer_id\n"
        "JOIN labels x ON x.customer_id = o.referrer_id",
    ),
    (
        "not-exists",
        "SELECT o.order_id, x.label FROM orders o\n"
        "JOIN labels x ON x.customer_id = o.referrer_id WHERE NOT EXISTS\n"
        "(SELECT 1 FROM customers c WHERE c.customer_id = o.customer_id "
        "AND c.customer_id = o.referrer_id)",
    ),
    (
        "scalar-subquery",
        "SELECT o.order_id, x.label, (SELECT MAX(c.name) FROM customers c\n"
        "WHERE c.customer_id = o.customer_id AND c.customer_id = o.referrer_id) AS name\n"
        "FROM orders o JOIN labels x ON x.customer_id = o.referrer_id",
    ),
]


@pytest.mark.parametrize("sql", [c[1] for c in CONDITIONAL], ids=[c[0] for c in CONDITIONAL])
def test_an_equality_of_one_side_does_not_equate_the_other_sides_columns(sql: str) -> None:
    by_referrer = "labels.customer_id -> orders.referrer_id -> orders.order_id"
    upstreams = {"orders": "order_id", "customers": BY_CUSTOMER, "labels": by_referrer}
    pipeline = _load(sql, upstreams, ["order_id"])
    assert pipeline.declared is not None
    assert pipeline.declared.inferred is not None
    assert [str(p) for p in pipeline.declared.inferred["labels"]] == [by_referrer]
    # Declared through the buyer, the labels' path is one the query does not follow.
    wrong = {**upstreams, "labels": "labels.customer_id -> orders.customer_id -> orders.order_id"}
    message = _refused(sql, wrong, ["order_id"])
    assert "relates upstream 'labels' to the target keys as '" + by_referrer in message
