"""A generator of declared SQL pipelines, checked by an independent engine.

From a seed, a small grammar draws SQL queries over the four upstreams of
``tests/model/declared.py`` (``regions``, ``customers``, ``orders``, ``payments``):
inner, left, right and full outer joins, self-joins (customers twice, orders twice), hops
(payments -> customers -> regions), aggregates (``COUNT``, ``COUNT(DISTINCT)``, ``SUM``,
``MIN``, ``MAX``, ``COALESCE`` around them) with and without ``HAVING``, sums over one
upstream that the ``maintain`` strategy keeps from change rows, ``GROUP BY`` plain
columns and expressions of a column, scalar subqueries correlated on a key, ``IN`` /
``EXISTS`` / ``NOT EXISTS`` subqueries, ``WITH`` queries, derived tables, filters on
values, ``ROW_NUMBER()`` latest-row-per-key windows, NULL keys, key expressions, ``UNION
ALL`` branches, keyed on ``order_id``, ``customer_id``, ``region_id`` or
``(customer_id, status)``. Each shape carries the key paths its joins imply.

Every shape goes through the loader (``sql_pipeline``, then the batch's own re-proof with
the upstreams' schemas); a refusal is counted by reason. The accepted ones (10-25 of
them) are registered in one registry over one random history of the upstreams (the
commits of :class:`tests.model.declared.DeclaredCase`), every batch drawing each
pipeline's strategy. After each batch, every target must equal, as a multiset of rows,
the same SQL run by DataFusion (delta-rs's ``QueryBuilder``) over the upstreams'
snapshots at the versions the batch pinned. The SQL is a subset both engines read the
same way: no integer division, no floating point, no order- or tie-dependent aggregate,
``ROW_NUMBER`` ordered by a unique column, ``COALESCE`` around every correlated scalar
subquery.

A mismatch, a batch that fails at run time and a query DataFusion cannot run are
findings: each is recorded with the seed, the SQL, the keys and the key paths, and the
case goes on with the others (a failed batch ends the case: it stays open).
"""

import random
import re
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable as RsTable
from deltalake import QueryBuilder
from pyspark.sql import SparkSession

from tests.model.declared import SCHEMAS, STRATEGIES, DeclaredCase
from watermark_dagster.config.declared import KeyPathSpec, paths_for_batch
from watermark_dagster.config.pipeline import Pipeline, sql_pipeline
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.operations.decide import PipelineOutcome
from watermark_dagster.write.layout import REWRITE_BELOW_CONF

# Key paths the grammar's joins imply.
C2O = "customers.customer_id -> orders.customer_id -> orders.order_id"
R2O = (
    "regions.region_id -> customers.region_id -> customers.customer_id -> "
    "orders.customer_id -> orders.order_id"
)
P2O = "payments.customer_id -> orders.customer_id -> orders.order_id"
O2O = "orders.customer_id -> orders.customer_id -> orders.order_id"
P2R = "payments.customer_id -> customers.customer_id -> customers.region_id"
O2R = "orders.customer_id -> customers.customer_id -> customers.region_id"
C2C = "customers.region_id -> customers.region_id -> customers.customer_id"
R2C = "regions.region_id -> customers.region_id -> customers.customer_id"
C2CS = "customers.customer_id -> orders.customer_id -> orders.(customer_id, status)"

COLUMNS = {t: tuple(s.names) for t, s in SCHEMAS.items()}


@dataclass(frozen=True)
class Shape:
    """One drawn query: its family, the SQL, the key paths and the target keys."""

    family: str
    sql: str
    upstreams: dict[str, KeyPathSpec]
    keys: tuple[str, ...]
    columns: tuple[str, ...]  # the output columns, in order

    def describe(self) -> str:
        return (
            f"family {self.family}, keys {list(self.keys)}, upstreams {self.upstreams}\n"
            f"{self.sql.strip()}"
        )


@dataclass
class Query:
    """A query under construction: SELECT items (expression, alias), FROM, the clauses."""

    items: list[tuple[str, str]]
    source: str
    where: list[str] = field(default_factory=list)
    group_by: list[str] = field(default_factory=list)
    having: str = ""

    def text(self) -> str:
        lines = ["SELECT " + ",\n       ".join(f"{e} AS {a}" for e, a in self.items)]
        lines.append(f"FROM {self.source}")
        if self.where:
            lines.append("WHERE " + " AND ".join(self.where))
        if self.group_by:
            lines.append("GROUP BY " + ", ".join(self.group_by))
        if self.having:
            lines.append(f"HAVING {self.having}")
        return "\n".join(lines)


# ------------------------------------------------------------------- the grammar


