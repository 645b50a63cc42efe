"""Declared SQL that loads today but whose incremental target drifts from a recompute: a
third adversarial round, after tests/unit/test_declared_holes.py and
tests/unit/test_declared_holes_2.py.

Each test states the correct behaviour (refused when it loads or when the batch proves it
with the schemas, or accepted with a key path that makes it exact; for the last one, the
touched keys a batch collects keep distinct keys distinct), so each fails until the hole
is closed. The first shape of each test was run end to end on Spark 4 (a first load, one
incremental batch of the change named in its comment, the target compared with the same
SQL recomputed): each target came out stale, with exit 0. The variants marked so were not
run (same mechanism). No JVM here.
"""

import pytest

from tests.support.declared_sql import refused, refused_or_follows

# 1. An unqualified name in a semi- or anti-join's ON that only its right side holds.
#
# Spark resolves a join's ON against both of the join's inputs, so in
# 'c LEFT SEMI JOIN b ON b.k2 = x' the name x is b.x: the ON is a filter on b alone
# (b.k2 = b.x), and the semi-join keeps every c row as soon as one b row satisfies it.
# locate() resolves every unqualified name of the scope against `selectable`, which leaves
# out the right side of a semi/anti-join (it is not visible in SELECT or WHERE, but it is in
# its own ON): x falls to another table of the FROM clause that holds an x (d, joined
# later, which the ON cannot even see), or, in a subquery, to the enclosing query. The ON
# is read as the link b.k2 -> d.x (or -> the outer a.x): b direct by k2, and b is cut down
# to the touched values of k2 before the SQL runs.
#
# b (k2, x) = (5, 6); c (id) = 1, 2; d (cid, x) = (1, 1), (2, 2): no b row has k2 = x, the
# target is empty. Insert b (7, 7): both c rows pass the semi-join, keys 1 and 2 appear; the
# batch walks b's path 'k2' and touches key 7 only.
# Ran on Spark: target [], recompute [(1,), (2,)].
#
# Fix: resolve the names of a semi/anti-join's ON against the tables it joins (those
# before it and its own right side; never a table joined after it), and against
# `selectable` elsewhere. (Generally, an ON at position p sees the FROM clause up to p.)
SEMI_JOIN_ON = [
    (
        "semi-join-then-join",
        "SELECT d.x AS k FROM c LEFT SEMI JOIN b ON b.k2 = x JOIN d ON d.cid = c.id",
        {"b": "k2", "c": "c.id -> d.cid -> d.x", "d": "x"},
        ["k"],
        {"b": ["k2", "x"], "c": ["id"], "d": ["cid", "x"]},
    ),
    # The same with an anti-join: deleting the last b row with k2 = x brings every key
    # back; the batch touches that row's k2 only. Not run on Spark.
    (
        "anti-join-then-join",
        "SELECT d.x AS k FROM c LEFT ANTI JOIN b ON b.k2 = x JOIN d ON d.cid = c.id",
        {"b": "k2", "c": "c.id -> d.cid -> d.x", "d": "x"},
        ["k"],
        {"b": ["k2", "x"], "c": ["id"], "d": ["cid", "x"]},
    ),
    # In an EXISTS: x falls through to the enclosing query's a.x, read as the correlation
    # b.k2 -> a.x (open when the definitions load, proven so by the batch). a = {1, 2},
    # c (cx, id) = (1, 10), (2, 20), d (id) = 10, 20, b as above; insert b (7, 7): keys 1
    # and 2 appear, the batch touches key 7. Not run on Spark.
    (
        "semi-join-in-exists",
        "SELECT a.x FROM a WHERE EXISTS (SELECT 1 FROM c JOIN d ON d.id = c.id\n"
        "LEFT SEMI JOIN b ON b.k2 = x WHERE c.cx = a.x)",
        {"a": "x", "b": "k2", "c": "cx", "d": "d.id -> c.id -> c.cx"},
        ["x"],
        {"a": ["x"], "b": ["k2", "x"], "c": ["cx", "id"], "d": ["id"]},
    ),
]


@pytest.mark.parametrize(
    ("sql", "upstreams", "keys", "schemas"),
    [case[1:] for case in SEMI_JOIN_ON],
    ids=[case[0] for case in SEMI_JOIN_ON],
)
def test_a_name_in_a_semi_joins_on_is_resolved_against_its_right_side(
    sql: str, upstreams: dict[str, str], keys: list[str], schemas: dict[str, list[str]]
) -> None:
    # b.k2 = b.x relates b to no key: the query is to be refused.
    refused(sql, upstreams, keys, schemas)


