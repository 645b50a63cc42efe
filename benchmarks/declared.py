"""Declared against hand-written pipelines: the cost of deriving the incremental transform.

One command builds demo-shaped upstreams (``customers``, ``orders``, ``payments``: Delta
tables with change data feed, the schema of :mod:`watermark_dagster.demo.data`), lets
three contenders load them once, then, per repeat, commits one MERGE to each upstream
(``--change`` of its rows: 40% updates, 30% deletes, 30% inserts; order updates move
half of their orders to another customer, customer updates rename, payment updates move
half of their payments to another customer) and has every contender process exactly those
commits, in an order rotated from repeat to repeat:

* ``declared``: the demo's declared pipelines
  (:func:`watermark_dagster.demo.pipelines.build_demo_registry`);
* ``handwritten``: the same pipelines written by hand
  (:func:`watermark_dagster.demo.handwritten.build_handwritten_registry`);
* ``recompute``: the full transforms (``full_orders_enriched``, ``full_customer_payments``)
  over the pinned snapshots, overwriting their targets;
* ``floor``: each pipeline's floor (:mod:`benchmarks.floor`), the least Spark work that
  applies the batch, written by hand: the changed rows and the rows reached from changed
  parents at the pinned versions, one plain MERGE per target of our layout. Every one of
  ours is printed against it (``X/floor``, the cycle and each pipeline).

``--profile`` shapes the changes: ``uniform`` (the split above, over all keys: every MERGE
touches every file) or ``recent`` (what a CDC feed looks like: 70% inserts of new keys,
updates and deletes of the newest 5% of keys, moved and new rows going to the newest
customers, so a MERGE into a target clustered by key skips most files). ``--scale`` runs
both by default.

Both of ours run through the production functions on the warm session of this process,
one cycle as the sensors make it: ``look_before_planning`` and ``plan_next`` (plan),
``execute_pipeline`` per pipeline (read, transform, MERGE, checkpoint), ``finalize_batch``
(advance, complete). The cycle and each ``execute_pipeline`` are timed. Each contender has
its own targets and control tables, and is up to date before each measured commit. Spark
jobs are counted per contender and per pipeline (a job group each, read back from Spark's
status tracker).

``--learn N`` runs N unmeasured batches first: `auto` tries each form it has not measured
once (the whole form, ``maintain``, ``incremental``), so the measured repeats show what it
settles on rather than its first tries. Each repeat records the strategy every pipeline of
ours ran.

After each repeat every target is compared with the full transforms over the upstreams'
snapshots (row count and a hash sum over every column); a difference stops the run with
exit 1. Prints medians and min-max of the paired repeats, the ratios declared/hand-written
and declared/recompute (per pipeline and per cycle), the load average; writes JSON
(``--out``).

    .venv/bin/python -m benchmarks.incremental --declared          # 300k orders, 1%, 5 repeats
    .venv/bin/python -m benchmarks.declared --orders 500k --repeats 7
    .venv/bin/python -m benchmarks.declared --quick                # 20k orders, 2 repeats
    .venv/bin/python -m benchmarks.declared --scale 2m,4m,8m,16m   # growth at 2,000 changed
    .venv/bin/python -m benchmarks.declared --quick --profile recent \
        --contenders declared_incremental,floor,recompute

``--scale`` runs one measurement per size with a fixed number of changed orders per commit
(``--changed``, 2,000; the other tables change in proportion, as always), the declared
pipelines against the recompute by default, and prints how each grows from the smallest
size to the largest: a batch that costs what changed stays flat while a recompute grows
with the data.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from benchmarks.baselines import build_session
from benchmarks.floor import Floor
from benchmarks.incremental import QUICK_CONF, fingerprint, machine, spark_description

REPO = Path(__file__).resolve().parents[1]
OURS = (
    "declared",
    "declared_minimal",
    "declared_incremental",
    "declared_maintain",
    "declared_by_keys",
    "declared_full",
    "declared_rewrite",
    "declared_no_aqe",
    "declared_full_dv",
    "handwritten",
)
CONTENDERS = {
    "declared": "the demo's declared pipelines (strategy auto: incremental or rewrite, chosen "
    "per batch; no pipeline reads their targets, so change_feed is any), production cycle on "
    "the warm session: plan, execute_pipeline per pipeline, finalize",
    "declared_minimal": "the declared pipelines (strategy auto) with change_feed=minimal, as "
    "when another pipeline reads the targets: incremental or full, chosen per batch, the same "
    "cycle",
    "declared_incremental": "the declared pipelines with strategy=incremental (the derived "
    "transform every batch), the same cycle",
    "declared_maintain": "the declared pipelines with strategy=maintain where the declaration "
    "allows it (customer_payments' payment sums kept from the change rows), incremental "
    "otherwise, the same cycle",
    "declared_by_keys": "declared_incremental reading each upstream reached through a join "
    "path only for the rows that reach the touched keys "
    "(spark.watermark.declared.readJoinedByKeys=true) instead of whole",
    "declared_full": "the declared pipelines with strategy=full (the full transform diffed "
    "against the target, only the differences merged), the same cycle",
    "declared_rewrite": "the declared pipelines with strategy=rewrite (the full transform "
    "written over the target), the same cycle",
    "declared_no_aqe": "the declared pipelines (strategy auto) with Spark's adaptive query "
    "execution off for the cycle: each shuffle or broadcast stage runs inside its job instead "
    "of as a job of its own",
    "declared_full_dv": "declared_full with every MERGE writing deletion vectors, however "
    "small the target (spark.watermark.merge.rewriteBelowBytes=0): the write before small "
    "targets were rewritten",
    "handwritten": "the same pipelines written by hand (demo/handwritten.py), the same cycle",
    "recompute": "full_orders_enriched and full_customer_payments over the pinned snapshots, "
    "overwrite",
    "floor": "the least Spark work that applies the batch, by hand (benchmarks/floor.py): the "
    "changed rows and the rows reached from changed parents at the pinned versions, then one "
    "plain MERGE per target of our layout; no bookkeeping",
}
PIPELINES = ("orders_enriched", "customer_payments")
# (label, numerator, denominator): above 1 means the denominator is faster.
RATIOS = (
    ("declared/handwritten", "declared", "handwritten"),
    ("declared/recompute", "declared", "recompute"),
    ("declared_minimal/recompute", "declared_minimal", "recompute"),
    ("declared_rewrite/recompute", "declared_rewrite", "recompute"),
    ("declared_incremental/recompute", "declared_incremental", "recompute"),
    ("declared_maintain/recompute", "declared_maintain", "recompute"),
    ("declared_maintain/declared_incremental", "declared_maintain", "declared_incremental"),
    ("declared_by_keys/declared_incremental", "declared_by_keys", "declared_incremental"),
    ("declared_full/recompute", "declared_full", "recompute"),
    ("declared_no_aqe/declared", "declared_no_aqe", "declared"),
    ("declared_full/declared_full_dv", "declared_full", "declared_full_dv"),
    ("handwritten/recompute", "handwritten", "recompute"),
)
# The target columns the correctness check compares (what the full transforms produce).
TARGET_COLUMNS = {
    "orders_enriched": ("order_id", "customer_id", "customer_name", "amount_cents", "status"),
    "customer_payments": ("customer_id", "name", "total_paid_cents", "payment_count"),
}
KEYS = {"customers": "customer_id", "orders": "order_id", "payments": "payment_id"}
# Upstream sizes relative to orders (the demo's shape: few customers, many orders).
CUSTOMERS_PER_ORDER = 0.1
PAYMENTS_PER_ORDER = 0.5
STATUSES = ("new", "paid", "shipped", "returned")
NAMES = ("Ada", "Grace", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia", "Leslie")
CITIES = ("Lisbon", "Oslo", "Quito", "Hanoi", "Perth", "Tunis")
# How a repeat's changes are spread over the keys (commit_changes).
PROFILES = {
    "uniform": "40% updates, 30% deletes, 30% inserts, over all keys: every MERGE touches "
    "every file of a target clustered by key (the worst case)",
    "recent": "70% inserts of new keys, 20% updates and 10% deletes of the newest 5% of keys, "
    "moved and new orders and payments going to the newest customers: what a CDC feed looks "
    "like, a MERGE into a target clustered by key skips most files",
}
RECENT_SHARE = 0.05


class TargetMismatch(Exception):
    """A contender's target differs from the full transforms: the figures are void."""