def _pick(rng: random.Random, n: int, pool: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return rng.sample(pool, min(n, len(pool)))


def _payment_aggregates(alias: str) -> list[tuple[str, str]]:
    a = alias
    return [
        (f"COUNT({a}.payment_id)", "payment_count"),
        ("COUNT(*)", "row_count"),
        (f"COUNT(DISTINCT {a}.amount_cents)", "distinct_amounts"),
        (f"CAST(COALESCE(SUM({a}.amount_cents), 0) AS BIGINT)", "total_paid"),
        (f"MIN({a}.amount_cents)", "smallest"),
        (f"COALESCE(MAX({a}.amount_cents), -1)", "largest"),
        (f"SUM(CASE WHEN {a}.amount_cents > 500 THEN 1 ELSE 0 END)", "big_payments"),
    ]


def _order_aggregates(alias: str) -> list[tuple[str, str]]:
    a = alias
    return [
        (f"COUNT({a}.order_id)", "order_count"),
        (f"COUNT(DISTINCT {a}.status)", "statuses"),
        (f"SUM({a}.amount_cents)", "order_total"),
        (f"MAX({a}.status)", "last_status"),
        (f"MIN({a}.order_id)", "first_order"),
    ]


def _having(rng: random.Random, aggregate: str) -> str:
    """A HAVING condition on a numeric aggregate (a string one becomes its count)."""
    if "status" in aggregate or "name" in aggregate:
        aggregate = "COUNT(*)"
    return rng.choice(
        [
            f"{aggregate} > {rng.randint(0, 2)}",
            f"COALESCE({aggregate}, 0) < {rng.randint(1, 3)}",
            f"{aggregate} >= 1",
        ]
    )


def _order_rows(rng: random.Random) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Orders enriched through their customer (and region), keyed ``order_id``."""
    paths: dict[str, KeyPathSpec] = {"orders": "order_id", "customers": C2O}
    join = rng.choice(["LEFT JOIN", "LEFT JOIN", "JOIN", "RIGHT JOIN", "FULL JOIN", "RIGHT-KEEP"])
    if join == "RIGHT-KEEP":  # orders on the preserved side of a right join
        source = "customers c RIGHT JOIN orders o ON o.customer_id = c.customer_id"
    else:
        source = f"orders o {join} customers c ON o.customer_id = c.customer_id"
    key = rng.choice(["o.order_id"] * 8 + ["o.order_id + 0", "COALESCE(o.order_id, -1)"])
    pool = [
        ("c.name", "name"),
        ("o.amount_cents", "amount_cents"),
        ("o.status", "status"),
        ("UPPER(c.name)", "upper_name"),
        ("COALESCE(c.name, 'none')", "name_or_none"),
        ("CAST(o.amount_cents AS BIGINT) * 2", "double_cents"),
        (f"CASE WHEN o.amount_cents > {rng.randint(100, 900)} THEN 'big' ELSE 'small' END", "size"),
        ("c.region_id", "region_id"),
    ]
    items = [(key, "order_id"), ("o.customer_id", "customer_id"), *_pick(rng, 3, pool)]
    query = Query(items, source)
    if rng.random() < 0.4:
        query.source += (
            f" {rng.choice(['LEFT JOIN', 'JOIN'])} regions r ON c.region_id = r.region_id"
        )
        query.items.append(("r.region_name", "region_name"))
        paths["regions"] = R2O
    extra = rng.random()
    if extra < 0.25:
        query.items.append(
            (
                "COALESCE((SELECT SUM(p.amount_cents) FROM payments p "
                "WHERE p.customer_id = o.customer_id), 0)",
                "customer_paid",
            )
        )
        paths["payments"] = P2O
    elif extra < 0.45:
        exists = rng.choice(["EXISTS", "NOT EXISTS"])
        query.where.append(
            f"{exists} (SELECT 1 FROM payments p WHERE p.customer_id = o.customer_id"
            f" AND p.amount_cents > {rng.randint(0, 800)})"
        )
        paths["payments"] = P2O
    elif extra < 0.55:
        query.where.append(
            "o.customer_id IN (SELECT p.customer_id FROM payments p "
            f"WHERE p.amount_cents > {rng.randint(0, 800)})"
        )
        paths["payments"] = P2O
    if rng.random() < 0.4:
        query.where.append(
            rng.choice(
                [
                    f"o.amount_cents > {rng.randint(0, 900)}",
                    "o.status <> 'new'",
                    "c.name IS NOT NULL",
                    "c.region_id IS NULL",
                    "o.customer_id IS NOT NULL",
                ]
            )
        )
    return query, paths, ("order_id",)


def _order_siblings(rng: random.Random) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Orders joined to the other orders of their customer (a self-join), keyed ``order_id``."""
    on = "o2.customer_id = o.customer_id"
    if rng.random() < 0.5:
        on += " AND o2.order_id <> o.order_id"
    join = rng.choice(["LEFT JOIN", "JOIN"])
    items = [("o.order_id", "order_id"), *_pick(rng, 2, _order_aggregates("o2"))]
    query = Query(items, f"orders o {join} orders o2 ON {on}", group_by=["o.order_id"])
    if rng.random() < 0.3:
        query.having = _having(rng, "COUNT(o2.order_id)")
    # The second reference's path visits orders twice: declared now and then (refused).
    return query, {"orders": rng.choice(["order_id"] * 4 + [O2O])}, ("order_id",)


def _customer_join_aggregate(
    rng: random.Random,
) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Customers joined to payments (or orders), grouped by customer."""
    child, alias, aggregates = rng.choice(
        [("payments", "p", _payment_aggregates("p")), ("orders", "o", _order_aggregates("o"))]
    )
    on = f"{alias}.customer_id = c.customer_id"
    if rng.random() < 0.25:
        on += f" AND {alias}.amount_cents > {rng.randint(0, 800)}"
    form = rng.choice(["left", "left", "inner", "right-keep", "full", "child-keyed"])
    key = "c.customer_id"
    if form == "left":
        source = f"customers c LEFT JOIN {child} {alias} ON {on}"
    elif form == "inner":
        source = f"customers c JOIN {child} {alias} ON {on}"
    elif form == "right-keep":
        source = f"{child} {alias} RIGHT JOIN customers c ON {on}"
    elif form == "full":
        source = f"customers c FULL JOIN {child} {alias} ON {on}"
    else:  # keyed on the child's customer_id: the NULL key of rows without a customer
        source = f"{child} {alias} LEFT JOIN customers c ON {on}"
        key = f"{alias}.customer_id"
    items = [(key, "customer_id"), *_pick(rng, rng.randint(1, 3), aggregates)]
    group_by = [key]
    if rng.random() < 0.5:
        items.append(("MAX(c.name)", "name") if rng.random() < 0.5 else ("c.name", "name"))
        if items[-1][0] == "c.name":
            group_by.append("c.name")
    query = Query(items, source, group_by=group_by)
    if rng.random() < 0.35:
        query.having = _having(rng, rng.choice(aggregates)[0])
    if rng.random() < 0.25:
        query.where.append(
            rng.choice(["c.region_id IS NOT NULL", f"c.customer_id < {rng.randint(2, 9)}"])
        )
    return query, {"customers": "customer_id", child: "customer_id"}, ("customer_id",)


def _customer_derived_aggregate(
    rng: random.Random,
) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Customers joined to a per-customer aggregate in a derived table."""
    child, alias, aggregates = rng.choice(
        [("payments", "p", _payment_aggregates("p")), ("orders", "o", _order_aggregates("o"))]
    )
    picked = _pick(rng, 2, aggregates)
    inner = Query(
        [(f"{alias}.customer_id", "customer_id"), *picked],
        f"{child} {alias}",
        group_by=[f"{alias}.customer_id"],
    )
    if rng.random() < 0.3:
        inner.having = _having(rng, picked[0][0])
    join = rng.choice(["LEFT JOIN", "LEFT JOIN", "JOIN", "FULL JOIN", "RIGHT JOIN"])
    items = [("c.customer_id", "customer_id"), ("c.name", "name")]
    items += [(f"COALESCE(t.{a}, 0)" if "status" not in a else f"t.{a}", a) for _, a in picked]
    if join == "RIGHT JOIN":  # customers preserved
        source = f"({inner.text()}) t RIGHT JOIN customers c ON c.customer_id = t.customer_id"
    else:
        source = f"customers c {join} ({inner.text()}) t ON c.customer_id = t.customer_id"
    return (
        Query(items, source),
        {"customers": "customer_id", child: "customer_id"},
        ("customer_id",),
    )


def _customer_subqueries(
    rng: random.Random,
) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Customers with correlated scalar subqueries and EXISTS / IN filters."""
    paths: dict[str, KeyPathSpec] = {"customers": "customer_id"}
    items = [("c.customer_id", "customer_id"), ("c.name", "name")]
    scalars = [
        (
            "COALESCE((SELECT SUM(p.amount_cents) FROM payments p "
            "WHERE p.customer_id = c.customer_id), 0)",
            "paid",
            "payments",
        ),
        (
            "COALESCE((SELECT COUNT(*) FROM orders o WHERE o.customer_id = c.customer_id), 0)",
            "order_count",
            "orders",
        ),
        (
            "COALESCE((SELECT MAX(o.amount_cents) FROM orders o "
            "WHERE o.customer_id = c.customer_id AND o.status <> 'new'), -1)",
            "largest_order",
            "orders",
        ),
        (
            "COALESCE((SELECT MIN(p.amount_cents) FROM payments p "
            "WHERE c.customer_id = p.customer_id), 0)",
            "smallest_payment",
            "payments",
        ),
    ]
    for expression, alias, upstream in rng.sample(scalars, rng.randint(0, 2)):
        items.append((expression, alias))
        paths[upstream] = "customer_id"
    query = Query(items, "customers c")
    filters = [
        ("EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.customer_id)", "orders"),
        (
            "NOT EXISTS (SELECT 1 FROM payments p WHERE p.customer_id = c.customer_id "
            f"AND p.amount_cents > {rng.randint(0, 900)})",
            "payments",
        ),
        ("c.customer_id IN (SELECT p.customer_id FROM payments p)", "payments"),
        (
            "c.customer_id IN (SELECT o.customer_id FROM orders o "
            f"WHERE o.status = '{rng.choice(['new', 'paid', 'shipped'])}')",
            "orders",
        ),
    ]
    for condition, upstream in rng.sample(filters, rng.randint(0 if len(items) > 2 else 1, 2)):
        query.where.append(condition)
        paths[upstream] = "customer_id"
    return query, paths, ("customer_id",)


def _customer_neighbours(
    rng: random.Random,
) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Customers joined to the other customers of their region (a self-join)."""
    join = rng.choice(["LEFT JOIN", "JOIN"])
    on = "c2.region_id = c.region_id"
    if rng.random() < 0.4:
        on += " AND c2.customer_id <> c.customer_id"
    items = [
        ("c.customer_id", "customer_id"),
        ("COUNT(c2.customer_id)", "neighbours"),
        ("MIN(c2.name)", "first_neighbour_name"),
    ]
    query = Query(items, f"customers c {join} customers c2 ON {on}", group_by=["c.customer_id"])
    paths: dict[str, KeyPathSpec] = {"customers": rng.choice(["customer_id"] * 4 + [C2C])}
    if rng.random() < 0.3:
        query.source += " LEFT JOIN regions r ON r.region_id = c.region_id"
        query.items.append(("MAX(r.region_name)", "region_name"))
        paths["regions"] = R2C
    return query, paths, ("customer_id",)


def _latest_order(rng: random.Random) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Each customer's latest order (ROW_NUMBER partitioned by the key, rn = 1)."""
    partition = rng.choice(["o.customer_id"] * 5 + ["o.status"])
    order = rng.choice(["o.order_id DESC", "o.order_id", "o.amount_cents DESC, o.order_id"])
    where = f" WHERE o.amount_cents > {rng.randint(0, 600)}" if rng.random() < 0.3 else ""
    ranked = (
        "SELECT o.customer_id, o.order_id, o.amount_cents, o.status, "
        f"ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {order}) AS rn "
        f"FROM orders o{where}"
    )
    items = [
        ("t.customer_id", "customer_id"),
        ("t.order_id", "latest_order"),
        ("t.amount_cents", "amount_cents"),
    ]
    paths: dict[str, KeyPathSpec] = {"orders": "customer_id"}
    if rng.random() < 0.4:
        source = f"({ranked}) t LEFT JOIN customers c ON c.customer_id = t.customer_id"
        items.append(("c.name", "name"))
        paths["customers"] = "customer_id"
    else:
        source = f"({ranked}) t"
    return Query(items, source, where=["t.rn = 1"]), paths, ("customer_id",)


def _union_per_customer(
    rng: random.Random,
) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Payments and orders as UNION ALL branches, summed per customer (NULL key included)."""
    branches = (
        "SELECT p.customer_id AS customer_id, p.amount_cents AS cents, 'p' AS kind "
        "FROM payments p UNION ALL "
        "SELECT o.customer_id, o.amount_cents, 'o' FROM orders o"
    )
    if rng.random() < 0.3:
        branches += " WHERE o.status <> 'new'"
    items = [
        ("u.customer_id", "customer_id"),
        ("COUNT(*)", "entries"),
        ("SUM(u.cents)", "cents"),
        ("SUM(CASE WHEN u.kind = 'p' THEN 1 ELSE 0 END)", "payments_n"),
    ]
    query = Query(items, f"({branches}) u", group_by=["u.customer_id"])
    if rng.random() < 0.3:
        query.having = _having(rng, "COUNT(*)")
    return query, {"payments": "customer_id", "orders": "customer_id"}, ("customer_id",)


def _region_aggregate(
    rng: random.Random,
) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Customers (and their payments or orders, or the regions) grouped by region."""
    key = rng.choice(
        ["c.region_id"] * 6 + ["COALESCE(c.region_id, -1)", "c.region_id + 1", "r.region_id"]
    )
    paths: dict[str, KeyPathSpec] = {"customers": "region_id"}
    items = [(key, "region_id"), ("COUNT(DISTINCT c.customer_id)", "customers_n")]
    if key == "r.region_id":
        source = "regions r LEFT JOIN customers c ON c.region_id = r.region_id"
        paths["regions"] = "region_id"
        items.append(("MAX(r.region_name)", "region_name"))
    else:
        source = "customers c"
    child = rng.choice(["payments", "orders", None])
    if child == "payments":
        source += (
            f" {rng.choice(['LEFT JOIN', 'JOIN'])} payments p ON p.customer_id = c.customer_id"
        )
        items += _pick(rng, 2, _payment_aggregates("p"))
        paths["payments"] = P2R
    elif child == "orders":
        source += f" {rng.choice(['LEFT JOIN', 'JOIN'])} orders o ON o.customer_id = c.customer_id"
        items += _pick(rng, 2, _order_aggregates("o"))
        paths["orders"] = O2R
    if key != "r.region_id" and rng.random() < 0.3:
        source += " LEFT JOIN regions r ON r.region_id = c.region_id"
        items.append(("MAX(r.region_name)", "region_name"))
        paths["regions"] = "region_id"
    query = Query(items, source, group_by=[key])
    if rng.random() < 0.3:
        query.having = _having(rng, "COUNT(DISTINCT c.customer_id)")
    return query, paths, ("region_id",)


def _payments_by_region(
    rng: random.Random,
) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Payments summed per region through their customer (a hop), from the payments side."""
    join = rng.choice(["JOIN", "LEFT JOIN"])
    items = [
        ("c.region_id", "region_id"),
        *_pick(rng, 2, _payment_aggregates("p")),
    ]
    query = Query(
        items,
        f"payments p {join} customers c ON p.customer_id = c.customer_id",
        ["c.region_id IS NOT NULL"] if join == "LEFT JOIN" else [],
    )
    query.group_by = ["c.region_id"]
    return query, {"payments": P2R, "customers": "region_id"}, ("region_id",)


def _status_per_customer(
    rng: random.Random,
) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Orders grouped by (customer_id, status): a composite key, NULL customers included."""
    items = [
        ("o.customer_id", "customer_id"),
        ("o.status", "status"),
        ("COUNT(*)", "n"),
        ("SUM(o.amount_cents)", "total"),
    ]
    source = "orders o"
    paths: dict[str, KeyPathSpec] = {"orders": ["customer_id", "status"]}
    if rng.random() < 0.4:
        source += " LEFT JOIN customers c ON c.customer_id = o.customer_id"
        items.append(("MAX(c.name)", "name"))
        paths["customers"] = C2CS
    query = Query(items, source, group_by=["o.customer_id", "o.status"])
    if rng.random() < 0.3:
        query.where.append(f"o.amount_cents > {rng.randint(0, 700)}")
    if rng.random() < 0.3:
        query.having = _having(rng, "COUNT(*)")
    return query, paths, ("customer_id", "status")


def _summed_per_customer(
    rng: random.Random,
) -> tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]:
    """Per-row sums over one child grouped by its customer (NULL customers included):
    what ``maintain`` keeps from change rows. Alone, or in a derived table the customers
    are joined to."""
    child, a = rng.choice([("payments", "p"), ("orders", "o")])
    pool = [
        ("COUNT(*)", "n"),
        (f"COUNT({a}.amount_cents)", "priced"),
        (f"SUM({a}.amount_cents)", "total"),
        (f"CAST(COALESCE(SUM({a}.amount_cents), 0) AS BIGINT)", "total0"),
        (f"SUM(CASE WHEN {a}.amount_cents > 500 THEN 1 ELSE 0 END)", "big"),
        (f"SUM({a}.amount_cents) + COUNT(*)", "mixed"),
    ]
    picked = _pick(rng, rng.randint(1, 3), pool)
    inner = Query(
        [(f"{a}.customer_id", "customer_id"), *picked],
        f"{child} {a}",
        group_by=[f"{a}.customer_id"],
    )
    if rng.random() < 0.3:
        inner.where.append(f"{a}.amount_cents > {rng.randint(0, 700)}")
    if rng.random() < 0.3:
        inner.having = _having(rng, rng.choice(picked)[0])
    if rng.random() < 0.5:
        return inner, {child: "customer_id"}, ("customer_id",)
    items = [("c.customer_id", "customer_id"), ("c.name", "name")]
    items += [(f"COALESCE(t.{alias}, 0)", alias) for _, alias in picked]
    join = rng.choice(["LEFT JOIN", "JOIN", "RIGHT-KEEP"])
    if join == "RIGHT-KEEP":  # customers preserved on the right
        source = f"({inner.text()}) t RIGHT JOIN customers c ON c.customer_id = t.customer_id"
    else:
        source = f"customers c {join} ({inner.text()}) t ON c.customer_id = t.customer_id"
    paths: dict[str, KeyPathSpec] = {"customers": "customer_id", child: "customer_id"}
    return Query(items, source), paths, ("customer_id",)