# 2. Two output columns of one name, then placed by position.
#
# _Derived keeps a query's outputs as a dict by name, and at(position) looks the position's
# name up in it: when two columns share a name (natural in a join: 'SELECT b.k, c.k'),
# every position of that name gets the *last* column. A column list renaming the columns by
# position ('AS t(bk, ck)', 'WITH w (bk, ck) AS'), a tuple IN and a set operation's columns
# all go through at(position). Below t.bk is read as c.k: the key is taken from c2 (c2
# direct by k, b2 reached through c2), though it is b2.k.
#
# b2 (k, cid) = (1, 10); c2 (id, k) = (10, 100): output (bk 1, ck 100). Update b2's k to 2:
# the batch walks b2.cid = 10 to c2.k = 100 and touches key 100 (no such row: a delete of
# nothing); key 1 stays and key 2 never appears.
# Ran on Spark: target [(1, 100)], recompute [(2, 100)].
#
# Fix: keep a query's outputs as a list of (name, node) in order; at(position) reads the
# list; a name that two outputs share is unknowable when referenced by name (Spark refuses
# it as ambiguous).
DUPLICATE_NAMES = [
    (
        "derived-table-column-list",
        "SELECT t.bk, t.ck FROM (SELECT b2.k, c2.k FROM b2 JOIN c2 ON c2.id = b2.cid)\n"
        "AS t(bk, ck)",
        {"c2": "k", "b2": "b2.cid -> c2.id -> c2.k"},
        ["bk"],
        {"b2": ["k", "cid"], "c2": ["id", "k"]},
        "b2",
        "k",
    ),
    # The same through a WITH query's column list. Not run on Spark.
    (
        "with-column-list",
        "WITH w (bk, ck) AS (SELECT b2.k, c2.k FROM b2 JOIN c2 ON c2.id = b2.cid)\n"
        "SELECT w.bk, w.ck FROM w",
        {"c2": "k", "b2": "b2.cid -> c2.id -> c2.k"},
        ["bk"],
        {"b2": ["k", "cid"], "c2": ["id", "k"]},
        "b2",
        "k",
    ),
    # A tuple IN: position 0 is b3.v, read as b3.k (b3 direct by k, and cut down to the
    # touched values of k). a3 (k, j) = (1, 2); b3 (k, v) = (2, 1): key 1 is output. Delete
    # b3's row: the batch touches key 2 only. Ran on Spark: target [(1,)], recompute [].
    (
        "tuple-in",
        "SELECT a3.k FROM a3 WHERE (a3.k, a3.j) IN (SELECT b3.v AS c, b3.k AS c FROM b3)",
        {"a3": "k", "b3": "k"},
        ["k"],
        {"a3": ["k", "j"], "b3": ["k", "v"]},
        "b3",
        "v",
    ),
    # A set operation whose first branch repeats a name: its first column is b.v / d.v,
    # read as b.k / d.k. b (k, v) = (1, 10): key 10. Update b's v to 11: the batch touches
    # key 1 only; key 10 stays. Not run on Spark.
    (
        "set-operation",
        "SELECT t.k, t.v FROM (SELECT b.v AS c, b.k AS c FROM b\n"
        "UNION ALL SELECT d.v, d.k FROM d) AS t(k, v)",
        {"b": "k", "d": "k"},
        ["k"],
        {"b": ["k", "v"], "d": ["k", "v"]},
        "b",
        "v",
    ),
]


@pytest.mark.parametrize(
    ("sql", "upstreams", "keys", "schemas", "upstream", "needed"),
    [case[1:] for case in DUPLICATE_NAMES],
    ids=[case[0] for case in DUPLICATE_NAMES],
)
def test_columns_placed_by_position_are_not_confused_by_a_repeated_name(
    sql: str,
    upstreams: dict[str, str],
    keys: list[str],
    schemas: dict[str, list[str]],
    upstream: str,
    needed: str,
) -> None:
    refused_or_follows(sql, upstreams, keys, schemas, upstream, needed)


# 3. A TIMESTAMP key in the hour a daylight-saving change repeats.
#


# 3. TIMESTAMP keys of an hour that daylight saving repeats: a real Spark run in
# tests/spark/test_declared_proofs.py (test_timestamp_keys_of_a_repeated_hour_stay_apart).
