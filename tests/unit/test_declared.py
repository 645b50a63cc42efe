"""Declared pipelines: what is accepted, and what cannot be derived is refused when the
definitions load, naming the pipeline, the upstream and the fix. No JVM: these checks run
where the code location loads, which starts no Spark."""

import pytest

from watermark_dagster.config.declared import Hop, KeyPath, parse_key_path
from watermark_dagster.config.pipeline import Pipeline, declared_pipeline, sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.errors import ConfigurationError

JOIN = "customers.customer_id -> orders.customer_id -> orders.order_id"
THREE = (
    "regions.region_id -> customers.region_id -> customers.customer_id "
    "-> orders.customer_id -> orders.order_id"
)


def enriched(orders, customers):
    return orders.join(customers, "customer_id", "left")


def _declared(fn=enriched, **overrides) -> Pipeline:
    kwargs = {
        "upstreams": {"orders": "order_id", "customers": JOIN},
        "target": "/lake/enriched",
        "keys": ["order_id"],
        "name": "enriched",
    }
    kwargs.update(overrides)
    return declared_pipeline(**kwargs)(fn)


def _sql(sql: str, **overrides) -> Pipeline:
    kwargs = {
        "name": "enriched_sql",
        "sql": sql,
        "upstreams": {"orders": "order_id", "customers": JOIN},
        "target": "/lake/enriched_sql",
        "keys": ["order_id"],
    }
    kwargs.update(overrides)
    return sql_pipeline(**kwargs)


# ------------------------------------------------------------------ key paths


def test_key_paths_parse_into_hops_and_print_back() -> None:
    upstreams = ["orders", "customers", "regions", "lines"]
    direct = parse_key_path("p", "orders", "order_id", keys=["order_id"], upstreams=upstreams)
    assert direct == KeyPath("orders", ("order_id",))
    assert direct.direct
    joined = parse_key_path("p", "customers", JOIN, keys=["order_id"], upstreams=upstreams)
    assert joined.hops == (Hop("orders", ("customer_id",), ("order_id",)),)
    assert str(joined) == JOIN
    three = parse_key_path("p", "regions", THREE, keys=["order_id"], upstreams=upstreams)
    assert [h.upstream for h in three.hops] == ["customers", "orders"]
    assert three.end == ("order_id",)
    composite = parse_key_path(
        "p",
        "orders",
        "orders.order_id → lines.(order_id) → lines.(order_id, line_no)",
        keys=["order_id", "line_no"],
        upstreams=upstreams,
    )
    assert composite.end == ("order_id", "line_no")
    assert str(composite) == "orders.order_id -> lines.order_id -> lines.(order_id, line_no)"
    assert parse_key_path(
        "p", "lines", ["order_id", "line_no"], keys=["a", "b"], upstreams=upstreams
    ) == KeyPath("lines", ("order_id", "line_no"))


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("orders.customer_id -> orders.order_id", "starts at 'orders', not at 'customers'"),
        ("customers.customer_id -> orders.customer_id", "has an even number of steps"),
        (
            "customers.customer_id -> orders.customer_id -> refunds.order_id",
            "enters 'orders' and leaves from 'refunds'",
        ),
        (
            "customers.customer_id -> payments.customer_id -> payments.order_id",
            "goes through 'payments', which the pipeline does not read",
        ),
        ("customers.customer_id -> orders.customer_id -> orders.(order_id, x)", "ends at 2"),
        ("customers.customer id -> orders.customer_id -> orders.order_id", "not upstream.column"),
        ("customers.cust-id -> orders.customer_id -> orders.order_id", "Invalid key path column"),
        (["customer_id", 3], "is not a list of column names"),
        ("", "is missing"),
        (
            "customers.customer_id -> customers.customer_id -> customers.order_id",
            "visits 'customers' twice",
        ),
    ],
    ids=[
        "wrong-start",
        "no-carry",
        "hop-leaves-elsewhere",
        "unknown-upstream",
        "wrong-arity",
        "space",
        "bad-column",
        "not-text",
        "empty",
        "revisit",
    ],
)
def test_a_bad_key_path_is_refused_naming_pipeline_upstream_and_fix(spec, fragment) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _declared(upstreams={"orders": "order_id", "customers": spec})
    message = str(caught.value)
    assert fragment in message, message
    assert "Pipeline 'enriched'" in message, message
    assert "upstream 'customers'" in message, message
    assert "Fix: " in message
    assert caught.value.pipeline == "enriched"
    assert caught.value.upstream == "customers"