class CycleError(Exception):
    """One of our contenders did not process exactly the measured commits."""


# ---------------------------------------------------------------------------------------
# The upstreams and their changes.


def build_upstreams(spark: SparkSession, root: Path, orders: int) -> dict[str, int]:
    """Create the three upstreams (change data feed on) under ``root``; returns their sizes.

    Values are derived from the key by hashing, so a size always gives the same tables.
    """
    sizes = {
        "customers": max(10, round(orders * CUSTOMERS_PER_ORDER)),
        "orders": orders,
        "payments": max(10, round(orders * PAYMENTS_PER_ORDER)),
    }
    customers = sizes["customers"]

    def pick(column: str, values: Sequence[str], salt: int) -> Any:
        index = F.pmod(F.xxhash64(column, F.lit(salt)), F.lit(len(values))).cast("int")
        return F.element_at(F.array(*[F.lit(v) for v in values]), index + 1)

    def customer_of(column: str, salt: int) -> Any:
        return (F.pmod(F.xxhash64(column, F.lit(salt)), F.lit(customers)) + 1).cast("long")

    frames = {
        "customers": spark.range(1, customers + 1).select(
            F.col("id").alias("customer_id"),
            pick("id", NAMES, 1).alias("name"),
            pick("id", CITIES, 2).alias("city"),
        ),
        "orders": spark.range(1, orders + 1, numPartitions=2).select(
            F.col("id").alias("order_id"),
            customer_of("id", 3).alias("customer_id"),
            (F.pmod(F.xxhash64("id", F.lit(4)), F.lit(9_000)) + 100).alias("amount_cents"),
            pick("id", STATUSES, 5).alias("status"),
        ),
        "payments": spark.range(1, sizes["payments"] + 1, numPartitions=2).select(
            F.col("id").alias("payment_id"),
            customer_of("id", 6).alias("customer_id"),
            (F.pmod(F.xxhash64("id", F.lit(7)), F.lit(5_000)) + 100).alias("amount_cents"),
        ),
    }
    from watermark_dagster.demo.data import UPSTREAMS

    for name, frame in frames.items():
        # Created empty with the demo's schema (its nullability), then filled.
        (
            spark.createDataFrame([], UPSTREAMS[name])
            .write.format("delta")
            .option("delta.enableChangeDataFeed", "true")
            .save(str(root / name))
        )
        frame.write.format("delta").mode("append").save(str(root / name))
    return sizes


@dataclass(frozen=True)
class Commit:
    """One upstream MERGE commit."""

    table: str
    version: int
    updated: int
    deleted: int
    inserted: int


def _recent(ids: Sequence[int], at_least: int) -> list[int]:
    """The newest :data:`RECENT_SHARE` of ``ids`` (the highest keys), at least ``at_least``."""
    newest = sorted(ids, reverse=True)
    return newest[: min(len(newest), max(round(len(newest) * RECENT_SHARE), at_least))]