FAMILIES: dict[
    str, Callable[[random.Random], tuple[Query, dict[str, KeyPathSpec], tuple[str, ...]]]
] = {
    "order_rows": _order_rows,
    "order_siblings": _order_siblings,
    "customer_join_aggregate": _customer_join_aggregate,
    "customer_derived_aggregate": _customer_derived_aggregate,
    "customer_subqueries": _customer_subqueries,
    "customer_neighbours": _customer_neighbours,
    "latest_order": _latest_order,
    "union_per_customer": _union_per_customer,
    "region_aggregate": _region_aggregate,
    "payments_by_region": _payments_by_region,
    "status_per_customer": _status_per_customer,
    "summed_per_customer": _summed_per_customer,
}


def draw_shape(rng: random.Random) -> Shape:
    """One query from the grammar, plain or wrapped in a ``WITH`` query or a derived table."""
    family = rng.choice(list(FAMILIES))
    query, paths, keys = FAMILIES[family](rng)
    columns = tuple(alias for _, alias in query.items)
    sql = query.text()
    wrap = rng.random()
    outer = ", ".join(f"q.{c}" for c in columns)
    if wrap < 0.2:
        sql = f"WITH q AS (\n{sql}\n)\nSELECT {outer} FROM q"
    elif wrap < 0.35:
        sql = f"SELECT {outer} FROM (\n{sql}\n) q"
    return Shape(family, sql, paths, keys, columns)


