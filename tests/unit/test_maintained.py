"""Which declared SQL the ``maintain`` strategy applies to, and how ``auto`` weighs it (no
JVM): the analysis of ``config/maintained.py`` (what qualifies, what is refused and why,
the state query and the outputs over the state, the query rewritten around the state's
view) and the strategy rule with a maintainable pipeline. The Spark side (targets equal to
the full query after every kind of change, crashes, replays) is
``tests/spark/test_maintain.py``; generated shapes against DataFusion are
``tests/model/test_sql_shapes.py``."""

import json
from dataclasses import replace

import pytest
import sqlglot

from watermark_dagster.config.maintained import (
    MaintainedForm,
    Unmaintainable,
    form_of,
    maintained_form,
)
from watermark_dagster.config.pipeline import sql_pipeline
from watermark_dagster.core.strategy import (
    AUTO_FULL_BELOW_BYTES,
    MeasuredStrategy,
    Strategy,
    StrategyRun,
    decide_strategy,
    estimate_seconds,
)
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.store import codec

UPSTREAMS = ("customers", "payments", "orders")
BIG = 100 * AUTO_FULL_BELOW_BYTES


def _form(sql: str) -> MaintainedForm:
    form = maintained_form(sql, UPSTREAMS)
    assert isinstance(form, MaintainedForm), form
    return form