def commit_changes(
    spark: SparkSession, root: Path, *, fraction: float, salt: int, profile: str = "uniform"
) -> dict[str, Commit]:
    """One MERGE commit per upstream (customers first: new orders and payments may name a
    new customer), each changing ``fraction`` of its rows, chosen by a generator seeded
    with ``salt``, in the shape of :data:`PROFILES` ``profile``: ``uniform``, 40% updates,
    30% deletes, 30% inserts over all keys; ``recent``, 70% inserts, 20% updates and 10%
    deletes of the newest :data:`RECENT_SHARE` of keys, rows that move (and new rows) going
    to the newest customers."""
    if profile not in PROFILES:
        raise ValueError(f"unknown change profile {profile!r}; known: {list(PROFILES)}")
    rnd = random.Random(salt)
    commits = {}
    customer_ids: list[int] = []
    shares = (0.2, 0.1) if profile == "recent" else (0.4, 0.3)
    for table in ("customers", "orders", "payments"):
        path = str(root / table)
        key = KEYS[table]
        current = spark.read.format("delta").load(path)
        ids = [r[0] for r in current.select(key).collect()]
        if table == "customers":
            customer_ids = list(ids)
        changed = max(3, round(len(ids) * fraction))
        n_update, n_delete = round(changed * shares[0]), round(changed * shares[1])
        n_insert = changed - n_update - n_delete
        pool = _recent(ids, 2 * (n_update + n_delete)) if profile == "recent" else ids
        picked = rnd.sample(pool, n_update + n_delete)
        updated_ids, deleted_ids = picked[:n_update], picked[n_update:]
        rows = {
            tuple(r)[0]: tuple(r) for r in current.where(F.col(key).isin(updated_ids)).collect()
        }
        next_id = max(ids) + 1
        if table == "customers":
            customer_ids += range(next_id, next_id + n_insert)
        # Where moved and new rows go: any customer, or the newest ones (a CDC feed's).
        owners = _recent(customer_ids, 1) if profile == "recent" else customer_ids
        updates = [_updated(table, rows[i], rnd, owners, salt) for i in updated_ids]
        inserts = [_inserted(table, next_id + i, rnd, owners, salt) for i in range(n_insert)]
        commits[table] = _merge(spark, path, table, updates, deleted_ids, inserts)
        # The first scan of a new version rebuilds Delta's snapshot state (Spark jobs in
        # the session's shared log cache): done here, so no contender pays for it because
        # it happens to go first.
        spark.read.format("delta").load(path).limit(1).collect()
    return commits


def _updated(table: str, row: tuple, rnd: random.Random, customers: list[int], salt: int) -> tuple:
    if table == "customers":  # a rename
        return (row[0], f"{rnd.choice(NAMES)} {salt}", row[2])
    if table == "orders":  # half move to another customer, half change status and amount
        if rnd.random() < 0.5:
            return (row[0], rnd.choice(customers), row[2], row[3])
        return (row[0], row[1], rnd.randint(100, 9_100), rnd.choice(STATUSES))
    if rnd.random() < 0.5:  # payments: half move to another customer
        return (row[0], rnd.choice(customers), row[2])
    return (row[0], row[1], rnd.randint(100, 5_100))


def _inserted(table: str, key: int, rnd: random.Random, customers: list[int], salt: int) -> tuple:
    if table == "customers":
        return (key, f"{rnd.choice(NAMES)} {salt}", rnd.choice(CITIES))
    if table == "orders":
        return (key, rnd.choice(customers), rnd.randint(100, 9_100), "new")
    return (key, rnd.choice(customers), rnd.randint(100, 5_100))


def _merge(
    spark: SparkSession,
    path: str,
    table: str,
    updates: list[tuple],
    deletes: list[int],
    inserts: list[tuple],
) -> Commit:
    from delta.tables import DeltaTable

    from watermark_dagster.demo.data import UPSTREAMS

    schema = UPSTREAMS[table]
    key = KEYS[table]
    empty = (None,) * (len(schema.fields) - 1)
    rows = (
        [(*r, "U") for r in updates]
        + [(k, *empty, "D") for k in deletes]
        + [(*r, "I") for r in inserts]
    )
    with_op = T.StructType([*schema.fields, T.StructField("_op", T.StringType(), False)])
    source = spark.createDataFrame(rows, with_op)
    values: dict[str, str | Column] = {f.name: F.col(f"s.{f.name}") for f in schema.fields}
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), F.col(f"t.{key}") == F.col(f"s.{key}"))
        .whenMatchedUpdate(condition=F.col("s._op") == "U", set=values)
        .whenMatchedDelete(condition=F.col("s._op") == "D")
        .whenNotMatchedInsert(condition=F.col("s._op") == "I", values=values)
        .execute()
    )
    from deltalake import DeltaTable as RsTable

    history = RsTable(path).history(1)[0]
    metrics = history.get("operationMetrics") or {}
    return Commit(
        table=table,
        version=int(history["version"]),
        updated=int(metrics.get("numTargetRowsUpdated", 0)),
        deleted=int(metrics.get("numTargetRowsDeleted", 0)),
        inserted=int(metrics.get("numTargetRowsInserted", 0)),
    )


# ---------------------------------------------------------------------------------------
# The contenders.


def contender_paths(root: Path, upstreams: Path, name: str) -> Any:
    """The demo's paths for contender ``name``: its own targets and control tables under
    ``root / name``, the upstreams shared."""
    from watermark_dagster.demo.paths import DemoPaths

    @dataclass(frozen=True)
    class SharedUpstreams(DemoPaths):
        """Demo paths whose upstreams live in one folder shared by every contender."""

        upstreams: Path

        def upstream(self, name: str) -> str:
            return str(self.upstreams / name)

    return SharedUpstreams(home=root / name, upstreams=upstreams)


class JobCounter:
    """Spark jobs per measured step: each step runs in its own job group, whose jobs
    Spark's status tracker lists afterwards."""

    def __init__(self, spark: SparkSession) -> None:
        self.context = spark.sparkContext
        self.count = 0

    def group(self, label: str) -> str:
        """Start a job group for ``label``; returns its id for :meth:`jobs`."""
        self.count += 1
        group = f"bench-declared-{self.count}-{label}"
        self.context.setJobGroup(group, label)
        return group

    def jobs(self, group: str) -> int:
        """How many jobs ran in ``group``."""
        return len(self.job_ids(group))

    def job_ids(self, group: str) -> set[int]:
        """The ids of the jobs that ran in ``group`` (of those Spark still retains)."""
        return set(self.context.statusTracker().getJobIdsForGroup(group))