# ------------------------------------------------------------------- the loader's answer

_REASONS = [
    ("computes the key column", "key computed by an expression"),
    ("optional side", "key from the nullable side"),
    ("null-extended", "key from the nullable side"),
    ("window not partitioned", "window not partitioned by keys"),
    ("no equality", "no equality"),
    ("which the query's equalities do not", "declared path not followed"),
    ("non-deterministic", "non-deterministic"),
    ("twice", "declared path visits an upstream twice"),
]


def refusal_reason(message: str) -> str:
    """A short class of a loader's refusal, from its message."""
    lowered = message.lower()
    for fragment, reason in _REASONS:
        if fragment.lower() in lowered:
            return reason
    text = re.sub(r"^Pipeline '[^']*': ", "", message)
    return re.sub(r"\d+", "N", text)[:70]


def load(name: str, shape: Shape, target: str) -> Pipeline:
    """The pipeline as the definitions load it and a batch re-proves it with the upstreams'
    schemas.

    Raises:
        ConfigurationError: the loader refuses the shape.
    """
    pipeline = sql_pipeline(
        name=name, sql=shape.sql, upstreams=shape.upstreams, keys=list(shape.keys), target=target
    )
    assert pipeline.declared is not None
    paths_for_batch(name, pipeline.declared, list(shape.keys), COLUMNS)
    return pipeline