@pytest.mark.parametrize(
    "sql",
    [
        # The whole query.
        "SELECT customer_id, COUNT(*) AS n, SUM(amount) AS total FROM payments "
        "GROUP BY customer_id",
        # With an alias, a WHERE, a HAVING, COUNT(x), COUNT(1), COUNT_IF and AVG.
        "SELECT p.customer_id, COUNT(p.amount) AS priced, COUNT(1) AS n, "
        "COUNT_IF(p.amount > 5) AS big, AVG(p.amount) AS mean FROM payments AS p "
        "WHERE p.amount <> 3 GROUP BY p.customer_id HAVING SUM(p.amount) > 10",
        # A derived table joined to the customers (the demo's shape).
        "SELECT c.customer_id, COALESCE(t.total, 0) AS total FROM customers c LEFT JOIN "
        "(SELECT customer_id, SUM(amount) AS total FROM payments GROUP BY customer_id) t "
        "ON t.customer_id = c.customer_id",
        # A WITH query, and expressions of aggregates and keys.
        "WITH t AS (SELECT customer_id, SUM(amount) + COUNT(*) AS x, customer_id + 0 AS k "
        "FROM payments GROUP BY customer_id) SELECT t.customer_id, t.x FROM t",
        # A composite key.
        "SELECT o.customer_id, o.status, COUNT(*) AS n FROM orders o "
        "GROUP BY o.customer_id, o.status",
    ],
)
def test_sums_over_one_upstream_are_maintained(sql: str) -> None:
    form = _form(sql)
    [aggregate] = form.aggregates
    assert aggregate.upstream in UPSTREAMS
    assert aggregate.state[0].name == "_wm_rows"
    # The rewritten query reads the state's view instead of the upstream, and parses.
    assert aggregate.view in form.sql
    assert aggregate.upstream not in {
        t.name for t in sqlglot.parse_one(form.sql).find_all(sqlglot.exp.Table)
    }
    # The state query groups by the same columns, from rows carrying the sign.
    assert "_wm_sign" in aggregate.state_sql
    assert "GROUP BY" in aggregate.state_sql


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("SELECT customer_id, MIN(amount) AS m FROM payments GROUP BY customer_id", "MIN"),
        ("SELECT customer_id, MAX(amount) AS m FROM payments GROUP BY customer_id", "MAX"),
        (
            "SELECT customer_id, COUNT(DISTINCT amount) AS m FROM payments GROUP BY customer_id",
            "counts distinct values",
        ),
        (
            "SELECT customer_id, SUM(DISTINCT amount) AS m FROM payments GROUP BY customer_id",
            "counts distinct values",
        ),
        (
            "SELECT c.customer_id, SUM(p.amount) AS m FROM customers c JOIN payments p "
            "ON p.customer_id = c.customer_id GROUP BY c.customer_id",
            "reads a join",
        ),
        (
            "SELECT customer_id, COUNT(*) FROM payments GROUP BY customer_id",
            "has no name",
        ),
        (
            "SELECT DATE(paid_at) AS day, COUNT(*) AS n FROM payments GROUP BY DATE(paid_at)",
            "groups by an expression",
        ),
        (
            "SELECT customer_id, amount, COUNT(*) AS n FROM payments GROUP BY customer_id",
            "outside an aggregate",
        ),
        (
            "SELECT customer_id, COUNT(*) FILTER (WHERE amount > 1) AS n FROM payments "
            "GROUP BY customer_id",
            "FILTER",
        ),
        (
            "SELECT customer_id, COUNT(*) AS n FROM payments WHERE amount > "
            "(SELECT AVG(amount) FROM payments) GROUP BY customer_id",
            "subquery",
        ),
        (
            "SELECT t.customer_id, t.n FROM (SELECT customer_id, COUNT(*) AS n FROM payments "
            "GROUP BY customer_id) t JOIN payments p ON p.customer_id = t.customer_id",
            "more than once",
        ),
        (
            "SELECT customer_id, amount FROM payments",
            "no GROUP BY",
        ),
        # Shapes a maintained state would get wrong: a grand total beside the groups, a
        # LIMIT or QUALIFY choosing among groups, a HAVING naming an output (Spark resolves
        # it; over the state it would name nothing), a value picked from a group.
        *[
            (f"SELECT customer_id, SUM(amount) AS total FROM payments GROUP BY {g}", why)
            for g, why in [
                ("ROLLUP(customer_id)", "groups by an expression"),
                ("CUBE(customer_id)", "groups by an expression"),
                ("GROUPING SETS ((customer_id), ())", "groups by an expression"),
                ("1", "groups by an expression"),
                ("customer_id LIMIT 3", "LIMIT"),
                ("customer_id QUALIFY RANK() OVER (ORDER BY SUM(amount)) = 1", "QUALIFY"),
                ("customer_id HAVING total > 10", "uses total outside an aggregate"),
            ]
        ],
        (
            "SELECT customer_id, ANY_VALUE(amount) AS a FROM payments GROUP BY customer_id",
            "not a sum of per-row values",
        ),
        (
            "SELECT customer_id, COUNT(*) AS n FROM payments GROUP BY customer_id "
            "UNION ALL SELECT customer_id, COUNT(*) AS n FROM orders GROUP BY customer_id",
            "set operation",
        ),
    ],
)
def test_what_is_not_a_sum_over_one_upstream_is_left_to_the_other_strategies(
    sql: str, why: str
) -> None:
    form = maintained_form(sql, UPSTREAMS)
    assert isinstance(form, Unmaintainable)
    assert why in form


def test_the_outputs_are_the_query_s_own_expressions_over_the_state() -> None:
    [aggregate] = _form(
        "SELECT p.customer_id AS id, COALESCE(SUM(p.amount), 0) AS total, COUNT(*) AS n, "
        "AVG(p.amount) AS mean, COUNT(p.amount) AS priced, COUNT_IF(p.amount > 5) AS big "
        "FROM payments p GROUP BY p.customer_id HAVING SUM(p.amount) > 10"
    ).aggregates
    outputs = dict(aggregate.outputs)
    assert outputs["id"] == "_wm_g0"
    assert outputs["n"] == "_wm_rows"
    # SUM of no non-NULL value is NULL: its count of non-NULL values decides.
    assert outputs["total"] == "COALESCE(CASE WHEN _wm_a1 > 0 THEN _wm_a0 END, 0)"
    assert outputs["mean"] == "CASE WHEN _wm_a1 > 0 THEN CAST(_wm_a0 AS DOUBLE) / _wm_a1 END"
    assert outputs["priced"] == "_wm_a1"  # COUNT(x) is the SUM's count: one column for both
    assert outputs["big"] == "_wm_a2"
    assert aggregate.having == "CASE WHEN _wm_a1 > 0 THEN _wm_a0 END > 10"
    assert [c.name for c in aggregate.state] == ["_wm_rows", "_wm_a0", "_wm_a1", "_wm_a2"]
    assert aggregate.exact_sums == (("_wm_a0", False), ("_wm_a0", True), ("_wm_a0", False))


