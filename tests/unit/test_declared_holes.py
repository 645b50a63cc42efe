"""Declared SQL that loads today but whose incremental target drifts from a recompute.

Each test states the correct behaviour (refused when it loads or when the batch proves it
with the schemas, or accepted with a key path that makes it exact), so each fails until
key_inference closes the hole. Every shape was run end to end on Spark (a first load, one
batch of the change named in its comment, the target compared with the same SQL
recomputed): each target came out stale. No JVM here.
"""

import pytest

from tests.support.declared_sql import refused, refused_or_follows

# 1. A window evaluated before an equality that relates its partition to the keys.
#
# The window mixes the rows of one partition; an equality the query applies after the
# window (an enclosing query's WHERE or ON, an IN's match) holds for the output row only,
# not for the other rows of its partition. key_inference merges the classes anyway, so the
# window passes its check and the upstream's path starts from a column that is not the
# partition column ('id' below, not 'parent'): a partition row whose own id is another
# key changes this key's value and names only its own key; and the upstream, direct, is
# cut down to the touched ids before the window runs, which drops those rows outright.
#
# Fix: snapshot the classes at the window's own scope (its FROM, WHERE, ON, HAVING and
# what is below) and require every reference feeding the window to start its path from
# columns in the partition columns' classes as they stand there (here: 'parent'); an
# equality of an enclosing scope must not widen them.
WINDOW_BEFORE_EQUALITY = [
    # accounts (id, parent) = (1, 1), (2, 1), (3, 3): account 1 is output with n = 2.
    # Delete account 2: the batch touches id 2 only; account 1 keeps n = 2 (recompute: 1).
    # Ran on Spark: target [(1, 2), (3, 1)], recompute [(1, 1), (3, 1)].
    (
        "derived-table-then-where",
        "SELECT t.id, t.n FROM (SELECT id, parent, COUNT(*) OVER (PARTITION BY parent) AS n\n"
        "FROM accounts) t WHERE t.parent = t.id",
        {"accounts": "id"},
        ["id"],
        {"accounts": ["id", "parent"]},
        "accounts",
        "parent",
    ),
    (
        "derived-table-then-join",
        "SELECT a.id, t.n FROM accounts a JOIN (SELECT id, parent, COUNT(*) OVER\n"
        "(PARTITION BY parent) AS n FROM accounts) t ON t.parent = a.id AND t.id = a.id",
        {"accounts": "id"},
        ["id"],
        {"accounts": ["id", "parent"]},
        "accounts",
        "parent",
    ),
    # c = {1, 2}; p (k, j, ts) = (1, 1, 5), (2, 1, 9): the first row of partition j = 1 is
    # (1, 1), so key 1 is output. Update p k = 2 to ts = 1: it becomes the first row, and
    # key 1 drops out; the batch touches key 2 only (p's path starts at k), key 1 stays.
    (
        "in-subquery-with-qualify",
        "SELECT c.k FROM c WHERE (c.k, c.k) IN (SELECT p.k, p.j FROM p\n"
        "QUALIFY ROW_NUMBER() OVER (PARTITION BY p.j ORDER BY p.ts) = 1)",
        {"c": "k", "p": "k"},
        ["k"],
        {"c": ["k"], "p": ["k", "j", "ts"]},
        "p",
        "j",
    ),
]


@pytest.mark.parametrize(
    ("sql", "upstreams", "keys", "schemas", "upstream", "needed"),
    [case[1:] for case in WINDOW_BEFORE_EQUALITY],
    ids=[case[0] for case in WINDOW_BEFORE_EQUALITY],
)
def test_a_window_is_keyed_by_its_own_partition_not_by_a_later_equality(
    sql: str,
    upstreams: dict[str, str],
    keys: list[str],
    schemas: dict[str, list[str]],
    upstream: str,
    needed: str,
) -> None:
    refused_or_follows(sql, upstreams, keys, schemas, upstream, needed)