@dataclass
class SqlStats:
    """What the generated cases did, summed over a run."""

    cases: int = 0
    drawn: int = 0
    accepted: int = 0  # shapes registered and run
    checked: int = 0  # accepted shapes compared with DataFusion at least once
    comparisons: int = 0  # (shape, batch) comparisons
    rows: int = 0  # DataFusion's rows over those comparisons (the checks are not empty)
    batches: int = 0  # batches after which the targets were compared
    commits: int = 0
    incremental_runs: int = 0
    maintain_runs: int = 0
    full_runs: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    families: Counter[str] = field(default_factory=Counter)  # accepted, per family
    mismatches: list[str] = field(default_factory=list)
    run_failures: list[str] = field(default_factory=list)
    # Batches the write refused because the SQL gives one key several rows, with DataFusion
    # giving that key several rows too at the batch's versions: the one-row-per-key check
    # doing its job (the declaration cannot prove keys unique), not a finding.
    duplicate_refusals: list[str] = field(default_factory=list)
    datafusion_errors: list[str] = field(default_factory=list)

    def add(self, other: "SqlStats") -> None:
        for name in self.__dataclass_fields__:
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(mine, Counter):
                mine.update(theirs)
            elif isinstance(mine, list):
                mine.extend(theirs)
            else:
                setattr(self, name, mine + theirs)

    def summary(self) -> str:
        counts = {
            n: getattr(self, n)
            for n in self.__dataclass_fields__
            if isinstance(getattr(self, n), int)
        }
        return (
            f"{counts}\nfindings: mismatches {len(self.mismatches)}, run-time failures "
            f"{len(self.run_failures)}, DataFusion errors {len(self.datafusion_errors)}\n"
            f"refused at run time, several rows for a key confirmed by DataFusion: "
            f"{len(self.duplicate_refusals)}\n"
            f"accepted by family: {dict(sorted(self.families.items()))}\n"
            f"refused by reason: {dict(self.refused.most_common())}"
        )