@dataclass
class Outcome:
    """One contender processing one repeat's commits."""

    seconds: float
    jobs: int
    pipelines: dict[str, float]
    pipeline_jobs: dict[str, int]
    rows_written: dict[str, int]
    strategies: dict[str, str] = field(default_factory=dict)


class Ours:
    """One of our registries with its own control tables, driven cycle by cycle through
    the production functions, as the sensors and the run drive them."""

    def __init__(
        self,
        spark: SparkSession,
        registry: Any,
        control_root: str,
        conf: dict[str, str] | None = None,
    ) -> None:
        from watermark_dagster.observe.observer import Observer
        from watermark_dagster.store import WatermarkStore

        self.spark, self.registry, self.conf = spark, registry, conf or {}
        self.store = WatermarkStore(control_root)
        self.observer = Observer()

    def cycle(self, counter: JobCounter, label: str) -> Outcome | None:
        """Plan, run every pipeline of the batch, finalize, with this contender's session
        settings. None when nothing was planned.

        Raises:
            CycleError: the batch did not complete.
        """
        saved = {k: self.spark.conf.get(k, None) for k in self.conf}
        for k, v in self.conf.items():
            self.spark.conf.set(k, v)
        try:
            return self._cycle(counter, label)
        finally:
            for k, v in saved.items():
                if v is None:
                    self.spark.conf.unset(k)
                else:
                    self.spark.conf.set(k, v)

    def _cycle(self, counter: JobCounter, label: str) -> Outcome | None:
        from watermark_dagster.core.records import BatchStatus
        from watermark_dagster.frames.stages import STAGES, stage_group
        from watermark_dagster.operations.coordinate import (
            finalize_batch,
            look_before_planning,
            plan_next,
        )
        from watermark_dagster.operations.run_pipeline import execute_pipeline

        whole = counter.group(f"{label}-cycle")
        started = time.perf_counter()
        look = look_before_planning(self.registry, self.observer, self.store, actor="bench")
        batch, _ = plan_next(self.store, look, actor="bench")
        if batch is None:
            return None
        seconds, jobs, written, strategies = {}, {}, {}, {}
        for pipeline in batch.pipelines:
            group = counter.group(f"{label}-{pipeline}")
            # The run's stages start job groups of their own (frames/stages.py), named by
            # the batch, which another contender's batch of the same id ran in as well.
            stages = [stage_group(pipeline, batch.batch_id, stage) for stage in STAGES]
            earlier = {j for g in stages for j in counter.job_ids(g)}
            began = time.perf_counter()
            outcome = execute_pipeline(
                spark=self.spark,
                store=self.store,
                registry=self.registry,
                pipeline_name=pipeline,
                batch_id=batch.batch_id,
                run_id="bench",
            )
            seconds[pipeline] = time.perf_counter() - began
            staged = {j for g in stages for j in counter.job_ids(g)} - earlier
            jobs[pipeline] = counter.jobs(group) + len(staged)
            written[pipeline] = outcome.rows_written
            ran = outcome.strategy
            strategies[pipeline] = "full load" if ran is None else str(ran.choice.strategy)
            counter.context.setJobGroup(whole, f"{label}-cycle")
        finalize_batch(
            self.store, self.store.get_batch(batch.batch_id), registry=self.registry, actor="bench"
        )
        total = time.perf_counter() - started
        status = self.store.get_batch(batch.batch_id).status
        if status is not BatchStatus.COMPLETED:
            raise CycleError(f"{label}: batch {batch.batch_id} ended {status}, not completed")
        all_jobs = counter.jobs(whole) + sum(jobs.values())
        return Outcome(total, all_jobs, seconds, jobs, written, strategies)

    def committed(self) -> dict[str, int | None]:
        """The committed watermark of each upstream."""
        return self.store.committed_versions()


def recompute(
    spark: SparkSession, upstreams: Path, targets: dict[str, str], versions: dict[str, int]
) -> None:
    """The full transforms over the upstreams' snapshots at ``versions``, overwriting."""
    from watermark_dagster.demo.pipelines import full_customer_payments, full_orders_enriched

    def load(name: str) -> DataFrame:
        return (
            spark.read.format("delta")
            .option("versionAsOf", versions[name])
            .load(str(upstreams / name))
        )

    outputs = {
        "orders_enriched": full_orders_enriched(load("orders"), load("customers")),
        "customer_payments": full_customer_payments(load("customers"), load("payments")),
    }
    for name, frame in outputs.items():
        frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(
            targets[name]
        )


