"""The property-based check of declared pipelines: the derived incremental transform keeps
every target equal to its full recompute, batch after batch.

One case, from a seed: four upstreams with change data feed (``regions``, ``customers``,
``orders``, ``payments``) get random commits made with delta-rs: inserts of shuffled ids
(deleted ids come back), updates of values and of join keys (an order moves to another
customer, a customer to another region, a payment to another customer), deletes (parents
that still have children included: the left joins then give nulls), references to parents
that do not exist, multi-row MERGE commits that insert, update and delete rows of one
customer's orders at once, and whole-table rewrites that delete and re-insert every row in
one commit. Join keys are NULL now and then (an order without a customer, a customer
without a region, a payment without a customer). Seven declared pipelines read them:

* ``oc_fn`` / ``oc_sql``: orders left join customers, keyed ``order_id`` (a two-way join;
  customers reach orders through ``orders.customer_id``);
* ``ocr_fn`` / ``ocr_sql``: orders left join customers left join regions, keyed
  ``order_id`` (a three-way join; regions reach orders through customers);
* ``totals_fn`` / ``totals_sql``: customers left join payments grouped by customer,
  keyed ``customer_id`` (an aggregate);
* ``by_region_sql``: customers left join payments grouped by ``region_id``, keyed
  ``region_id`` (an aggregate with a NULL group: the customers without a region, which
  customers move into and out of; payments reach it through their customer).

Each case also draws one SQL shape that cannot be derived (a subquery or an aggregate over
a whole upstream, a window, a non-deterministic function, a group by another column) and
checks it is refused when it loads.

Between commits the system runs cycles through the production functions, as
:class:`tests.model.harness.Case` does, interrupted by crashes at every fault point, a
failing full transform, replays of applied ranges and backfills of old batches. Whenever
no scheduled batch is open, every target must equal the recompute at the pinned versions
of the newest completed batch; after draining, those are the latest versions. The
reference is plain Python over the upstreams' snapshots read with delta-rs at those
versions: it shares nothing with Spark or with the derivation under test.
"""

import random
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import QueryBuilder, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.model.harness import CRASH_POINTS, draw_merge_mode
from watermark_dagster.config.pipeline import Pipeline, declared_pipeline, sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.faults import SimulatedCrash, simulate_crash_at
from watermark_dagster.core.outcomes import succeeded_pipelines
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.core.records import Batch, BatchKind, BatchStatus
from watermark_dagster.errors import BatchStateError, ConfigurationError
from watermark_dagster.observe.log import latest_local_version
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import finalize_batch, look_before_planning, plan_next
from watermark_dagster.operations.decide import PipelineOutcome
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.store import WatermarkStore
from watermark_dagster.write.layout import REWRITE_BELOW_CONF

SCHEMAS = {
    "regions": pa.schema([("region_id", pa.int64()), ("region_name", pa.string())]),
    "customers": pa.schema(
        [("customer_id", pa.int64()), ("name", pa.string()), ("region_id", pa.int64())]
    ),
    "orders": pa.schema(
        [
            ("order_id", pa.int64()),
            ("customer_id", pa.int64()),
            ("amount_cents", pa.int64()),
            ("status", pa.string()),
        ]
    ),
    "payments": pa.schema(
        [("payment_id", pa.int64()), ("customer_id", pa.int64()), ("amount_cents", pa.int64())]
    ),
}
KEY = {"regions": "region_id", "customers": "customer_id", "orders": "order_id"} | {
    "payments": "payment_id"
}
# Ids are drawn from small pools, so deleted ids are reused and parents are often missing.
POOL = {"regions": 6, "customers": 10, "orders": 30, "payments": 30}
# Drawn per batch for every pipeline (incremental twice as often: it is the derived form).
STRATEGIES = ("incremental", "incremental", "full", "rewrite", "auto")
# A maintained aggregate's state is written before its target: a crash between them too.
DECLARED_CRASH_POINTS = (*CRASH_POINTS, "after_state_commit")

UPSTREAMS = tuple(SCHEMAS)

BY_REGION = {
    "customers": "region_id",
    "payments": "payments.customer_id -> customers.customer_id -> customers.region_id",
}
CUSTOMERS_TO_ORDERS = "customers.customer_id -> orders.customer_id -> orders.order_id"
REGIONS_TO_ORDERS = (
    "regions.region_id -> customers.region_id -> customers.customer_id -> "
    "orders.customer_id -> orders.order_id"
)