def test_the_state_definition_changes_with_the_query() -> None:
    one = _form("SELECT customer_id, SUM(amount) AS t FROM payments GROUP BY customer_id")
    two = _form(
        "SELECT customer_id, SUM(amount) AS t FROM payments WHERE amount > 0 GROUP BY customer_id"
    )
    same = _form("SELECT customer_id, SUM(amount) AS t FROM payments GROUP BY customer_id")
    assert one.aggregates[0].fingerprint == same.aggregates[0].fingerprint
    assert one.aggregates[0].fingerprint != two.aggregates[0].fingerprint


def test_strategy_maintain_is_refused_where_nothing_can_be_maintained() -> None:
    with pytest.raises(ConfigurationError, match=r"MAX\(amount\) is not a sum") as refused:
        sql_pipeline(
            name="largest",
            sql="SELECT customer_id, MAX(amount) AS m FROM payments GROUP BY customer_id",
            upstreams={"payments": "customer_id"},
            keys=["customer_id"],
            target="/lake/largest",
            strategy="maintain",
        )
    assert refused.value.fix is not None
    assert "strategy='auto'" in refused.value.fix
    assert isinstance(form_of(None, ["payments"]), Unmaintainable)  # a Python function
    maintained = sql_pipeline(
        name="totals",
        sql="SELECT customer_id, SUM(amount) AS t FROM payments GROUP BY customer_id",
        upstreams={"payments": "customer_id"},
        keys=["customer_id"],
        target="/lake/totals",
    )
    assert maintained.maintainable
    assert maintained.strategy is Strategy.AUTO


def test_auto_runs_maintain_where_it_would_run_incremental() -> None:
    small = decide_strategy(Strategy.AUTO, 1, BIG, replay=False, maintain=True)
    assert small.strategy is Strategy.MAINTAIN
    assert decide_strategy(Strategy.AUTO, 1, BIG, replay=False).strategy is Strategy.INCREMENTAL
    # The whole form where the size rule picks it; a replay stays incremental.
    assert decide_strategy(Strategy.AUTO, BIG, BIG, replay=False, maintain=True).strategy is (
        Strategy.FULL
    )
    replay = decide_strategy(Strategy.AUTO, 1, BIG, replay=True, maintain=True)
    assert replay.strategy is Strategy.INCREMENTAL
    # Measured runs of both: the cheaper, maintain's seconds scaled by the changed bytes.
    history = [
        StrategyRun("b1", Strategy.FULL, 4.0, changed_bytes=10, snapshot_bytes=BIG),
        StrategyRun("b2", Strategy.MAINTAIN, 1.0, changed_bytes=10, snapshot_bytes=BIG),
    ]
    measured = decide_strategy(Strategy.AUTO, 20, BIG, replay=False, history=history, maintain=True)
    assert measured.strategy is Strategy.INCREMENTAL  # measured once against maintain
    assert "maintain ~2.00 s against full ~4.00 s" in measured.reason
    assert estimate_seconds(history, Strategy.MAINTAIN, 40, BIG) == (4.0, 1)
    # With the whole form measured only, maintain is measured once.
    once = decide_strategy(Strategy.AUTO, 1, BIG, replay=False, history=history[:1], maintain=True)
    assert once.strategy is Strategy.MAINTAIN
    assert "measuring maintain once" in once.reason