class Lab:
    """The three contenders over one set of upstreams."""

    def __init__(self, spark: SparkSession, root: Path, names: Sequence[str]) -> None:
        from watermark_dagster.demo.handwritten import build_handwritten_registry
        from watermark_dagster.demo.pipelines import build_demo_registry
        from watermark_dagster.read.reach import BY_KEYS_CONF
        from watermark_dagster.write.layout import REWRITE_BELOW_CONF

        self.spark, self.root, self.names = spark, root, list(names)
        self.upstreams = root / "upstreams"
        self.counter = JobCounter(spark)
        self.paths = {n: contender_paths(root, self.upstreams, n) for n in self.names}

        def with_strategy(strategy: str, change_feed: str | None = None) -> Callable[[Any], Any]:
            def build(paths: Any) -> Any:
                from dataclasses import replace

                from watermark_dagster.config.registry import Registry

                registry = build_demo_registry(paths)
                return Registry(
                    upstreams=list(registry.upstreams.values()),
                    pipelines=[
                        replace(
                            p,
                            # maintain where the declaration allows it, else incremental
                            strategy=strategy
                            if strategy != "maintain" or p.maintainable
                            else "incremental",
                            change_feed=change_feed,
                        )
                        for p in registry.pipelines.values()
                    ],
                )

            return build

        builders = {
            "declared": build_demo_registry,
            "declared_minimal": with_strategy("auto", "minimal"),
            "declared_incremental": with_strategy("incremental"),
            "declared_maintain": with_strategy("maintain"),
            "declared_by_keys": with_strategy("incremental"),
            "declared_full": with_strategy("full"),
            "declared_rewrite": with_strategy("rewrite"),
            "declared_no_aqe": build_demo_registry,
            "declared_full_dv": with_strategy("full"),
            "handwritten": build_handwritten_registry,
        }
        confs = {
            "declared_no_aqe": {"spark.sql.adaptive.enabled": "false"},
            "declared_full_dv": {REWRITE_BELOW_CONF: "0"},
            "declared_by_keys": {BY_KEYS_CONF: "true"},
        }
        self.ours = {
            n: Ours(spark, builders[n](self.paths[n]), self.paths[n].control_root, confs.get(n))
            for n in self.names
            if n in OURS
        }
        # Only a lab that measures the floor has its targets (benchmarks.jobs's has not).
        self.floor = (
            Floor(spark, self.upstreams, self.targets("floor")) if "floor" in self.paths else None
        )

    def targets(self, name: str) -> dict[str, str]:
        """Paths of contender ``name``'s two targets."""
        return {p: self.paths[name].target(p) for p in PIPELINES}

    def process(self, name: str, versions: dict[str, int]) -> Outcome:
        """Have ``name`` bring its targets up to ``versions``, timed.

        Raises:
            CycleError: one of ours did not end at exactly ``versions`` in one cycle.
        """
        if name == "recompute":
            group = self.counter.group("recompute")
            started = time.perf_counter()
            recompute(self.spark, self.upstreams, self.targets(name), versions)
            seconds = time.perf_counter() - started
            return Outcome(seconds, self.counter.jobs(group), {}, {}, {})
        if name == "floor":
            assert self.floor is not None, "a lab without the floor contender"
            started = time.perf_counter()
            pipelines, jobs = self.floor.process(versions, self.counter)
            seconds = time.perf_counter() - started
            return Outcome(seconds, sum(jobs.values()), pipelines, jobs, {})
        ours = self.ours[name]
        outcome = ours.cycle(self.counter, name)
        if outcome is None:
            raise CycleError(f"{name}: nothing was planned for upstream versions {versions}")
        committed = ours.committed()
        if committed != versions:
            raise CycleError(f"{name}: committed {committed}, expected {versions} in one cycle")
        return outcome

    def setup(self, name: str, versions: dict[str, int]) -> float:
        """The first load of ``name`` (cycles until idle for ours); timed for the record."""
        started = time.perf_counter()
        if name == "recompute":
            recompute(self.spark, self.upstreams, self.targets(name), versions)
        elif name == "floor":
            assert self.floor is not None, "a lab without the floor contender"
            self.floor.setup(versions)
        else:
            while self.ours[name].cycle(self.counter, f"{name}-setup") is not None:
                pass
            if self.ours[name].committed() != versions:
                raise CycleError(f"{name}: first load ended at {self.ours[name].committed()}")
        return time.perf_counter() - started


# ---------------------------------------------------------------------------------------
# The work a transform's output did, from Spark's own plan metrics.

_JOINS = ("BroadcastHashJoinExec", "SortMergeJoinExec", "ShuffledHashJoinExec",
          "BroadcastNestedLoopJoinExec", "CartesianProductExec")  # fmt: skip
_AGGREGATES = ("HashAggregateExec", "ObjectHashAggregateExec", "SortAggregateExec")


@dataclass(frozen=True)
class PlanWork:
    """What one executed plan did, summed from its operators' SQL metrics.

    ``largest_intermediate`` is the most rows any join or aggregate produced: with the
    direct upstreams cut down to the touched keys, it stays near the batch's size; a full
    transform over a whole snapshot makes it the snapshot's size.
    """

    scans: int
    rows_scanned: int
    files_scanned: int
    largest_intermediate: int
    join_rows: int


def plan_work(frame: DataFrame) -> PlanWork:
    """The work of ``frame``'s last execution (run an action on it first), read from the
    metrics of its executed physical plan (the final plan of adaptive execution). A reused
    exchange or subquery is not counted again: Spark ran it once."""
    scans = rows = files = largest = joined = 0

    def metric(node: Any, name: str) -> int:
        found = node.metrics().get(name)
        return int(found.get().value()) if found.isDefined() else 0

    def walk(node: Any) -> None:
        nonlocal scans, rows, files, largest, joined
        kind = node.getClass().getSimpleName()
        if kind.startswith("Reused"):
            return
        if kind == "AdaptiveSparkPlanExec":
            walk(node.executedPlan())
            return
        if kind.endswith("QueryStageExec"):
            walk(node.plan())
            return
        if kind == "FileSourceScanExec":
            scans += 1
            rows += metric(node, "numOutputRows")
            files += metric(node, "numFiles")
        elif kind in _JOINS or kind in _AGGREGATES:
            produced = metric(node, "numOutputRows")
            largest = max(largest, produced)
            joined += produced if kind in _JOINS else 0
        children = node.children()
        for i in range(children.size()):
            walk(children.apply(i))
        subqueries = node.subqueries()
        for i in range(subqueries.size()):
            walk(subqueries.apply(i))

    jvm_frame: Any = frame._jdf  # the JVM Dataset: its plan carries the metrics
    walk(jvm_frame.queryExecution().executedPlan())
    return PlanWork(scans, rows, files, largest, joined)


def measuring(registry: Any, sink: dict[str, list[PlanWork]]) -> Any:
    """``registry`` with each pipeline's batch transform (as the run would call it: the
    derived one for a declared pipeline) wrapped to execute its output once more and add
    its :class:`PlanWork` to ``sink[pipeline]``. For mechanism tests, not timings: the
    output is computed twice."""
    import dataclasses

    from watermark_dagster.config.registry import Registry
    from watermark_dagster.read.derive import transform_of

    def wrap(name: str, transform: Callable[[Any], DataFrame]) -> Callable[[Any], DataFrame]:
        def measured(batch: Any) -> DataFrame:
            output = transform(batch)
            output.collect()
            sink.setdefault(name, []).append(plan_work(output))
            return output

        return measured

    # Hand-written now, so the run passes no strategy: the derived transform runs its
    # incremental form on every batch after the first load.
    pipelines = [
        dataclasses.replace(
            p, declared=None, transform=wrap(p.name, transform_of(p)), strategy="auto"
        )
        for p in registry.pipelines.values()
    ]
    return Registry(upstreams=registry.upstreams.values(), pipelines=pipelines)