def draw_accepted(
    rng: random.Random, n: int, root: Path, stats: SqlStats
) -> dict[str, tuple[Shape, Pipeline]]:
    """Draw shapes until ``n`` are accepted (distinct SQL), counting the refused by reason."""
    accepted: dict[str, tuple[Shape, Pipeline]] = {}
    seen: set[str] = set()
    for _ in range(n * 20):
        if len(accepted) == n:
            break
        shape = draw_shape(rng)
        if shape.sql in seen:
            continue
        seen.add(shape.sql)
        stats.drawn += 1
        name = f"g{len(accepted):02d}"
        try:
            pipeline = load(name, shape, str(root / "targets" / name))
        except ConfigurationError as e:
            stats.refused[refusal_reason(str(e))] += 1
            continue
        accepted[name] = (shape, pipeline)
        stats.families[shape.family] += 1
    stats.accepted += len(accepted)
    return accepted


# ------------------------------------------------------------------- the comparison

Row = tuple[Any, ...]


def _normal(value: Any) -> Any:
    """One value as both engines' rows are compared: integral decimals as ints."""
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def rows_of(table: pa.Table, columns: tuple[str, ...]) -> Counter[Row]:
    """The multiset of a table's rows over ``columns`` (matched without case)."""
    names = {n.lower(): n for n in table.column_names}
    picked = table.select([names[c.lower()] for c in columns]).to_pylist()
    return Counter(tuple(_normal(r[names[c.lower()]]) for c in columns) for r in picked)