def test_a_missing_key_path_names_the_upstream() -> None:
    def full(orders, customers): ...

    with pytest.raises(ConfigurationError, match=r"upstream 'customers'.*is missing") as caught:
        _declared(full, upstreams={"orders": "order_id", "customers": None})
    assert caught.value.upstream == "customers"


def test_a_key_path_per_upstream_and_only_there() -> None:
    declared = _declared().declared
    assert declared is not None
    with pytest.raises(ConfigurationError, match=r"have no key path"):
        Pipeline(
            name="p",
            upstreams=("orders", "customers", "regions"),
            target="/t",
            keys=("order_id",),
            declared=declared,
        )


# ------------------------------------------------------------------ the full function


def test_the_function_takes_the_upstreams_by_name() -> None:
    p = _declared()
    assert p.declared is not None
    assert p.transform is None
    assert p.upstreams == ("orders", "customers")
    assert p.write == "merge"

    def by_keyword(*, customers, orders, spark=None): ...

    _declared(by_keyword)  # keyword-only, any order, optional extras: fine


@pytest.mark.parametrize(
    ("fn", "fragment"),
    [
        (lambda orders: None, "takes no parameter for upstream(s) ['customers']"),
        (lambda orders, customers, payments: None, "['payments'] that name no upstream"),
        (lambda orders, customers, /: None, "positional-only"),
        (42, "not a function"),
    ],
    ids=["missing", "extra", "positional-only", "not-callable"],
)
def test_a_function_not_matching_its_upstreams_is_refused(fn, fragment) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _declared(fn)
    assert fragment in str(caught.value)
    assert "Pipeline 'enriched'" in str(caught.value)
    assert "Fix: " in str(caught.value)


def test_declared_pipelines_merge_and_take_no_transform() -> None:
    declared = _declared().declared
    with pytest.raises(ConfigurationError, match=r"write='append'.*Fix: drop write="):
        Pipeline(
            name="p",
            upstreams=("orders", "customers"),
            target="/t",
            keys=("order_id",),
            declared=declared,
            write="append",
        )
    with pytest.raises(ConfigurationError, match="both a transform and a declared"):
        Pipeline(
            name="p",
            upstreams=("orders", "customers"),
            target="/t",
            keys=("order_id",),
            declared=declared,
            transform=lambda batch: batch,
        )
    with pytest.raises(ConfigurationError, match="needs the target's key columns"):
        _declared(keys=[])
    with pytest.raises(ConfigurationError, match="has no transform"):
        Pipeline(name="p", upstreams=("orders",), target="/t", keys=("id",))
    with pytest.raises(ConfigurationError, match="map each upstream to its key path"):
        _declared(upstreams=["orders", "customers"])


def test_a_registry_refuses_a_declared_pipeline_reading_an_unknown_upstream() -> None:
    with pytest.raises(ConfigurationError, match="customers"):
        Registry(upstreams=[DeltaUpstream(name="orders", path="/o")], pipelines=[_declared()])


# ------------------------------------------------------------------ SQL


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT o.order_id, c.name FROM orders o LEFT JOIN customers AS c "
        "ON o.customer_id = c.customer_id",
        "SELECT order_id, name FROM orders JOIN customers USING (customer_id);",
        "WITH names AS (SELECT customer_id, name FROM customers), o2 (order_id, customer_id) AS "
        "(SELECT order_id, customer_id FROM orders) "
        "SELECT o2.order_id, names.name FROM o2 LEFT JOIN names USING (customer_id)",
        "SELECT order_id, EXTRACT(YEAR FROM o.ts) AS y, TRIM(BOTH ' ' FROM c.name) AS n "
        "FROM orders o, customers c WHERE o.customer_id = c.customer_id",
        "-- rand() in a comment, LIMIT in a string\n/* OVER ( /* nested */ rand() */ "
        "SELECT order_id, 'LIMIT 5 rand()' AS note, `rand`, `limit` FROM (SELECT * FROM orders) x "
        "LEFT SEMI JOIN customers ON x.customer_id = customers.customer_id",
        "SELECT order_id FROM orders WHERE customer_id IN (SELECT customer_id FROM customers) "
        "AND a IS DISTINCT FROM b",
    ],
    ids=["join-alias", "using", "ctes", "from-in-functions", "comments-strings-quoted", "subquery"],
)
def test_sql_that_can_be_derived_is_accepted(sql: str) -> None:
    p = _sql(sql)
    assert p.declared is not None
    assert p.declared.sql == sql