# 2. A window partitioned by the optional side of an outer join.
#
# customers {1, 2, 3}, payments only for customer 1: customers 2 and 3 are unmatched, so
# t.customer_id is NULL for both and they share one partition (n = 2). Insert customer 4
# (also unmatched): the batch touches key 4 only and, with both upstreams cut down to it,
# writes n = 1 for 4; the recompute gives n = 3 to 2, 3 and 4.
# Ran on Spark: target [(1, 1), (2, 2), (3, 2), (4, 1)], recompute
# [(1, 1), (2, 3), (3, 3), (4, 3)].
#
# Fix: the window check follows links (t.customer_id -> c.customer_id), which hold only
# for matched rows; refuse a window whose partition column is NULL-extended
# (graph.null_extended), as a key column is.
def test_a_window_partitioned_by_a_null_extended_column_is_refused() -> None:
    refused(
        "SELECT c.customer_id, COUNT(*) OVER (PARTITION BY t.customer_id) AS n\n"
        "FROM customers c LEFT JOIN (SELECT customer_id, SUM(amount) AS total FROM payments\n"
        "GROUP BY customer_id) t ON t.customer_id = c.customer_id",
        {"customers": "customer_id", "payments": "customer_id"},
        ["customer_id"],
        {"customers": ["customer_id"], "payments": ["payment_id", "customer_id", "amount"]},
    )
    refused(
        "SELECT c.customer_id, COUNT(*) OVER (PARTITION BY p.customer_id) AS n\n"
        "FROM customers c LEFT JOIN payments p ON p.customer_id = c.customer_id",
        {"customers": "customer_id", "payments": "customer_id"},
        ["customer_id"],
        {"customers": ["customer_id"], "payments": ["payment_id", "customer_id", "amount"]},
    )


# 3. '<=>' against a NULL-extended column.
#
# a = {1, 2}, b = {(k 9, j 5)} (no b row for a's keys), p = {(pid 1, j NULL, v 'x')}.
# Every unmatched a row has b.j NULL, and NULL <=> NULL holds: p's NULL row joins every
# one of them. p's path p.j -> b.j -> b.k walks to the b rows whose j is NULL (none),
# never to the unmatched a keys. Update p's v to 'y' (or insert a second NULL-j row): no
# key is touched, a's rows keep 'x' (the count stays 1) while the recompute changes them.
#
# Fix: a '<=>' (IS NOT DISTINCT FROM) with a NULL-extended side neither merges nor links
# (NULL-extended NULLs are no row's value); with '=' the link is sound, NULL matching
# nothing.
NULL_SAFE_ON_NULLABLE = [
    (
        "inner-join",
        "SELECT a.k, p.v FROM a LEFT JOIN b ON b.k = a.k JOIN p ON p.j <=> b.j",
    ),
    (
        "outer-join",
        "SELECT a.k, MAX(p.v) AS v FROM a LEFT JOIN b ON b.k = a.k\n"
        "LEFT JOIN p ON p.j <=> b.j GROUP BY a.k",
    ),
    (
        "correlated-subquery",
        "SELECT a.k, (SELECT COUNT(*) FROM p WHERE p.j <=> b.j) AS n\n"
        "FROM a LEFT JOIN b ON b.k = a.k",
    ),
    (
        "not-distinct-from",
        "SELECT a.k, p.v FROM a LEFT JOIN b ON b.k = a.k JOIN p ON p.j IS NOT DISTINCT FROM b.j",
    ),
]


@pytest.mark.parametrize(
    "sql", [c[1] for c in NULL_SAFE_ON_NULLABLE], ids=[c[0] for c in NULL_SAFE_ON_NULLABLE]
)
def test_a_null_safe_equality_with_a_null_extended_column_links_nothing(sql: str) -> None:
    refused(
        sql,
        {"a": "k", "b": "k", "p": "p.j -> b.j -> b.k"},
        ["k"],
        {"a": ["k"], "b": ["k", "j"], "p": ["pid", "j", "v"]},
    )


# 4. A LATERAL subquery is read as an opaque generator (sqlglot gives it a UDTF scope), so
# the upstream references inside it are never analysed.
#
# customers (customer_id, amount) = (1, 10), (2, 20): s = 30 for both. Update customer 2
# to 25: the batch touches key 2, cuts customers down to it, and writes s = 25 for 2 and
# nothing for 1; the recompute gives 35 to both.
# Ran on Spark: target [(1, 30), (2, 25)], recompute [(1, 35), (2, 35)].
# (computes_per_key in read/transform_checks.py skips LateralSubquery plans, so the
# batch does not catch it either.)
#
# Fix: analyse a LATERAL subquery's scope like a correlated subquery whose enclosing level
# is the FROM clause before it (its refs, links to the siblings it names).
def test_a_lateral_subquery_over_all_rows_is_refused() -> None:
    refused(
        "SELECT c.customer_id, t.s FROM customers c,\n"
        "LATERAL (SELECT SUM(c2.amount) AS s FROM customers c2) t",
        {"customers": "customer_id"},
        ["customer_id"],
        {"customers": ["customer_id", "amount"]},
    )
    refused(
        "SELECT c.customer_id, p.amount, t.s FROM customers c\n"
        "JOIN payments p ON p.customer_id = c.customer_id,\n"
        "LATERAL (SELECT SUM(p2.amount) AS s FROM payments p2) t",
        {"customers": "customer_id", "payments": "customer_id"},
        ["customer_id"],
        {"customers": ["customer_id"], "payments": ["customer_id", "amount"]},
    )