# ---------------------------------------------------------------------------------------
# The correctness check.


def check_targets(
    spark: SparkSession, upstreams: Path, versions: dict[str, int], lab: Lab
) -> dict[str, Any]:
    """Compare every contender's targets with the full transforms over the snapshots at
    ``versions``.

    Raises:
        TargetMismatch: a target differs; the message names it and shows rows on each side.
    """
    from watermark_dagster.demo.pipelines import full_customer_payments, full_orders_enriched

    def load(name: str) -> DataFrame:
        return (
            spark.read.format("delta")
            .option("versionAsOf", versions[name])
            .load(str(upstreams / name))
        )

    references = {
        "orders_enriched": full_orders_enriched(load("orders"), load("customers")),
        "customer_payments": full_customer_payments(load("customers"), load("payments")),
    }
    rows = {}
    for pipeline, reference in references.items():
        columns = TARGET_COLUMNS[pipeline]
        expected = fingerprint(reference, columns)
        rows[pipeline] = expected[0]
        for name in lab.names:
            path = lab.targets(name)[pipeline]
            target = spark.read.format("delta").load(path)
            got = fingerprint(target, columns)
            if got == expected:
                continue
            ref, tgt = reference.select(*columns), target.select(*columns)
            extra = [r.asDict() for r in tgt.exceptAll(ref).limit(3).collect()]
            missing = [r.asDict() for r in ref.exceptAll(tgt).limit(3).collect()]
            raise TargetMismatch(
                f"{pipeline} of {name} ({path}) differs from the full transform at {versions}: "
                f"{got[0]} rows against {expected[0]}; rows only in the target {extra}; "
                f"rows only in the recompute {missing}"
            )
    return {"versions": versions, "rows": rows, "equal": sorted(lab.names)}