# Output columns per pipeline kind, key first.
COLUMNS = {
    "oc": ("order_id", "customer_id", "name", "amount_cents", "status"),
    "ocr": ("order_id", "customer_id", "name", "region_id", "region_name", "amount_cents")
    + ("status",),
    "totals": ("customer_id", "name", "total_paid_cents", "payment_count"),
    "by_region": ("region_id", "customer_count", "total_paid_cents", "payment_count"),
}
# The NULL group in SQL only: its function form would add time, not coverage.
PIPELINES = {
    f"{kind}_{form}": kind
    for kind in COLUMNS
    for form in ("fn", "sql")
    if (kind, form) != ("by_region", "fn")
}
FUNCTION_PIPELINES = tuple(p for p in PIPELINES if p.endswith("_fn"))

OC_SQL = """
SELECT o.order_id, o.customer_id, c.name, o.amount_cents, o.status
FROM orders o LEFT JOIN customers c ON o.customer_id = c.customer_id
"""
OCR_SQL = """
SELECT o.order_id, o.customer_id, c.name, c.region_id, r.region_name, o.amount_cents, o.status
FROM orders o
LEFT JOIN customers c ON o.customer_id = c.customer_id
LEFT JOIN regions r ON c.region_id = r.region_id
"""
BY_REGION_SQL = """
SELECT c.region_id,
       COUNT(DISTINCT c.customer_id) AS customer_count,
       CAST(COALESCE(SUM(p.amount_cents), 0) AS BIGINT) AS total_paid_cents,
       COUNT(p.payment_id) AS payment_count
FROM customers c
LEFT JOIN payments p ON p.customer_id = c.customer_id
GROUP BY c.region_id
"""
TOTALS_SQL = """
SELECT c.customer_id, c.name,
       CAST(COALESCE(t.total, 0) AS BIGINT) AS total_paid_cents,
       CAST(COALESCE(t.n, 0) AS BIGINT) AS payment_count
FROM customers c
LEFT JOIN (
    SELECT customer_id, SUM(amount_cents) AS total, COUNT(*) AS n
    FROM payments GROUP BY customer_id
) t ON c.customer_id = t.customer_id
"""

OC = {"orders": "order_id", "customers": CUSTOMERS_TO_ORDERS}
TOTALS = {"customers": "customer_id", "payments": "customer_id"}
OC_FROM = "FROM orders o LEFT JOIN customers c ON o.customer_id = c.customer_id"
# (sql, upstreams, keys, what the refusal says): shapes whose rows for one key depend on
# other keys' rows, or that are not deterministic. Each case draws one.
REFUSED = [
    (
        "SELECT c.customer_id, SUM(p.amount_cents) AS total FROM customers c JOIN payments p "
        "ON p.customer_id = c.customer_id GROUP BY c.customer_id "
        "HAVING SUM(p.amount_cents) > (SELECT AVG(amount_cents) * 2 FROM payments)",
        TOTALS,
        ["customer_id"],
        "reads upstream 'payments' (as 'payments', in a subquery) with no equality",
    ),
    (
        "SELECT c.customer_id, t.n FROM customers c CROSS JOIN "
        "(SELECT COUNT(*) AS n FROM payments) t",
        TOTALS,
        ["customer_id"],
        "reads upstream 'payments' (as 'payments', in a derived table) with no equality",
    ),
    (
        "SELECT c.region_id AS customer_id, COUNT(*) AS n FROM customers c "
        "LEFT JOIN payments p ON p.customer_id = c.customer_id GROUP BY c.region_id",
        TOTALS,
        ["customer_id"],
        "but its declared key path is 'customer_id', which the query's equalities do not",
    ),
    (
        "SELECT o.order_id, RANK() OVER (PARTITION BY o.customer_id ORDER BY o.amount_cents) "
        f"AS r {OC_FROM}",
        OC,
        ["order_id"],
        "uses a window not partitioned by the target keys",
    ),
    (
        f"SELECT o.order_id, c.name {OC_FROM} "
        "WHERE EXISTS (SELECT 1 FROM customers WHERE region_id IS NULL)",
        OC,
        ["order_id"],
        "reads upstream 'customers' (as 'customers', in a subquery) with no equality",
    ),
    (
        f"SELECT o.order_id, rand() AS draw {OC_FROM}",
        OC,
        ["order_id"],
        "calls rand, which is non-deterministic",
    ),
]


def join_orders_customers(orders: DataFrame, customers: DataFrame) -> DataFrame:
    """Each order with its customer's name (null when the customer is missing)."""
    names = customers.select("customer_id", "name")
    return orders.join(names, "customer_id", "left").select(*COLUMNS["oc"])


def join_orders_regions(orders: DataFrame, customers: DataFrame, regions: DataFrame) -> DataFrame:
    """Each order with its customer's name, region and region name."""
    people = customers.select("customer_id", "name", "region_id")
    return (
        orders.join(people, "customer_id", "left")
        .join(regions.select("region_id", "region_name"), "region_id", "left")
        .select(*COLUMNS["ocr"])
    )