def test_an_aggregate_grouped_by_the_target_key_is_accepted() -> None:
    _sql(
        "SELECT c.customer_id, c.name, COALESCE(SUM(p.amount_cents), 0) AS total "
        "FROM customers c LEFT JOIN payments p ON c.customer_id = p.customer_id "
        "GROUP BY c.customer_id, c.name",
        upstreams={"customers": "customer_id", "payments": "customer_id"},
        keys=["customer_id"],
    )


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        (
            "SELECT order_id, ROW_NUMBER() OVER (PARTITION BY customer_id ORDER BY order_id) "
            "FROM orders JOIN customers USING (customer_id)",
            "uses a window not partitioned by the target keys",
        ),
        (
            "SELECT order_id FROM orders JOIN customers USING (customer_id) LIMIT 10",
            "uses LIMIT",
        ),
        (
            "SELECT order_id, rand() AS r FROM orders JOIN customers USING (customer_id)",
            "calls rand, which is non-deterministic",
        ),
        (
            "SELECT order_id, current_timestamp AS at FROM orders JOIN customers "
            "USING (customer_id)",
            "calls current_timestamp",
        ),
        (
            "SELECT order_id FROM orders JOIN sales.customers USING (customer_id)",
            "reads sales.customers, a table outside the batch",
        ),
        (
            "SELECT order_id FROM orders JOIN refunds USING (customer_id), customers",
            "reads refunds, which is neither an upstream",
        ),
        (
            "SELECT id AS order_id FROM range(10) JOIN customers",
            "reads the table function range",
        ),
        ("SELECT order_id FROM orders", "does not read upstream 'customers'"),
        ("SELECT 1 FROM orders, customers; DROP TABLE x", "more than one statement"),
        ("INSERT INTO t SELECT * FROM orders, customers", "is not a query"),
        (
            "SELECT customer_id, COUNT(*) AS order_id FROM orders, customers GROUP BY customer_id",
            "computes the key column 'order_id' with an aggregate",
        ),
        ("SELECT (order_id FROM orders, customers", "does not parse (line 1, column"),
        ("   ", "is empty"),
    ],
    ids=[
        "window",
        "limit",
        "rand",
        "current-timestamp",
        "qualified-table",
        "unknown-table",
        "table-function",
        "unread-upstream",
        "two-statements",
        "insert",
        "group-by-other",
        "unbalanced",
        "empty",
    ],
)
def test_sql_that_cannot_be_derived_is_refused_when_it_loads(sql: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _sql(sql)
    message = str(caught.value)
    assert fragment in message, message
    assert message.startswith("Pipeline 'enriched_sql'"), message
    assert "Fix: " in message


# A pipeline keyed by customer, reading customers and orders by customer_id (both direct):
# each batch cuts both views down to the touched customers, so anything computed over all
# orders is computed over the touched customers' orders only.
PER_CUSTOMER = {"customers": "customer_id", "orders": "customer_id"}

BIG_SPENDERS = """SELECT c.customer_id, SUM(o.amount) AS total
FROM customers c JOIN orders o ON o.customer_id = c.customer_id
GROUP BY c.customer_id
HAVING SUM(o.amount) > (SELECT AVG(amount) * 2 FROM orders)"""


def _per_customer(sql: str) -> Pipeline:
    return _sql(sql, upstreams=PER_CUSTOMER, keys=["customer_id"], name="big_spenders")


def test_a_subquery_over_a_whole_upstream_is_refused_naming_its_line() -> None:
    with pytest.raises(ConfigurationError) as caught:
        _per_customer(BIG_SPENDERS)
    error = caught.value
    message = str(error)
    assert message.startswith(
        "Pipeline 'big_spenders': its SQL (line 4) reads upstream 'orders' (as 'orders', in a "
        "subquery) with no equality"
    )
    assert "correlate the subquery on a column that leads to the target keys" in message
    assert error.upstream == "orders"
    assert getattr(error, "sql_line", None) == 4


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT c.customer_id, (SELECT SUM(o.amount) FROM orders o "
        "WHERE o.customer_id = c.customer_id) AS total FROM customers c",
        "SELECT c.customer_id FROM customers c WHERE EXISTS "
        "(SELECT 1 FROM orders WHERE customer_id = c.customer_id AND amount > 100)",
        "SELECT customer_id FROM customers WHERE customer_id IN "
        "(SELECT customer_id FROM orders GROUP BY customer_id HAVING SUM(amount) > 100)",
        BIG_SPENDERS.replace(
            "FROM orders)", "FROM orders o2 WHERE o2.customer_id <=> c.customer_id)"
        ),
        "WITH t AS (SELECT customer_id, SUM(amount) AS total FROM orders GROUP BY 1) "
        "SELECT c.customer_id, t.total FROM customers c LEFT JOIN t USING (customer_id)",
        "SELECT c.customer_id, t.n FROM customers c LEFT JOIN (SELECT DISTINCT customer_id, "
        "1 AS n FROM orders) t ON t.customer_id = c.customer_id",
        "SELECT customer_id, COUNT(*) AS n FROM customers JOIN orders USING (customer_id) "
        "GROUP BY ALL",
        # Each order's status count reaches every customer with an order of that status:
        # inferred as a second path of orders (status -> orders.status -> customer_id).
        "WITH s AS (SELECT status, COUNT(*) AS n FROM orders GROUP BY status) "
        "SELECT c.customer_id, s.n FROM customers c JOIN orders o USING (customer_id) "
        "JOIN s ON s.status = o.status",
    ],
    ids=[
        "scalar-correlated",
        "exists-correlated",
        "in-grouped-key",
        "having-correlated",
        "cte-grouped-ordinal",
        "derived-distinct",
        "group-by-all",
        "cte-grouped-by-a-joined-column",
    ],
)
def test_aggregates_and_subqueries_per_key_path_are_accepted(sql: str) -> None:
    assert _per_customer(sql).declared is not None


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        (
            "SELECT c.customer_id FROM customers c WHERE EXISTS "
            "(SELECT 1 FROM orders WHERE amount > 1000)",
            "reads upstream 'orders' (as 'orders', in a subquery) with no equality",
        ),
        (
            "SELECT customer_id FROM customers WHERE customer_id IN "
            "(SELECT o.customer_id FROM orders o WHERE o.amount > "
            "(SELECT AVG(amount) FROM orders))",
            "reads upstream 'orders' (as 'orders', in a subquery) with no equality",
        ),
        (
            "SELECT c.customer_id FROM customers c WHERE c.customer_id IN "
            "(SELECT COUNT(*) FROM orders GROUP BY status)",
            "reads upstream 'orders' (as 'orders', in a subquery) with no equality",
        ),
        (
            "SELECT c.customer_id, a.avg FROM customers c CROSS JOIN "
            "(SELECT AVG(amount) AS avg FROM orders) a",
            "reads upstream 'orders' (as 'orders', in a derived table) with no equality",
        ),
        (
            "SELECT 1 AS customer_id, COUNT(*) AS n FROM customers JOIN orders USING (customer_id)",
            "computes the key column 'customer_id' from no column",
        ),
        (
            "SELECT customer_id, SUM(amount) AS total FROM customers JOIN orders "
            "USING (customer_id) GROUP BY ROLLUP (customer_id)",
            "uses ROLLUP",
        ),
        (
            "SELECT customer_id FROM customers c JOIN orders o USING (customer_id) "
            "QUALIFY ROW_NUMBER() OVER (PARTITION BY o.amount ORDER BY c.customer_id) = 1",
            "uses a window not partitioned by the target keys",
        ),
        (
            "SELECT customer_id FROM customers TABLESAMPLE (10 PERCENT) JOIN orders "
            "USING (customer_id)",
            "uses TABLESAMPLE",
        ),
        (
            "SELECT customer_id, uuid() AS tag FROM customers JOIN orders USING (customer_id)",
            "calls uuid, which is non-deterministic",
        ),
        (
            "SELECT customer_id, localtimestamp AS at FROM customers JOIN orders "
            "USING (customer_id)",
            "calls localtimestamp",
        ),
        (
            "SELECT customer_id FROM customers JOIN orders USING (customer_id) WHERE ts < now()",
            "calls now",
        ),
    ],
    ids=[
        "exists-uncorrelated",
        "nested-scalar-uncorrelated",
        "in-grouped-other",
        "derived-global-aggregate",
        "top-global-aggregate",
        "rollup",
        "qualify",
        "tablesample",
        "uuid",
        "localtimestamp",
        "now",
    ],
)
def test_aggregates_and_subqueries_across_keys_are_refused(sql: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _per_customer(sql)
    message = str(caught.value)
    assert fragment in message, message
    assert message.startswith("Pipeline 'big_spenders': its SQL (line 1)"), message
    assert "Fix: " in message
