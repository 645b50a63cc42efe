"""Spark's analyzed plan read from its text, as the checks of a Python full transform see
it over Spark Connect (read/plan_text.py). The texts are Spark 4.2's, copied from a Connect
server's EXPLAIN EXTENDED; tests/spark/test_engine.py runs the checks on a live server."""

import pytest

from watermark_dagster.read.plan_text import ANALYZED, analyzed_tree

SCALAR = f"""== Parsed Logical Plan ==
'Project ['a]
{ANALYZED}
customer_id: bigint, order_id: bigint, name: string, s: double
Project [customer_id#956L, order_id#955L, name#505, s#2395]
+- Project [customer_id#956L, (cast(order_id#955L as double) / cast(scalar-subquery#2392 [] as double)) AS s#2395]
   :  +- Aggregate [sum(order_id#2393L) AS sum(order_id)#2397L]
   :     +- Relation [order_id#2393L,customer_id#2394L] parquet
   +- Join LeftOuter, (customer_id#956L = customer_id#504L)
      :- Relation [order_id#955L,customer_id#956L] parquet
      +- LogicalRDD [customer_id#504L, name#505], false

== Optimized Logical Plan ==
Project [a#1]
"""  # noqa: E501

CORRELATED = """Project [customer_id#1L, scalar-subquery#9 [customer_id#1L] AS total#10L]
:  +- Aggregate [sum(amount#5L) AS sum(amount)#11L]
:     +- Filter (customer_id#4L = outer(customer_id#1L))
:        +- Relation [payment_id#3L,customer_id#4L,amount#5L] parquet
+- Aggregate [customer_id#1L], [customer_id#1L, count(1) AS n#2L]
   +- Relation [customer_id#1L,name#2] parquet
"""


def test_the_tree_puts_subquery_plans_apart_from_children() -> None:
    root = analyzed_tree(SCALAR)
    assert root.name == "Project"
    (project,) = root.children
    (subquery,) = project.subqueries
    assert (subquery.name, [c.name for c in subquery.children]) == ("Aggregate", ["Relation"])
    (join,) = project.children
    assert [c.name for c in join.children] == ["Relation", "LogicalRDD"]
    leaves = [n.name for n in root.walk() if not n.children]
    assert leaves == ["Relation", "Relation", "LogicalRDD"]
    # An aggregate with no grouping shows one list; with grouping, two.
    assert not subquery.grouped
    assert not subquery.correlated


def test_a_subquery_reading_the_query_around_it_is_correlated() -> None:
    root = analyzed_tree(CORRELATED)
    (subquery,) = root.subqueries
    assert subquery.correlated
    (grouped,) = root.children
    assert grouped.grouped


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "no plan in the text"),
        (f"{ANALYZED}\na: int\n", "no plan in the text"),
        ("Project [a]\n      +- Relation [a] parquet\n", "deeper than its parent allows"),
        ("Project [a]\nProject [b]\n", "a second root"),
    ],
    ids=["empty", "no-tree", "too-deep", "two-roots"],
)
def test_what_is_not_a_plan_is_said_so(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        analyzed_tree(text)