def datafusion_rows(sql: str, paths: dict[str, str], versions: dict[str, int]) -> pa.Table:
    """The query run by DataFusion over each upstream's snapshot at ``versions``."""
    builder = QueryBuilder()
    for upstream, version in versions.items():
        builder = builder.register(upstream, RsTable(paths[upstream], version=version))
    return pa.table(builder.execute(sql).read_all())


def target_table(path: str) -> pa.Table:
    """A target's rows without the internal ``_wm_`` columns (deletion vectors applied)."""
    table = pa.table(
        QueryBuilder().register("t", RsTable(path)).execute("SELECT * FROM t").read_all()
    )
    return table.select([c for c in table.column_names if not c.startswith("_wm_")])


def difference(got: Counter[Row], want: Counter[Row], width: int) -> str:
    """Up to 12 keys (the first ``width`` columns) whose rows differ."""
    by_key: dict[Row, tuple[list[Row], list[Row]]] = {}
    for row in (got - want) + (want - got):
        by_key.setdefault(row[:width], ([], []))
    for row, count in got.items():
        if row[:width] in by_key:
            by_key[row[:width]][0].extend([row] * count)
    for row, count in want.items():
        if row[:width] in by_key:
            by_key[row[:width]][1].extend([row] * count)
    keys = sorted(by_key, key=repr)[:12]
    return "\n".join(f"  key {k}: target {by_key[k][0]} != DataFusion {by_key[k][1]}" for k in keys)


# ------------------------------------------------------------------- the case

# What a write's one-row-per-key check says (write/merge.py, duplicate_key_error).
DUPLICATE_KEY = "the transform returned several rows for key"