def test_auto_weighs_maintain_against_incremental_and_keeps_the_cheaper() -> None:
    full = StrategyRun("b1", Strategy.FULL, 4.0, changed_bytes=10, snapshot_bytes=BIG)
    rebuilt = StrategyRun(
        "b2", Strategy.MAINTAIN, 3.0, changed_bytes=10, snapshot_bytes=BIG, rebuilt=True
    )
    maintained = StrategyRun("b3", Strategy.MAINTAIN, 2.0, changed_bytes=10, snapshot_bytes=BIG)
    # A batch that rebuilt the state read the whole upstream: no measure of maintaining,
    # so maintain runs once more.
    assert estimate_seconds([full, rebuilt], Strategy.MAINTAIN, 10, BIG) is None
    again = decide_strategy(
        Strategy.AUTO, 10, BIG, replay=False, history=[full, rebuilt], maintain=True
    )
    assert again.strategy is Strategy.MAINTAIN, again.reason
    # Maintain measured and winning: incremental, never run, is measured once.
    history = [full, rebuilt, maintained]
    tried = decide_strategy(Strategy.AUTO, 10, BIG, replay=False, history=history, maintain=True)
    assert tried.strategy is Strategy.INCREMENTAL, tried.reason
    assert tried.reason.endswith("measuring incremental once"), tried.reason
    # Then the cheaper of the two is kept: incremental here...
    cheaper = StrategyRun("b4", Strategy.INCREMENTAL, 1.5, changed_bytes=10, snapshot_bytes=BIG)
    kept = decide_strategy(
        Strategy.AUTO, 10, BIG, replay=False, history=[*history, cheaper], maintain=True
    )
    assert kept.strategy is Strategy.INCREMENTAL, kept.reason
    assert "incremental ~1.50 s against maintain ~2.00 s against full ~4.00 s" in kept.reason
    assert kept.estimates == {"full": 4.0, "incremental": 1.5, "maintain": 2.0}
    # ... and maintain when it is the cheaper.
    dearer = replace(cheaper, seconds=2.5)
    kept = decide_strategy(
        Strategy.AUTO, 10, BIG, replay=False, history=[*history, dearer], maintain=True
    )
    assert kept.strategy is Strategy.MAINTAIN, kept.reason
    # The whole form winning: neither step form is tried again.
    cheap_full = replace(full, seconds=1.0)
    whole = decide_strategy(
        Strategy.AUTO, 10, BIG, replay=False, history=[cheap_full, maintained], maintain=True
    )
    assert whole.strategy is Strategy.FULL, whole.reason
    # What a batch measured carries the rebuild, and the store reads it back.
    choice = decide_strategy(Strategy.AUTO, 10, BIG, replay=False, maintain=True)
    ran = choice.maintained("payments state rebuilt (none -> v3)", rebuilt=True)
    assert ran.reason.endswith("; payments state rebuilt (none -> v3)")
    measured = MeasuredStrategy(ran, 3.0).measured()
    assert measured["rebuilt"] is True
    assert "rebuilt" not in MeasuredStrategy(choice, 3.0).measured()
    row = {"batch_id": "b2", "detail": json.dumps({"strategy": measured})}
    assert codec.strategy_run(row) == replace(rebuilt, changed_bytes=10, snapshot_bytes=BIG)


def test_a_fallback_is_incremental_and_says_why() -> None:
    choice = decide_strategy(Strategy.AUTO, 1, BIG, replay=False, maintain=True)
    fallen = choice.fell_back("payments is read as SNAPSHOT")
    assert fallen.strategy is Strategy.INCREMENTAL
    assert fallen.reason.endswith("; not maintained: payments is read as SNAPSHOT")
    assert choice.strategy is Strategy.MAINTAIN  # the decision itself is unchanged