def payment_totals(customers: DataFrame, payments: DataFrame) -> DataFrame:
    """Each customer with the sum and count of its payments (0 without any)."""
    totals = payments.groupBy("customer_id").agg(
        F.sum("amount_cents").alias("total"), F.count(F.lit(1)).alias("n")
    )
    return customers.join(totals, "customer_id", "left").select(
        "customer_id",
        "name",
        F.coalesce("total", F.lit(0)).cast("long").alias("total_paid_cents"),
        F.coalesce("n", F.lit(0)).cast("long").alias("payment_count"),
    )


# ------------------------------------------------------------------- the reference

Row = tuple[Any, ...]


def reference(kind: str, tables: dict[str, list[dict[str, Any]]]) -> list[Row]:
    """The target of a ``kind`` pipeline recomputed in plain Python from the upstreams'
    rows (each upstream's key is unique), sorted by key."""
    customers = {c["customer_id"]: c for c in tables["customers"]}
    regions = {r["region_id"]: r for r in tables["regions"]}
    rows: list[Row] = []
    if kind in ("oc", "ocr"):
        for o in tables["orders"]:
            c = customers.get(o["customer_id"]) if o["customer_id"] is not None else None
            name = c["name"] if c else None
            if kind == "oc":
                rows.append((o["order_id"], o["customer_id"], name, o["amount_cents"], o["status"]))
                continue
            region_id = c["region_id"] if c else None
            r = regions.get(region_id) if region_id is not None else None
            rows.append(
                (
                    o["order_id"],
                    o["customer_id"],
                    name,
                    region_id,
                    r["region_name"] if r else None,
                    o["amount_cents"],
                    o["status"],
                )
            )
    elif kind == "by_region":
        groups: dict[int | None, list[int]] = {}  # region -> [customers, total, payments]
        for c in tables["customers"]:
            group = groups.setdefault(c["region_id"], [0, 0, 0])
            group[0] += 1
            for p in tables["payments"]:
                if p["customer_id"] == c["customer_id"]:
                    group[1] += p["amount_cents"]
                    group[2] += 1
        rows = [(region, *values) for region, values in groups.items()]
    else:
        paid: dict[int, list[int]] = {}
        for p in tables["payments"]:
            if p["customer_id"] is not None:
                paid.setdefault(p["customer_id"], []).append(p["amount_cents"])
        for c in tables["customers"]:
            amounts = paid.get(c["customer_id"], [])
            rows.append((c["customer_id"], c["name"], sum(amounts), len(amounts)))
    return sorted(rows, key=_by_key)


def _by_key(row: "Row") -> tuple[bool, Any]:
    """Rows sorted by their key, the NULL key first."""
    return (row[0] is not None, row[0])


def target_rows(path: str, columns: tuple[str, ...]) -> list[Row]:
    """A target's current rows (``columns``, sorted by the first), read through delta-rs's
    query engine, which applies the merge targets' deletion vectors."""
    table = pa.table(
        QueryBuilder().register("t", RsTable(path)).execute("SELECT * FROM t").read_all()
    )
    picked = table.select(list(columns)).to_pylist()
    return sorted((tuple(r[c] for c in columns) for r in picked), key=_by_key)


def _difference(got: list[Row], want: list[Row]) -> str:
    g, w = {r[0]: r for r in got}, {r[0]: r for r in want}
    lines = [
        f"  key {k}: target {g.get(k)} != recompute {w.get(k)}"
        for k in sorted(g.keys() | w.keys(), key=lambda k: (k is not None, k))
        if g.get(k) != w.get(k)
    ]
    return "\n".join(lines[:12])


# ------------------------------------------------------------------- the case