class SqlShapesCase(DeclaredCase):
    """Generated declared SQL pipelines over one random history of the four upstreams."""

    # No rewrite: what is checked here is the derivation, and a rewrite would mend a wrong
    # derivation silently, where a `full` batch reports it as drift (auto, on these small
    # tables, then picks `full`).
    strategies = tuple(s for s in STRATEGIES if s != "rewrite")
    change_feed = "minimal"

    def __init__(
        self, spark: SparkSession, root: Path, seed: int, steps: int = 3, shapes: int = 20
    ) -> None:
        self.sql_stats = SqlStats(cases=1)
        self.generated = draw_accepted(
            random.Random(f"{seed}-shapes"), shapes, root, self.sql_stats
        )
        self.strategy_of: dict[str, str] = {}
        self.checked: set[str] = set()
        self.broken = False
        super().__init__(spark, root, seed, steps)

    def pipeline_names(self) -> list[str]:
        return list(self.generated)

    def _pipelines(self) -> list[Pipeline]:
        return [pipeline for _, pipeline in self.generated.values()]

    def execute(self, pipeline: str, batch_id: str) -> PipelineOutcome | None:
        """Run one pipeline of a batch; an exception is a finding, recorded."""
        self.strategy_of[pipeline] = self.registry.pipelines[pipeline].strategy
        try:
            outcome = super().execute(pipeline, batch_id)
        except Exception as e:  # a batch an accepted shape cannot run
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            shape = self.generated[pipeline][0]
            found = (
                f"seed {self.seed}, {pipeline}, batch {batch_id}, strategy "
                f"{self.strategy_of[pipeline]}: {type(e).__name__}: {first}\n{shape.describe()}"
            )
            confirmed = DUPLICATE_KEY in first and self._duplicated(shape, batch_id)
            stats = self.sql_stats
            (stats.duplicate_refusals if confirmed else stats.run_failures).append(found)
            self.broken = True  # the batch stays open: the case ends here
            return None
        write = outcome.write if outcome is not None else None
        if write is not None and write.drift:
            # A full batch found keys stale that its own changes did not touch: an earlier
            # incremental batch of this shape derived them wrong (the full batch mended
            # them, so the targets alone would not show it).
            self.sql_stats.mismatches.append(
                f"seed {self.seed}, {pipeline}, batch {batch_id}: a full batch found "
                f"{write.drift} drifted key(s), e.g. {list(write.drift_sample)}\n"
                f"{self.generated[pipeline][0].describe()}"
            )
        return outcome

    def _duplicated(self, shape: Shape, batch_id: str) -> bool:
        """True when DataFusion's answer to ``shape``'s SQL over the snapshots ``batch_id``
        pins gives some key several rows."""
        batch = next(b for b in self.store.batches() if b.batch_id == batch_id)
        versions: dict[str, int] = {}
        for upstream in shape.upstreams:
            version = batch.inputs[upstream].snapshot_version
            if version is None:
                return False
            versions[upstream] = version
        try:
            rows = datafusion_rows(shape.sql, self.paths, versions)
        except Exception:  # the SQL is not in the common subset: not confirmed
            return False
        keys = rows_of(rows, shape.keys)
        return any(count > 1 for count in keys.values())

    def check_targets(self) -> None:
        """With no scheduled batch open, every target equals DataFusion's answer to its SQL
        over the snapshots the newest completed batch pinned."""
        if self.store.open_batch() is not None:
            return
        # A batch pins only the upstreams its pipelines read: a case may read no regions.
        pinned = self.pins(
            sorted({u for p in self.registry.pipelines.values() for u in p.upstreams})
        )
        if pinned is None:
            return
        batch_id, versions = pinned
        self.sql_stats.batches += 1
        for name, (shape, _) in self.generated.items():
            try:
                want = rows_of(datafusion_rows(shape.sql, self.paths, versions), shape.columns)
            except Exception as e:  # the generator's SQL is not in the common subset
                self.sql_stats.datafusion_errors.append(
                    f"seed {self.seed}, {name}: {str(e).splitlines()[0]}\n{shape.describe()}"
                )
                continue
            got = rows_of(target_table(self.targets[name]), shape.columns)
            self.sql_stats.comparisons += 1
            self.sql_stats.rows += want.total()
            self.checked.add(name)
            if got != want:
                self.sql_stats.mismatches.append(
                    f"seed {self.seed}, {name} after {batch_id} (pinned {versions}), strategy "
                    f"{self.strategy_of.get(name)}:\n{shape.describe()}\n"
                    + difference(got, want, len(shape.keys))
                    + "\nlast events:\n"
                    + "\n".join(f"  {line}" for line in self.log[-20:])
                )

    def run_sql(self) -> SqlStats:
        self.seed_tables()
        self.cycle()  # the first load
        self.check_targets()
        for table in ("payments", "orders", "customers"):  # each child's join key moves once
            ids = self._ids(table)
            if ids and not self.broken:
                self._move(table, RsTable(self.paths[table]), ids)
                self.stats.commits += 1
        if not self.broken:
            self.cycle()
            self.check_targets()
        for _ in range(self.steps):
            if self.broken:
                break
            for _ in range(self.rng.randint(2, 4)):
                self.commit()
            self.cycle()
            self.check_targets()
        s = self.sql_stats
        s.checked = len(self.checked)
        s.commits = self.stats.commits
        s.incremental_runs, s.full_runs = self.stats.incremental_runs, self.stats.full_runs
        s.maintain_runs = self.stats.maintain_runs
        return s


def run_sql_case(
    spark: SparkSession, root: Path, seed: int, steps: int = 3, shapes: int = 20
) -> SqlStats:
    """Run one generated case in a fresh folder under ``root``."""
    folder = root / f"sql-shapes-{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        return SqlShapesCase(spark, folder, seed, steps, shapes).run_sql()
    except BaseException:
        print(
            f"sql shapes case failed: seed={seed} steps={steps} shapes={shapes} (replay: "
            f"WATERMARK_SQL_SHAPES_SEEDS={seed} pytest tests/model/test_sql_shapes.py)"
        )
        raise
    finally:
        spark.conf.unset(REWRITE_BELOW_CONF)
        shutil.rmtree(folder, ignore_errors=True)