# ---------------------------------------------------------------------------------------
# Running and summarizing.


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def summarize(repeats: list[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Medians and min-max per contender and per pipeline, paired ratios, job counts."""
    seconds = {n: _spread([r["seconds"][n] for r in repeats]) for n in names}
    per_pipeline = {
        n: {p: _spread([r["pipelines"][n][p] for r in repeats]) for p in PIPELINES}
        for n in names
        if n in (*OURS, "floor")
    }
    ratios: dict[str, Any] = {}
    for label, num, den in RATIOS:
        if num in names and den in names:
            ratios[label] = _spread([r["seconds"][num] / r["seconds"][den] for r in repeats])
    # Every one of ours against the floor, the cycle and each pipeline (paired).
    for n in (n for n in names if n in OURS and "floor" in names):
        ratios[f"{n}/floor"] = _spread([r["seconds"][n] / r["seconds"]["floor"] for r in repeats])
        for p in PIPELINES:
            ratios[f"{n}/floor {p}"] = _spread(
                [r["pipelines"][n][p] / r["pipelines"]["floor"][p] for r in repeats]
            )
    if "declared" in names and "handwritten" in names:
        for p in PIPELINES:
            ratios[f"declared/handwritten {p}"] = _spread(
                [r["pipelines"]["declared"][p] / r["pipelines"]["handwritten"][p] for r in repeats]
            )
    jobs = {n: statistics.median([r["jobs"][n] for r in repeats]) for n in names}
    pipeline_jobs = {
        n: {p: statistics.median([r["pipeline_jobs"][n][p] for r in repeats]) for p in PIPELINES}
        for n in names
        if n in (*OURS, "floor")
    }
    return {
        "seconds": seconds,
        "pipeline_seconds": per_pipeline,
        "ratios": ratios,
        "spark_jobs_median": jobs,
        "pipeline_spark_jobs_median": pipeline_jobs,
    }


def _print_summary(out: Callable[[str], None], summary: dict[str, Any]) -> None:
    out(f"  {'contender':<24} {'median s':>9} {'min-max s':>15} {'jobs':>6}")
    for name, s in summary["seconds"].items():
        jobs = summary["spark_jobs_median"][name]
        out(f"  {name + ' (cycle)':<24} {s['median']:>9.2f} {s['min']:>6.2f}-{s['max']:<8.2f}"
            f"{jobs:>6g}")  # fmt: skip
        for p, ps in summary["pipeline_seconds"].get(name, {}).items():
            pj = summary["pipeline_spark_jobs_median"][name][p]
            out(f"    {p:<22} {ps['median']:>9.2f} {ps['min']:>6.2f}-{ps['max']:<8.2f}{pj:>6g}")
    for label, s in summary["ratios"].items():
        out(f"  {label:<36} {s['median']:>5.2f}x (min-max {s['min']:.2f}-{s['max']:.2f})")


def run(
    spark: SparkSession, root: Path, args: argparse.Namespace, out: Callable[[str], None]
) -> dict[str, Any]:
    """Build the upstreams, load every contender, measure ``args.repeats`` repeats.

    Raises:
        TargetMismatch: a target differed from the full transforms after a repeat.
    """
    result: dict[str, Any] = {"loadavg_before": list(os.getloadavg()), "repeats": []}
    started = time.perf_counter()
    upstreams = root / "upstreams"
    result["sizes"] = build_upstreams(spark, upstreams, args.orders)
    result["build_seconds"] = round(time.perf_counter() - started, 2)
    out(f"upstreams built in {result['build_seconds']:.1f}s: {result['sizes']}")
    from deltalake import DeltaTable as RsTable

    versions = {t: RsTable(str(upstreams / t)).version() for t in KEYS}
    lab = Lab(spark, root, args.contenders)
    result["first_load_seconds"] = {}
    for name in lab.names:
        seconds = lab.setup(name, versions)
        result["first_load_seconds"][name] = round(seconds, 3)
        out(f"  first load {name:<12} {seconds:8.2f}s (not compared)")
    result["first_check"] = check_targets(spark, upstreams, versions, lab)
    result["learned"] = []
    for learning in range(args.learn):
        # Unmeasured batches first, so that `auto` has measured each form it tries once.
        commits = commit_changes(
            spark, upstreams, fraction=args.change, salt=1_000 + learning, profile=args.profile[0]
        )
        versions = {t: c.version for t, c in commits.items()}
        ran = {name: lab.process(name, versions).strategies for name in lab.names}
        result["learned"].append(ran)
        out(f"learning batch {learning + 1}/{args.learn} (not measured): "
            f"{ {n: s for n, s in ran.items() if s} }")  # fmt: skip
    for repeat in range(args.repeats):
        group = lab.counter.group("commit")
        commits = commit_changes(
            spark, upstreams, fraction=args.change, salt=repeat + 1, profile=args.profile[0]
        )
        versions = {t: c.version for t, c in commits.items()}
        order = lab.names[repeat % len(lab.names) :] + lab.names[: repeat % len(lab.names)]
        changes = {
            t: {"updated": c.updated, "deleted": c.deleted, "inserted": c.inserted}
            for t, c in commits.items()
        }
        out(f"repeat {repeat + 1}/{args.repeats}: {changes} (commits took "
            f"{lab.counter.jobs(group)} Spark jobs)")  # fmt: skip
        record: dict[str, Any] = {
            "repeat": repeat + 1,
            "versions": versions,
            "upstream_changes": changes,
            "order": order,
            "seconds": {},
            "jobs": {},
            "pipelines": {},
            "pipeline_jobs": {},
            "rows_written": {},
            "strategies": {},
            "loadavg": list(os.getloadavg()),
        }
        for name in order:
            outcome = lab.process(name, versions)
            record["seconds"][name] = round(outcome.seconds, 3)
            record["jobs"][name] = outcome.jobs
            if name in (*OURS, "floor"):
                record["pipelines"][name] = {p: round(s, 3) for p, s in outcome.pipelines.items()}
                record["pipeline_jobs"][name] = outcome.pipeline_jobs
            if name in OURS:
                record["rows_written"][name] = outcome.rows_written
                record["strategies"][name] = outcome.strategies
            shown = ", ".join(
                f"{p} {s:.2f}s" + (f" {ran}" if (ran := outcome.strategies.get(p)) else "")
                for p, s in outcome.pipelines.items()
            )
            out(f"  {name:<12} {outcome.seconds:7.2f}s {outcome.jobs:4d} jobs  {shown}")
        record["check"] = check_targets(spark, upstreams, versions, lab)
        result["repeats"].append(record)
    result["summary"] = summarize(result["repeats"], lab.names)
    result["loadavg_after"] = list(os.getloadavg())
    return result


def run_scale(
    spark: SparkSession,
    root: Path,
    args: argparse.Namespace,
    out: Callable[[str], None],
    partial: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """:func:`run` once per size of ``args.scale`` at ``args.changed`` changed orders per
    commit, each in a folder of its own, then the growth table: each contender's median
    cycle seconds per size, each of ours against the recompute (paired), and how much each
    grew from the smallest size to the largest. ``partial`` gets the sizes measured so far
    after each one (the JSON is written as the run goes: a large size takes long).

    Raises:
        TargetMismatch: a target differed from the full transforms after a repeat.
    """
    profiles: dict[str, Any] = {}
    for profile in args.profile:
        profiled = argparse.Namespace(**{**vars(args), "profile": [profile]})
        profiles[profile] = _run_sizes(spark, root / profile, profiled, out, partial, profiles)
    return {"profiles": profiles}


def _run_sizes(
    spark: SparkSession,
    root: Path,
    args: argparse.Namespace,
    out: Callable[[str], None],
    partial: Callable[[dict[str, Any]], None] | None,
    done: dict[str, Any],
) -> dict[str, Any]:
    """:func:`run_scale` for the one profile of ``args``."""
    runs: dict[str, Any] = {}
    profile = args.profile[0]
    for size in args.scale:
        sized = argparse.Namespace(**{**vars(args), "orders": size, "change": args.changed / size})
        out(f"\n== {profile}: {size:,} orders, {args.changed:,} changed per commit "
            f"({sized.change:.3%})")  # fmt: skip
        runs[str(size)] = run(spark, root / f"orders-{size}", sized, out)
        _print_summary(out, runs[str(size)]["summary"])
        shutil.rmtree(root / f"orders-{size}", ignore_errors=True)
        if partial is not None:
            partial({"profiles": {**done, profile: {"scale": runs}}})
    names = list(args.contenders)
    first, last = str(args.scale[0]), str(args.scale[-1])
    growth = {
        n: round(
            runs[last]["summary"]["seconds"][n]["median"]
            / runs[first]["summary"]["seconds"][n]["median"],
            2,
        )
        for n in names
    }
    out(f"\ngrowth ({profile}) at {args.changed:,} changed orders per commit (median cycle "
        f"seconds, min-max over {args.repeats} repeats):")  # fmt: skip
    # Each of ours against the recompute and the floor, paired within its size's repeats.
    against = [
        f"{n}/{base}"
        for base in ("recompute", "floor")
        for n in names
        if n in OURS and base in names
    ]
    out(f"  {'orders':>12} " + " ".join(f"{n:>24}" for n in names)
        + "".join(f"  {a:>30}" for a in against))  # fmt: skip
    for size in args.scale:
        summary = runs[str(size)]["summary"]
        cells = " ".join(
            f"{s['median']:>9.2f} ({s['min']:.2f}-{s['max']:.2f})".rjust(24)
            for s in (summary["seconds"][n] for n in names)
        )
        ratios = "".join(f"  {_ratio_cell(summary['ratios'].get(a)):>30}" for a in against)
        out(f"  {size:>12,} {cells}{ratios}")
    out("  growth " + ", ".join(f"{n} x{g:.2f}" for n, g in growth.items())
        + f" from {args.scale[0]:,} to {args.scale[-1]:,} orders")  # fmt: skip
    return {"scale": runs, "growth": growth}


def _ratio_cell(spread: dict[str, float] | None) -> str:
    if spread is None:
        return ""
    return f"{spread['median']:.2f}x ({spread['min']:.2f}-{spread['max']:.2f})"


# ---------------------------------------------------------------------------------------
# Command line.


def _rows(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    value = int(float(text[:-1] if scale > 1 else text) * scale)
    if value < 100:
        raise argparse.ArgumentTypeError(f"at least 100 orders, got {text!r}")
    return value


def _fraction(text: str) -> float:
    text = text.strip()
    value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    if not 0 < value <= 0.5:
        raise argparse.ArgumentTypeError(f"a change must be above 0 and at most 50%, got {text!r}")
    return value


def _sizes(text: str) -> list[int]:
    sizes = sorted({_rows(t) for t in text.split(",") if t.strip()})
    if not sizes:
        raise argparse.ArgumentTypeError(f"no sizes in {text!r}")
    return sizes


def _profiles(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROFILES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown profile(s) {unknown}; known: {list(PROFILES)}")
    return [n for n in PROFILES if n in names]


def _contenders(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown contender(s) {unknown}; known: {list(CONTENDERS)}"
        )
    return [n for n in CONTENDERS if n in names]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.declared",
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--orders", type=_rows, default=300_000, help="orders rows (300k); "
                        "customers are a tenth of it, payments half")  # fmt: skip
    parser.add_argument("--change", type=_fraction, default=0.01, help="change per commit (1%%)")
    parser.add_argument("--repeats", type=int, default=5, help="paired repeats (5)")
    parser.add_argument("--learn", type=int, default=0, help="unmeasured batches before the "
                        "repeats, so that `auto` has measured its forms (0: the repeats include "
                        "its first tries)")  # fmt: skip
    parser.add_argument(
        "--contenders", type=_contenders, default=list(CONTENDERS),
        help=f"comma-separated subset of {','.join(CONTENDERS)}",
    )  # fmt: skip
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory (4g)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/declared.json")
    parser.add_argument("--root", type=Path, default=None, help="working folder (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the tables afterwards")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20k orders, 2 repeats")
    parser.add_argument("--scale", type=_sizes, default=None, help="comma-separated orders "
                        "sizes (2m,4m,8m,16m): one run each at --changed orders per commit, "
                        "and the growth table")  # fmt: skip
    parser.add_argument("--changed", type=_rows, default=2_000, help="with --scale: changed "
                        "orders per commit (2,000)")  # fmt: skip
    parser.add_argument("--profile", type=_profiles, default=None, help="how changes spread "
                        f"over the keys, comma-separated: {', '.join(PROFILES)} (uniform; "
                        "with --scale both)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.scale and "--contenders" not in " ".join(argv or sys.argv[1:]):
        args.contenders = ["declared", "recompute"]
    if args.profile is None:
        args.profile = list(PROFILES) if args.scale else ["uniform"]
    if not args.scale and len(args.profile) > 1:
        parser.error("one --profile at a time without --scale")
    if args.quick:
        args.orders, args.repeats = 20_000, 2
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = lambda line: print(line, flush=True)  # noqa: E731
    started_at, started = datetime.now(UTC), time.monotonic()
    conf = {"spark.driver.memory": args.driver_memory, **(QUICK_CONF if args.quick else {})}
    settings = {"master": "local[2]", "conf": conf}
    root = args.root or Path(tempfile.mkdtemp(prefix="bench-declared-"))
    root.mkdir(parents=True, exist_ok=True)

    import watermark_dagster  # noqa: F401 - build_session then uses the project's session

    spark = build_session(settings["master"], settings["conf"], "bench-declared")
    spark.sparkContext.setLogLevel("ERROR")
    result: dict[str, Any] = {
        "benchmark": "declared",
        "command": [
            Path(sys.executable).name,
            "-m",
            "benchmarks.declared",
            *(argv or sys.argv[1:]),
        ],
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": machine(),
        "spark": spark_description(spark, settings),
        "contenders": args.contenders,
        "descriptions": {n: CONTENDERS[n] for n in args.contenders},
        "orders": args.orders,
        "change": args.change,
        "upstreams": "customers, orders, payments (demo schema, change data feed on); per "
        "repeat one MERGE commit each of the change fraction, shaped by the profile (updates: "
        "orders half move customer, customers renamed, payments half move customer)",
        "profiles": {p: PROFILES[p] for p in args.profile},
        "repeats_requested": args.repeats,
        "correct": True,
        "stopped": None,
    }
    m = result["machine"]
    out(f"machine: {m['cpus']} cores, {m.get('cpu', '?')}, {m['java']}, commit {m['commit']}; "
        f"load average {_load()}")  # fmt: skip
    code = 0
    try:
        if args.scale:

            def partial(found: dict[str, Any]) -> None:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps({**result, **found}, indent=2) + "\n")

            result.update(run_scale(spark, root, args, out, partial))
        else:
            result.update(run(spark, root, args, out))
            out(f"summary: {args.orders:,} orders, {args.change:.2%} change per commit "
                f"({args.profile[0]}), {args.repeats} repeats")  # fmt: skip
            _print_summary(out, result["summary"])
    except TargetMismatch as e:
        result["correct"], result["stopped"], code = False, f"TargetMismatch: {e}", 1
    except CycleError as e:
        result["stopped"], code = f"CycleError: {e}", 1
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        result["seconds"] = round(time.monotonic() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if result["stopped"]:
        out(f"\nSTOPPED: {result['stopped']}")
    if not result["correct"]:
        out("FAILED: a target differs from the full transforms; the figures are void.")
    out(f"results: {args.out}; total {result['seconds'] / 60:.1f} min; load average {_load()}")
    return code


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
