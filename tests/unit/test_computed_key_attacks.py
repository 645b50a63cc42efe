"""Adversarial load-time checks of computed keys in declared SQL (no JVM).

A computed key's expression is the template every batch evaluates on the key's column
(KeyPath.computed). sqlglot writing it back could change what Spark computes (TO_CHAR as
a CAST, LOG10 as LOG, a format's quoted letters): the batch then touched keys the query
never produces and left the real ones stale (tests/spark/test_computed_key_attacks.py
shows the wrong targets). The template is now the query's own text; each expression below
must either be refused when it loads or keep its meaning in the template.
"""

from collections.abc import Callable

import pytest

from watermark_dagster.config.pipeline import Pipeline, sql_pipeline
from watermark_dagster.errors import ConfigurationError


def _load(sql: str, upstreams: dict[str, str], keys: list[str]) -> Pipeline:
    return sql_pipeline(name="p", sql=sql, upstreams=upstreams, target="/lake/p", keys=keys)


def _template(expression: str, column: str) -> str | None:
    """The key's template, or None when the key is refused."""
    try:
        pipeline = _load(
            f"SELECT {expression} AS k, COUNT(*) AS n FROM t GROUP BY 1", {"t": column}, ["k"]
        )
    except ConfigurationError:
        return None
    assert pipeline.declared is not None
    assert pipeline.declared.inferred is not None
    computed = pipeline.declared.inferred["t"][0].computed
    assert computed
    assert computed[0] is not None
    return computed[0]


# (expression, its column, what a faithful template keeps); what sqlglot writes today above each.
UNFAITHFUL = [
    # CAST(x AS STRING): '7', not '007'
    pytest.param("TO_CHAR(x, '000')", "x", lambda t: "'000'" in t, id="to_char-format"),
    # DATE_FORMAT(x, CONCAT('yyyy', 'Q', 'Q')): '202401', not '2024Q1'
    pytest.param(
        "DATE_FORMAT(ts, 'yyyy''Q''Q')", "ts", lambda t: "CONCAT(" not in t, id="quoted-quote"
    ),
    # FLOOR(LOG(10, x)): 2 for 1000, not 3
    pytest.param("FLOOR(LOG10(amount))", "amount", lambda t: "LOG10(" in t, id="log10"),
    # TO_DATE(x): lenient where the format is strict ('2024-1-5' with ansi off)
    pytest.param(
        "TO_DATE(s, 'yyyy-MM-dd')", "s", lambda t: "'yyyy-MM-dd'" in t, id="to_date-format"
    ),
    # DATE_FORMAT(x, 'yyyy'): calendar year, not week-based year (legacy parser)
    pytest.param("DATE_FORMAT(ts, 'YYYY')", "ts", lambda t: "'YYYY'" in t, id="week-year"),
]


@pytest.mark.parametrize(("expression", "column", "faithful"), UNFAITHFUL)
def test_a_computed_key_keeps_its_meaning_or_is_refused(
    expression: str, column: str, faithful: Callable[[str], bool]
) -> None:
    """Root cause: key_inference._computed_keys.computed_key writes the template with
    ``template.sql(dialect="spark")``, which is not a faithful round trip of Spark SQL."""
    template = _template(expression, column)
    assert template is None or faithful(template), template


def test_a_key_expression_sqlglot_cannot_write_is_refused_cleanly() -> None:
    """``REGEXP_REPLACE(s, 'a')`` (Spark wants a replacement) makes sqlglot's generator
    raise KeyError inside computed_key: the definitions fail to load with a traceback, not
    the refusal naming the pipeline, its line and a fix."""
    with pytest.raises(ConfigurationError):
        _load(
            "SELECT REGEXP_REPLACE(s, 'a') AS k, COUNT(*) AS n FROM t GROUP BY 1",
            {"t": "s"},
            ["k"],
        )


# Shapes around computed keys that must stay refused (each would write wrong targets).
REFUSED = [
    pytest.param(
        "SELECT DATEDIFF(CURRENT_DATE(), d) AS k, COUNT(*) AS n FROM t GROUP BY 1",
        {"t": "d"},
        "calls current_date",
        id="clock-in-the-key",
    ),
    pytest.param(
        "SELECT COALESCE(o.customer_id, c.customer_id) AS k, COUNT(*) AS n FROM orders o\n"
        "LEFT JOIN customers c ON c.customer_id = o.customer_id GROUP BY 1",
        {"orders": "customer_id", "customers": "customer_id"},
        "from several columns",
        id="optional-side-column-in-the-key",
    ),
    pytest.param(
        "SELECT COALESCE(o.customer_id, -1) AS k, COUNT(*) AS n FROM orders o\n"
        "FULL JOIN customers c ON c.customer_id = o.customer_id GROUP BY 1",
        {"orders": "customer_id", "customers": "customer_id"},
        "optional side of an outer join",
        id="full-join-side",
    ),
    pytest.param(
        "SELECT FLOOR(o.customer_id / 10) AS k, COUNT(*) AS n FROM orders o JOIN customers c\n"
        "ON FLOOR(c.customer_id / 10) = FLOOR(o.customer_id / 10) GROUP BY 1",
        {"orders": "customer_id", "customers": "customer_id"},
        "reads upstream 'customers'",
        id="join-on-the-computed-key",
    ),
    pytest.param(
        "SELECT x % 10 AS k, SUM(x) OVER (PARTITION BY x % 10) AS s FROM t",
        {"t": "x"},
        "window that is not partitioned by columns",
        id="window-over-the-computed-key",
    ),
    pytest.param(
        "SELECT q.k, SUM(q.v) AS v FROM (SELECT x % 10 AS k, v FROM t) q\n"
        "JOIN u ON u.k = q.k GROUP BY q.k",
        {"t": "x", "u": "k"},
        "reads upstream 'u'",
        id="join-on-a-key-computed-in-a-derived-table",
    ),
    pytest.param(
        "SELECT x % 10 AS k, COUNT(*) AS n FROM t GROUP BY x % 10\n"
        "HAVING MAX(x) > (SELECT AVG(y) FROM u)",
        {"t": "x", "u": "y"},
        "reads upstream 'u'",
        id="having-against-all-rows",
    ),
]


@pytest.mark.parametrize(("sql", "upstreams", "says"), REFUSED)
def test_odd_shapes_around_computed_keys_stay_refused(
    sql: str, upstreams: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        _load(sql, upstreams, ["k"])