def test_a_correlated_lateral_subquery_is_proven_or_refused_not_crashed() -> None:
    # payments is read only inside the LATERAL subquery: it has no reference, and the
    # declared path's check indexes an empty tuple (IndexError, not a ConfigurationError).
    # Per key (correlated on the key), this one is exact with payments' path customer_id.
    refused_or_follows(
        "SELECT c.customer_id, t.s FROM customers c,\n"
        "LATERAL (SELECT SUM(p.amount) AS s FROM payments p WHERE p.customer_id = c.customer_id) t",
        {"customers": "customer_id", "payments": "customer_id"},
        ["customer_id"],
        {"customers": ["customer_id"], "payments": ["customer_id", "amount"]},
        "payments",
        "customer_id",
    )


# 5. A star before named columns shifts a set operation's positions.
#
# _Derived.at(position) counts only the named projections, so in
# "SELECT y.*, z.w, z.k" position 0 is read as z.w although it is y's first column, and
# the key column kk (position 2) is taken from z.w in the second branch; it is z.k.
# x (id, k) = (1, 10); y (id) = (2); z (yid, w, k) = (2, 100, 20): rows (1, 10, 10) and
# (2, 100, 20). Update z's k to 21: the batch walks z.w = 100 and touches key 100; key 20
# stays and key 21 never appears.
# Ran on Spark: target [(1, 10, 10), (2, 100, 20)], recompute [(1, 10, 10), (2, 100, 21)].
#
# Fix: at(position) is unknowable when a star precedes the position (and names of a set
# operation come from its first branch only when that branch has no star before them).
def test_a_star_before_a_set_operations_columns_does_not_shift_them() -> None:
    refused_or_follows(
        "SELECT x.*, x.k AS kk FROM x\n"
        "UNION ALL SELECT y.*, z.w, z.k FROM y JOIN z ON z.yid = y.id",
        {"x": "k", "z": "w", "y": "y.id -> z.yid -> z.w"},
        ["kk"],
        {"x": ["id", "k"], "y": ["id"], "z": ["yid", "w", "k"]},
        "z",
        "k",
    )


# 6. A table alias with a column list renames the table's columns by position; the
# analysis reads the new names as the table's own columns.
#
# edges (src, dst, w) = (1, 2, 5), (3, 4, 7) read as e(dst, src, w): e.dst is the real src.
# Output (node_id, w) = (1, 5), (3, 7). The inferred path is edges.dst (the real dst
# column); update w of the edge whose real src is 1: the batch touches key 2 (its real
# dst) and cuts edges down to real dst = 2; key 1 keeps w = 5.
# Ran on Spark: target [(1, 5), (3, 7)], recompute [(1, 6), (3, 7)].
#
# Fix: a table reference with alias columns is a source whose column i is the schema's
# column i (unknowable without the schemas: open at load, placed by the batch).
def test_a_table_alias_column_list_renames_by_position() -> None:
    refused_or_follows(
        "SELECT e.dst AS node_id, e.w FROM edges AS e(dst, src, w)",
        {"edges": "dst"},
        ["node_id"],
        {"edges": ["src", "dst", "w"]},
        "edges",
        "src",
    )
    # The same through a join: incoming edges counted per node, by the real dst.
    refused_or_follows(
        "SELECT n.node_id, COUNT(e.src) AS incoming FROM nodes n\n"
        "LEFT JOIN edges AS e(dst, src) ON e.src = n.node_id GROUP BY n.node_id",
        {"nodes": "node_id", "edges": "src"},
        ["node_id"],
        {"nodes": ["node_id"], "edges": ["src", "dst"]},
        "edges",
        "dst",
    )


# 7. A three-part column name is a struct field, read as alias.column.
#
# sqlglot parses p.c.customer_id as Column(customer_id, table=c, db=p); locate() looks only
# at the table part and takes it for customers c's customer_id. Spark reads payments'
# struct column c: the ON is a filter on payments alone, the join a cross join, and every
# customer sums every payment. customers {1, 2}, payments (customer_id 7, c {7}, amount 5):
# total 5 for both. Insert a payment for 8: the batch touches key 8 only; 1 and 2 keep 5.
# Ran on Spark: target [(1, 5), (2, 5)], recompute [(1, 8), (2, 8)].
#
# Fix: a column with a db (or catalog) part is unknowable (or resolved as table.column.field
# against the schemas), never alias.column.
def test_a_struct_field_is_not_read_as_another_tables_column() -> None:
    refused(
        "SELECT c.customer_id, SUM(p.amount) AS total FROM customers c\n"
        "JOIN payments p ON p.customer_id = p.c.customer_id GROUP BY c.customer_id",
        {"customers": "customer_id", "payments": "customer_id"},
        ["customer_id"],
        {"customers": ["customer_id"], "payments": ["pid", "customer_id", "c", "amount"]},
    )
