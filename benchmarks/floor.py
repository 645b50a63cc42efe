"""The floor of the demo's declared pipelines: the least Spark work that applies one batch.

Written by hand, with none of our bookkeeping (no plan, checkpoint, version guard, count or
summary): per batch each pipeline reads the change feed of the pinned commits, builds the
rows that must change, and applies them with one plain Delta MERGE into a target created
with our layout (clustered on the key, deletion vectors on, first load range-sorted on the
key):

* ``orders_enriched``: the changed orders (the latest change of each) joined to the
  customers at the pinned version, plus the orders of the changed customers at the pinned
  version, joined the same way; deleted orders deleted.
* ``customer_payments``: the customers the changes touch (changed customers, and the old
  and new customer of each changed payment), their groups recomputed from the payments and
  customers at the pinned version; customers gone deleted.

A declared batch is judged against this (``ours/floor`` in ``benchmarks.declared``): what a
batch costs beyond it is ours, not Delta's.
"""

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
DELETE = "_delete"
KEYS = {"orders_enriched": "order_id", "customer_payments": "customer_id"}
ORDER_COLUMNS = ("order_id", "customer_id", "amount_cents", "status")


class Floor:
    """The two pipelines by hand, each over its own target, brought up to given upstream
    versions one batch at a time."""

    def __init__(self, spark: SparkSession, upstreams: Path, targets: Mapping[str, str]) -> None:
        self.spark, self.upstreams, self.targets = spark, upstreams, dict(targets)
        self.versions: dict[str, int] | None = None

    def _snapshot(self, table: str, version: int) -> DataFrame:
        return (
            self.spark.read.format("delta")
            .option("versionAsOf", version)
            .load(str(self.upstreams / table))
        )

    def setup(self, versions: Mapping[str, int]) -> None:
        """The first load: the full transforms at ``versions`` into new targets of our
        layout."""
        from watermark_dagster.demo.pipelines import full_customer_payments, full_orders_enriched
        from watermark_dagster.write.layout import (
            create_target,
            laid_out,
            target_layout,
        )

        def at(table: str) -> DataFrame:
            return self._snapshot(table, versions[table])

        outputs = {
            "orders_enriched": full_orders_enriched(at("orders"), at("customers")),
            "customer_payments": full_customer_payments(at("customers"), at("payments")),
        }
        for name, frame in outputs.items():
            layout = target_layout(self.spark, frame.schema, keys=(KEYS[name],), merge=True)
            create_target(self.spark, self.targets[name], frame.schema, layout)
            rows = laid_out(self.spark, frame, frame.count(), layout)
            rows.write.format("delta").mode("append").save(self.targets[name])
        self.versions = dict(versions)

    def process(
        self, versions: Mapping[str, int], counter: Any
    ) -> tuple[dict[str, float], dict[str, int]]:
        """Apply the commits after the last versions up to ``versions``; seconds and Spark
        jobs per pipeline, each in a job group of ``counter``'s
        (:class:`benchmarks.declared.JobCounter`)."""
        assert self.versions is not None, "setup first"
        ranges = {t: (self.versions[t] + 1, versions[t]) for t in versions}
        seconds, jobs = {}, {}
        for name, step in (
            ("orders_enriched", self._orders_enriched),
            ("customer_payments", self._customer_payments),
        ):
            group = counter.group(f"floor-{name}")
            began = time.perf_counter()
            step(ranges, versions)
            seconds[name] = time.perf_counter() - began
            jobs[name] = counter.jobs(group)
        self.versions = dict(versions)
        return seconds, jobs

    def _change_rows(self, table: str, ranges: Mapping[str, tuple[int, int]]) -> DataFrame:
        """``table``'s change feed over its range, read once (lineage cut: every later use
        reads the rows kept on the executors, not the feed again)."""
        start, end = ranges[table]
        return (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", start)
            .option("endingVersion", end)
            .load(str(self.upstreams / table))
            .localCheckpoint()
        )

    @staticmethod
    def _latest(changes: DataFrame, key: str) -> DataFrame:
        """The latest change of each key (no pre-images)."""
        newest_first = Window.partitionBy(key).orderBy(F.col(COMMIT_VERSION).desc())
        return (
            changes.where(F.col(CHANGE_TYPE) != "update_preimage")
            .withColumn("_rank", F.row_number().over(newest_first))
            .where(F.col("_rank") == 1)
        )

    @staticmethod
    def _values(*frames: DataFrame, column: str) -> list[object]:
        """The distinct values of ``column`` in ``frames``, on the driver (one job)."""
        union = frames[0].select(column)
        for frame in frames[1:]:
            union = union.unionByName(frame.select(column))
        return [r[0] for r in union.distinct().collect()]

    def _orders_enriched(
        self, ranges: Mapping[str, tuple[int, int]], versions: Mapping[str, int]
    ) -> None:
        columns = ("order_id", "customer_id", "customer_name", "amount_cents", "status")
        latest = self._latest(self._change_rows("orders", ranges), "order_id").localCheckpoint()
        is_delete = F.col(CHANGE_TYPE) == "delete"
        upserts = latest.where(~is_delete).select(*ORDER_COLUMNS)
        changed_customers = self._values(
            self._change_rows("customers", ranges), column="customer_id"
        )
        # The orders of the changed customers: a scan of the orders (nothing narrows it).
        reached = (
            self._snapshot("orders", versions["orders"])
            .where(F.col("customer_id").isin(changed_customers))
            .select(*ORDER_COLUMNS)
        )
        rows = upserts.unionByName(reached).dropDuplicates(["order_id"]).localCheckpoint()
        # Only the customers those rows name (the customers' files skipped on their key).
        named = self._values(rows, column="customer_id")
        names = (
            self._snapshot("customers", versions["customers"])
            .where(F.col("customer_id").isin(named))
            .select("customer_id", F.col("name").alias("customer_name"))
        )
        enriched = (
            rows.join(F.broadcast(names), "customer_id", "left")
            .select(*columns)
            .withColumn(DELETE, F.lit(False))
        )
        deletes = latest.where(is_delete).select(
            "order_id",
            *(F.lit(None).cast(enriched.schema[c].dataType).alias(c) for c in columns[1:]),
            F.lit(True).alias(DELETE),
        )
        self._merge("orders_enriched", enriched.unionByName(deletes), columns)

    def _customer_payments(
        self, ranges: Mapping[str, tuple[int, int]], versions: Mapping[str, int]
    ) -> None:
        from watermark_dagster.demo.pipelines import full_customer_payments

        columns = ("customer_id", "name", "total_paid_cents", "payment_count")
        # Changed customers, and the old and new customer of each changed payment.
        touched = self._values(
            self._change_rows("customers", ranges),
            self._change_rows("payments", ranges),
            column="customer_id",
        )

        def reached(table: str) -> DataFrame:
            return self._snapshot(table, versions[table]).where(F.col("customer_id").isin(touched))

        customers = reached("customers").localCheckpoint()
        rows = full_customer_payments(customers, reached("payments")).withColumn(
            DELETE, F.lit(False)
        )
        present = {r[0] for r in customers.select("customer_id").collect()}
        gone = [(k,) for k in touched if k not in present]
        deletes = self.spark.createDataFrame(gone, "customer_id long").select(
            "customer_id",
            *(F.lit(None).cast(rows.schema[c].dataType).alias(c) for c in columns[1:]),
            F.lit(True).alias(DELETE),
        )
        self._merge("customer_payments", rows.unionByName(deletes), columns)

    def _merge(self, name: str, source: DataFrame, columns: tuple[str, ...]) -> None:
        """One plain MERGE; like ours, a target under the small-target threshold rewrites
        the files it touches instead of writing deletion vectors (a Delta setting, no
        bookkeeping)."""
        from contextlib import nullcontext

        from delta.tables import DeltaTable
        from deltalake import DeltaTable as RsDeltaTable

        from watermark_dagster.frames.delta import session_setting
        from watermark_dagster.write.layout import (
            PERSISTENT_DELETION_VECTORS_CONF,
            rewrites_small_target,
        )

        target = self.targets[name]
        table = RsDeltaTable(target)
        small = rewrites_small_target(
            self.spark, target, table, table.get_add_actions(flatten=True)
        )
        key = KEYS[name]
        delete: Column = F.col(f"s.{DELETE}")
        values: dict[str, str | Column] = {c: F.col(f"s.{c}") for c in columns}
        setting = (
            session_setting(self.spark, PERSISTENT_DELETION_VECTORS_CONF, "false")
            if small is not None
            else nullcontext()
        )
        with setting:
            (
                DeltaTable.forPath(self.spark, target)
                .alias("t")
                .merge(source.alias("s"), F.col(f"t.{key}") == F.col(f"s.{key}"))
                .whenMatchedDelete(condition=delete)
                .whenMatchedUpdate(condition=~delete, set=values)
                .whenNotMatchedInsert(condition=~delete, values=values)
                .execute()
            )