@dataclass
class Stats:
    """What a case did, summed over a run."""

    cases: int = 0
    commits: int = 0
    cycles: int = 0
    crashes: int = 0
    failures: int = 0
    replays: int = 0
    backfills: int = 0
    checks: int = 0
    refused: int = 0
    null_groups: int = 0  # checks at which by_region_sql held a NULL group
    incremental_runs: int = 0  # pipeline runs by strategy (drawn per batch)
    maintain_runs: int = 0
    full_runs: int = 0
    rewrite_runs: int = 0

    def add(self, other: "Stats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class DeclaredCase:
    """One random history of the four upstreams, run through the six declared pipelines
    against real Spark and Delta tables under ``root``."""

    # What each batch draws every pipeline's strategy from, and the change feed its target
    # promises (None: the registry's default).
    strategies: tuple[str, ...] = STRATEGIES
    change_feed: str | None = None

    def __init__(self, spark: SparkSession, root: Path, seed: int, steps: int = 3) -> None:
        self.spark, self.root, self.seed, self.steps = spark, root, seed, steps
        self.rng = random.Random(seed)
        self.merges = random.Random(f"{seed}-merges")  # apart, so histories stay as seeded
        self.stats = Stats(cases=1)
        self.failing: set[str] = set()
        self.paths = {u: str(root / u) for u in UPSTREAMS}
        self.targets = {p: str(root / "targets" / p) for p in self.pipeline_names()}
        self.registry = Registry(
            upstreams=[DeltaUpstream(name=u, path=p) for u, p in self.paths.items()],
            pipelines=self._pipelines(),
        )
        self.consumers = {
            u: sorted(p.name for p in self.registry.pipelines.values() if u in p.upstreams)
            for u in UPSTREAMS
        }
        self.store = WatermarkStore(root / "control")
        self.observer = Observer()
        self.high_water: dict[str, int] = {}
        self.log: list[str] = []  # what happened, for the failure message

    def drawn(self, pipeline: Pipeline) -> tuple[str, ...]:
        """The strategies a batch draws ``pipeline``'s from: where its declared SQL is
        maintainable, ``maintain`` as often as all the others together, and only
        ``maintain`` until a batch of the case has run it."""
        if not pipeline.maintainable:
            return self.strategies
        if not self.stats.maintain_runs:
            return ("maintain",)
        return self.strategies + ("maintain",) * len(self.strategies)

    def pipeline_names(self) -> list[str]:
        """The pipelines :meth:`_pipelines` declares (each gets a target folder)."""
        return list(PIPELINES)

    def _fail_if_set(self, name: str) -> None:
        if name in self.failing:
            raise RuntimeError(f"injected failure in {name}")

    def _pipelines(self) -> list[Pipeline]:
        # The full functions close over ``self.failing``: a user's bug, then fixed.
        def oc_fn(orders: DataFrame, customers: DataFrame) -> DataFrame:
            self._fail_if_set("oc_fn")
            return join_orders_customers(orders, customers)

        def ocr_fn(orders: DataFrame, customers: DataFrame, regions: DataFrame) -> DataFrame:
            self._fail_if_set("ocr_fn")
            return join_orders_regions(orders, customers, regions)

        def totals_fn(customers: DataFrame, payments: DataFrame) -> DataFrame:
            self._fail_if_set("totals_fn")
            return payment_totals(customers, payments)

        oc = {"orders": "order_id", "customers": CUSTOMERS_TO_ORDERS}
        ocr = oc | {"regions": REGIONS_TO_ORDERS}
        totals = {"customers": "customer_id", "payments": "customer_id"}
        t = self.targets
        return [
            declared_pipeline(upstreams=oc, keys=["order_id"], target=t["oc_fn"])(oc_fn),
            declared_pipeline(upstreams=ocr, keys=["order_id"], target=t["ocr_fn"])(ocr_fn),
            declared_pipeline(upstreams=totals, keys=["customer_id"], target=t["totals_fn"])(
                totals_fn
            ),
            sql_pipeline(
                name="oc_sql", sql=OC_SQL, upstreams=oc, keys=["order_id"], target=t["oc_sql"]
            ),
            sql_pipeline(
                name="ocr_sql", sql=OCR_SQL, upstreams=ocr, keys=["order_id"], target=t["ocr_sql"]
            ),
            sql_pipeline(
                name="totals_sql",
                sql=TOTALS_SQL,
                upstreams=totals,
                keys=["customer_id"],
                target=t["totals_sql"],
            ),
            sql_pipeline(
                name="by_region_sql",
                sql=BY_REGION_SQL,
                upstreams=BY_REGION,
                keys=["region_id"],
                target=t["by_region_sql"],
            ),
        ]

    # ---------------------------------------------------------------- upstream commits

    # Commits are made with delta-rs, as a producer outside Spark would, in milliseconds.

    def _ids(self, table: str, version: int | None = None) -> list[int]:
        dt = RsTable(self.paths[table], version=version)
        return dt.to_pyarrow_table(columns=[KEY[table]]).column(0).to_pylist()

    def _free(self, table: str, n: int) -> list[int]:
        """Up to ``n`` ids not in ``table`` now, in random order (deleted ids included)."""
        present = set(self._ids(table))
        free = [i for i in range(POOL[table]) if i not in present]
        return self.rng.sample(free, min(n, len(free)))

    def _parent(self, table: str) -> int:
        """A parent id: usually one that exists, sometimes one that does not."""
        ids = self._ids(table)
        if ids and self.rng.random() < 0.8:
            return self.rng.choice(ids)
        return self.rng.randrange(POOL[table])

    def _row(self, table: str, key: int) -> dict[str, Any]:
        r = self.rng
        if table == "regions":
            return {"region_id": key, "region_name": f"r{r.randint(0, 99)}"}
        if table == "customers":
            region = None if r.random() < 0.1 else self._parent("regions")
            return {"customer_id": key, "name": f"c{r.randint(0, 99)}", "region_id": region}
        if table == "orders":
            customer = None if r.random() < 0.1 else self._parent("customers")
            return {
                "order_id": key,
                "customer_id": customer,
                "amount_cents": r.randint(1, 999),
                "status": r.choice(["new", "paid", "shipped"]),
            }
        return {
            "payment_id": key,
            "customer_id": None if r.random() < 0.1 else self._parent("customers"),
            "amount_cents": r.randint(1, 999),
        }

    def _arrow(self, table: str, rows: list[dict[str, Any]]) -> pa.Table:
        return pa.Table.from_pylist(rows, schema=SCHEMAS[table])

    def seed_tables(self) -> None:
        sizes = {"regions": 3, "customers": 6, "orders": 10, "payments": 8}
        for table in UPSTREAMS:  # parents first: children mostly reference real ones
            keys = self.rng.sample(range(POOL[table]), sizes[table])
            rows = [self._row(table, k) for k in keys]
            if table == "customers":  # the NULL group exists from the first load
                rows[0]["region_id"] = rows[1]["region_id"] = None
            write_deltalake(
                self.paths[table],
                self._arrow(table, rows),
                configuration={"delta.enableChangeDataFeed": "true"},
            )
            self.stats.commits += 1

    def commit(self) -> None:
        """One random upstream commit."""
        kind = self.rng.choice(
            ["insert", "insert", "insert", "update_value", "update_value", "move", "move", "move"]
            + ["move", "delete", "delete", "delete_parent", "merge", "rewrite"]
        )
        # Join keys live in the children: they change more often.
        table = self.rng.choices(UPSTREAMS, weights=[1, 2, 2, 2])[0]
        dt = RsTable(self.paths[table])
        key = KEY[table]
        ids = self._ids(table)
        if kind in ("update_value", "move", "delete", "merge", "rewrite") and not ids:
            kind = "insert"
        if kind == "delete_parent":
            # A parent that still has children: the children's joins turn to nulls.
            child, column, table = self.rng.choice(
                [("orders", "customer_id", "customers"), ("customers", "region_id", "regions")]
            )
            dt, key = RsTable(self.paths[table]), KEY[table]
            parents = set(self._ids(table))
            child_rows = RsTable(self.paths[child]).to_pyarrow_table(columns=[column])
            referenced = sorted({v for v in child_rows.column(0).to_pylist() if v in parents})
            victims = referenced or sorted(parents)
            if not victims:
                return self.commit()
            victim = self.rng.choice(victims)
            dt.delete(f"{key} = {int(victim)}")
            self.log.append(f"delete {table} {victim} (parent of {child})")
        elif kind == "insert":
            keys = self._free(table, self.rng.randint(1, 3))
            if not keys:
                return self.commit()
            rows = [self._row(table, k) for k in keys]
            write_deltalake(self.paths[table], self._arrow(table, rows), mode="append")
            self.log.append(f"insert {table} {keys}")
        elif kind == "update_value":
            picked = self.rng.sample(ids, min(len(ids), self.rng.randint(1, 3)))
            column, value = {
                "regions": ("region_name", f"'r{self.rng.randint(100, 199)}'"),
                "customers": ("name", f"'c{self.rng.randint(100, 199)}'"),
                "orders": ("amount_cents", f"amount_cents + {self.rng.randint(1, 50)}"),
                "payments": ("amount_cents", f"amount_cents + {self.rng.randint(1, 50)}"),
            }[table]
            dt.update(predicate=_in(key, picked), updates={column: value})
            self.log.append(f"update {table} {picked} {column} = {value}")
        elif kind == "move":
            self._move(table, dt, ids)
        elif kind == "delete":
            picked = self.rng.sample(ids, min(len(ids), self.rng.randint(1, 2)))
            dt.delete(_in(key, picked))
            self.log.append(f"delete {table} {picked}")
        elif kind == "merge":
            self._merge(table, dt, ids)
        else:
            # Every row deleted and re-inserted in one commit, a few changed (delta-rs
            # records no change files for an overwrite: Spark derives them from the files).
            rows = dt.to_pyarrow_table().to_pylist()
            for row in rows:
                if self.rng.random() < 0.3:
                    row.update(self._row(table, row[key]))
            self.rng.shuffle(rows)
            write_deltalake(self.paths[table], self._arrow(table, rows), mode="overwrite")
            self.log.append(f"rewrite {table}")
        self.stats.commits += 1

    def _move(self, table: str, dt: RsTable, ids: list[int]) -> None:
        """Change join keys: rows move to another parent (existing or not, or none)."""
        if table == "regions":  # regions have no join key of their own: rename instead
            picked = [self.rng.choice(ids)]
            dt.update(predicate=_in("region_id", picked), updates={"region_name": "'moved'"})
            self.log.append(f"rename region {picked}")
            return
        parent = "regions" if table == "customers" else "customers"
        column = KEY[parent]
        if table == "orders" and self.rng.random() < 0.4:
            # Every order of one customer moves to another in one commit.
            rows = dt.to_pyarrow_table(columns=["customer_id"]).column(0).to_pylist()
            owner = self.rng.choice(rows)
            target = self._parent("customers")
            where = "customer_id IS NULL" if owner is None else f"customer_id = {int(owner)}"
            dt.update(predicate=where, updates={"customer_id": str(target)})
            self.log.append(f"move orders of customer {owner} to {target}")
            return
        picked = self.rng.sample(ids, min(len(ids), self.rng.randint(1, 2)))
        # Customers move into the NULL region group (by_region_sql) more often.
        no_parent = 0.3 if table == "customers" else 0.15
        new = None if self.rng.random() < no_parent else self._parent(parent)
        value = "CAST(NULL AS BIGINT)" if new is None else str(new)
        dt.update(predicate=_in(KEY[table], picked), updates={column: value})
        self.log.append(f"move {table} {picked} to {column} {new}")

    def _merge(self, table: str, dt: RsTable, ids: list[int]) -> None:
        """One MERGE commit that updates, deletes and inserts several rows; for orders,
        rows of one customer (one key path)."""
        key = KEY[table]
        if table == "orders":
            rows = dt.to_pyarrow_table().to_pylist()
            owner = self.rng.choice(rows)["customer_id"]
            mine = [r[key] for r in rows if r["customer_id"] == owner]
        else:
            mine = ids
        existing = self.rng.sample(mine, min(len(mine), self.rng.randint(1, 3)))
        source: list[dict[str, Any]] = []
        for k in existing:
            row = self._row(table, k)
            if table == "orders" and self.rng.random() < 0.5:
                row["customer_id"] = owner  # stays with its customer, values change
            source.append(row | {"op": self.rng.choice(["u", "d"])})
        for k in self._free(table, self.rng.randint(0, 2)):
            row = self._row(table, k)
            if table == "orders":
                row["customer_id"] = owner
            source.append(row | {"op": "i"})
        schema = SCHEMAS[table].append(pa.field("op", pa.string()))
        columns = {c: f"s.{c}" for c in SCHEMAS[table].names}
        (
            dt.merge(
                pa.Table.from_pylist(source, schema=schema),
                predicate=f"t.{key} = s.{key}",
                source_alias="s",
                target_alias="t",
            )
            .when_matched_update(updates=columns, predicate="s.op = 'u'")
            .when_matched_delete(predicate="s.op = 'd'")
            .when_not_matched_insert(updates=columns)
            .execute()
        )
        self.log.append(f"merge {table} {[(r[key], r['op']) for r in source]}")

    # ---------------------------------------------------------------- the system

    def cycle(self) -> bool:
        """Plan (or resume), run the unfinished pipelines, finalize. False when idle.
        The same production calls, in the same order, as ``harness.Case.cycle``."""
        self.stats.cycles += 1
        batch = self.store.open_batch()
        if batch is None:
            look = look_before_planning(self.registry, self.observer, self.store, actor="model")
            batch, _ = plan_next(self.store, look, actor="model")
            if batch is None:
                return False
        done = succeeded_pipelines(batch.batch_id, self.store.checkpoints(batch_id=batch.batch_id))
        self.log.append(f"  MERGEs by {draw_merge_mode(self.spark, self.merges)}")
        # Each batch draws every pipeline's strategy: incremental, full, rewrite, or auto
        # (which these small tables resolve to the whole form); the targets must not tell
        # them apart.
        self.registry = Registry(
            upstreams=list(self.registry.upstreams.values()),
            pipelines=[
                replace(p, strategy=self.rng.choice(self.drawn(p)), change_feed=self.change_feed)
                for p in self.registry.pipelines.values()
            ],
        )
        for pipeline in batch.pipelines:
            if pipeline in done:
                continue
            outcome = self.execute(pipeline, batch.batch_id)
            if outcome is None:
                continue
            if outcome.strategy is not None and not outcome.full_load:
                ran = outcome.strategy.choice.strategy
                self.stats.full_runs += ran == "full"
                self.stats.rewrite_runs += ran == "rewrite"
                self.stats.incremental_runs += ran == "incremental"
                self.stats.maintain_runs += ran == "maintain"
                self.log.append(f"  {pipeline}: {ran}")
        finalize_batch(
            self.store, self.store.get_batch(batch.batch_id), registry=self.registry, actor="model"
        )
        self.log.append(f"cycle {batch.batch_id} {_describe(batch)}")
        return True

    def execute(self, pipeline: str, batch_id: str) -> PipelineOutcome | None:
        """Run one pipeline of a batch; None when its full transform failed on purpose."""
        try:
            return execute_pipeline(
                spark=self.spark,
                store=self.store,
                registry=self.registry,
                pipeline_name=pipeline,
                batch_id=batch_id,
                run_id="model",
            )
        except RuntimeError as e:
            if "injected failure" not in str(e):
                raise
            return None

    def crash_cycle(self) -> None:
        point = self.rng.choice(DECLARED_CRASH_POINTS)
        self.stats.crashes += 1
        self.log.append(f"crash at {point}")
        try:
            with simulate_crash_at(point):
                self.cycle()
        except SimulatedCrash:
            pass

    def failing_cycle(self) -> None:
        name = self.rng.choice(FUNCTION_PIPELINES)
        self.failing.add(name)
        self.stats.failures += 1
        self.log.append(f"{name} fails")
        try:
            self.cycle()
        finally:
            self.failing.discard(name)

    def replay(self) -> None:
        """Re-read an applied range of a random upstream through its consumers (CDF)."""
        committed_versions = self.store.committed_versions()
        replayable = [u for u in UPSTREAMS if (committed_versions.get(u) or 0) >= 1]
        if not replayable:
            return
        upstream = self.rng.choice(replayable)
        committed = committed_versions[upstream]
        assert committed is not None
        start = self.rng.randint(1, committed)
        end = self.rng.randint(start, committed)
        pipelines = self.consumers[upstream]
        readers = {u for p in pipelines for u in self.registry.pipelines[p].upstreams}
        try:
            batch = self.store.create_range_replay(
                upstream,
                VersionRange(start, end),
                mode=ReadMode.CDF,
                pipelines=pipelines,
                all_upstreams=sorted(readers),
                actor="model",
                reason=f"seed {self.seed}",
            )
        except BatchStateError:
            return  # e.g. the range end was applied by a snapshot load only
        self.stats.replays += 1
        self.log.append(f"replay {upstream} [{start}, {end}] as {batch.batch_id}")
        for pipeline in batch.pipelines:
            execute_pipeline(
                spark=self.spark,
                store=self.store,
                registry=self.registry,
                pipeline_name=pipeline,
                batch_id=batch.batch_id,
                run_id="model-replay",
            )
        self.store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="model")

    def backfill(self) -> None:
        """Re-materialize an old completed batch of a random pipeline (an asset backfill)."""
        done = [
            b
            for b in self.store.batches()
            if b.status is BatchStatus.COMPLETED and b.kind is BatchKind.SCHEDULED and b.pipelines
        ]
        if not done:
            return
        batch = self.rng.choice(done)
        pipeline = self.rng.choice(list(batch.pipelines))
        self.stats.backfills += 1
        self.log.append(f"backfill {pipeline} on {batch.batch_id}")
        execute_pipeline(
            spark=self.spark,
            store=self.store,
            registry=self.registry,
            pipeline_name=pipeline,
            batch_id=batch.batch_id,
            run_id="model-backfill",
        )

    def check_monotonic(self) -> None:
        """I2: no committed watermark ever moved backwards."""
        for upstream, version in self.store.committed_versions().items():
            if version is None:
                continue
            previous = self.high_water.get(upstream, -1)
            assert version >= previous, self._failure(f"{upstream} went {previous} -> {version}")
            self.high_water[upstream] = version

    # ---------------------------------------------------------------- the property

    def pins(self, upstreams: Iterable[str] = UPSTREAMS) -> tuple[str, dict[str, int]] | None:
        """The newest completed scheduled batch and the snapshot version it pinned per
        upstream of ``upstreams`` (None before the first one)."""
        done = [
            b
            for b in self.store.batches(status=BatchStatus.COMPLETED)
            if b.kind is BatchKind.SCHEDULED
        ]
        if not done:
            return None
        newest = max(done, key=lambda b: b.seq)
        versions: dict[str, int] = {}
        for u in upstreams:
            version = newest.inputs[u].snapshot_version
            assert version is not None, self._failure(f"{newest.batch_id} pins no {u}")
            versions[u] = version
        return newest.batch_id, versions

    def check_targets(self) -> None:
        """With no scheduled batch open, every target equals its full recompute at the
        versions the newest completed batch pinned; no key appears twice."""
        if self.store.open_batch() is not None:
            return
        pinned = self.pins()
        if pinned is None:
            return
        batch_id, versions = pinned
        tables = {
            u: RsTable(self.paths[u], version=v).to_pyarrow_table().to_pylist()
            for u, v in versions.items()
        }
        for pipeline, kind in PIPELINES.items():
            got = target_rows(self.targets[pipeline], COLUMNS[kind])
            keys = [r[0] for r in got]
            assert len(keys) == len(set(keys)), self._failure(
                f"{pipeline} holds a key twice after {batch_id}"
            )
            want = reference(kind, tables)
            if kind == "by_region" and any(r[0] is None for r in want):
                self.stats.null_groups += 1
            assert got == want, self._failure(
                f"{pipeline} differs from its full recompute at {versions} after {batch_id}:\n"
                + _difference(got, want)
            )
        self.stats.checks += 1

    def _failure(self, what: str) -> str:
        history = "\n".join(f"  {line}" for line in self.log[-30:])
        return f"seed {self.seed}: {what}\nlast events:\n{history}"

    # ---------------------------------------------------------------- the run

    def check_refused_shape(self) -> None:
        """One shape that cannot be derived, drawn for this case, is refused when it loads."""
        sql, upstreams, keys, fragment = self.rng.choice(REFUSED)
        self.log.append(f"refused shape: {fragment}")
        with pytest.raises(ConfigurationError) as refused:
            sql_pipeline(name="refused", sql=sql, upstreams=upstreams, keys=keys, target="/never")
        assert fragment in str(refused.value), self._failure(f"refused otherwise: {refused.value}")
        self.stats.refused += 1

    def run(self) -> Stats:
        self.check_refused_shape()
        self.seed_tables()
        self.cycle()  # the first load: every target created from the snapshots
        self.check_targets()
        # Every case moves a join key of each child once, then runs a clean batch: a
        # payment's old customer keeps its stale total unless the update's before-image
        # is followed, an order's old customer and a customer's old region likewise.
        for table in ("payments", "orders", "customers"):
            ids = self._ids(table)
            if ids:
                self._move(table, RsTable(self.paths[table]), ids)
                self.stats.commits += 1
        self.cycle()
        self.check_targets()
        actions: dict[str, Callable[[], Any]] = {
            "cycle": self.cycle,
            "crash": self.crash_cycle,
            "fail": self.failing_cycle,
            "replay": self.replay,
            "backfill": self.backfill,
        }
        for _ in range(self.steps):
            for _ in range(self.rng.randint(2, 4)):
                self.commit()
            action = self.rng.choices(list(actions), weights=[4, 3, 2, 2, 1])[0]
            actions[action]()
            self.check_monotonic()
            self.check_targets()
        for _ in range(20):
            if not self.cycle() and self.store.open_batch() is None:
                break
            self.check_monotonic()
            self.check_targets()
        else:
            raise AssertionError(self._failure("the system did not drain in 20 cycles"))
        latest = {u: latest_local_version(p) for u, p in self.paths.items()}
        committed = {u: self.store.committed_versions().get(u) for u in UPSTREAMS}
        assert committed == latest, self._failure(f"committed {committed} != latest {latest}")
        pinned = self.pins()
        assert pinned is not None, self._failure("no batch completed")
        assert pinned[1] == latest, self._failure(
            f"the newest batch {pinned[0]} pinned {pinned[1]}, not the latest versions {latest}"
        )
        self.check_targets()
        # Every case ends with a replay of an applied range: it must leave every target
        # equal to the recompute at the latest versions (a replay never regresses a row).
        self.replay()
        self.check_targets()
        return self.stats


def _in(column: str, values: list[int]) -> str:
    return f"{column} IN ({', '.join(str(int(v)) for v in values)})"


def _describe(batch: Batch) -> str:
    return ", ".join(f"{u} {i.describe()}" for u, i in sorted(batch.inputs.items()))


def run_case(spark: SparkSession, root: Path, seed: int, steps: int = 3) -> Stats:
    """Run one case in a fresh folder under ``root``; print the seed when it fails."""
    folder = root / f"declared-{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        return DeclaredCase(spark, folder, seed, steps).run()
    except BaseException:
        print(
            f"declared case failed: seed={seed} steps={steps} (replay: "
            f"WATERMARK_DECLARED_SEEDS={seed} WATERMARK_DECLARED_STEPS={steps} "
            "pytest tests/model/test_declared.py)"
        )
        raise
    finally:
        spark.conf.unset(REWRITE_BELOW_CONF)
        shutil.rmtree(folder, ignore_errors=True)
