"""What each part of our MERGE costs: one change set merged into one target, by a plain
Delta MERGE (the form of Structured Streaming's ``foreachBatch`` floor) and by ours, whole
and with one of its additions turned off at a time (:class:`MergeForm`); both also with
Spark's adaptive query execution off.

    .venv/bin/python -m benchmarks.merge_forms                       # 2M rows, 0.1%, 5 repeats
    .venv/bin/python -m benchmarks.merge_forms --rows 8M --change 1% --repeats 3

The target is built once by our own first load (deletion vectors, clustered on ``id``,
range-partitioned files), as a pipeline's target is. The change set (updates, deletes and
inserts of ``--change`` of the rows, ids drawn uniformly) is prepared and persisted once.
After one untimed round of every form (JIT and caches warm), each repeat restores the
target to its first-load version before every form, in an order rotated per repeat:
each form gets the same table and the same source.

Per form it prints the median wall seconds with min-max, the ratio to the plain MERGE
paired per repeat, the Spark jobs, and Delta's own figures for the MERGE commit (its
``executionTimeMs``, ``scanTimeMs`` and ``rewriteTimeMs``, rows copied, files added and
removed, deletion vectors added), plus the load average. Every form must leave the same
rows (checked after each run against the plain MERGE's result); a difference exits 1.
A profile of the mechanism measured side by side, never asserted in tests.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.baselines import build_session
from benchmarks.declared import _fraction, _rows
from watermark_dagster.core.columns import BATCH_COLUMN, SEQ_COLUMN

KEYS = ["id"]
COLUMNS = ["id", "customer_id", "amount_cents", "day", "payload"]
METRICS = (
    "executionTimeMs",
    "scanTimeMs",
    "rewriteTimeMs",
    "numTargetRowsCopied",
    "numTargetFilesAdded",
    "numTargetFilesRemoved",
    "numTargetDeletionVectorsAdded",
)


@dataclass
class Run:
    seconds: float
    jobs: int
    metrics: dict[str, int]


def _table(spark: SparkSession, rows: int, first_id: int = 0) -> DataFrame:
    ids = spark.range(first_id, first_id + rows)
    return ids.select(
        F.col("id"),
        (F.col("id") % 50_000).alias("customer_id"),
        (F.pmod(F.xxhash64("id"), F.lit(100_000))).alias("amount_cents"),
        F.date_add(F.lit("2026-01-01").cast("date"), (F.col("id") % 365).cast("int")).alias("day"),
        F.sha2(F.col("id").cast("string"), 256).alias("payload"),
    )


def _changes(spark: SparkSession, rows: int, fraction: float) -> DataFrame:
    """``fraction`` of the rows changed: 80% updates, 10% deletes, 10% inserts of new ids."""
    changed = max(10, round(rows * fraction))
    picked = (
        spark.range(rows)
        .where(F.pmod(F.xxhash64("id", F.lit(7)), F.lit(rows)) < changed)
        .select("id")
    )
    updates = (
        _table(spark, rows)
        .join(picked, "id")
        .withColumn("amount_cents", F.col("amount_cents") + 1)
        .withColumn(
            "_change_type",
            F.when(F.pmod(F.col("id"), F.lit(9)) == 0, F.lit("delete")).otherwise(
                F.lit("update_postimage")
            ),
        )
    )
    inserts = _table(spark, max(1, changed // 9), first_id=rows).withColumn(
        "_change_type", F.lit("insert")
    )
    return updates.unionByName(inserts)


def _jobs(spark: SparkSession, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def _merge_metrics(spark: SparkSession, target: str) -> dict[str, int]:
    from delta.tables import DeltaTable

    last = DeltaTable.forPath(spark, target).history(1).collect()[0]
    metrics = last["operationMetrics"] or {}
    return {m: int(metrics.get(m, 0)) for m in METRICS}


def _plain(spark: SparkSession, source: DataFrame, target: str) -> None:
    """The floor's form: ``DeltaTable.merge`` on ``id``, no guard, no skipping condition."""
    from delta.tables import DeltaTable

    deleting = F.col("s._change_type") == "delete"
    values = {c: F.col(f"s.{c}") for c in [*COLUMNS, SEQ_COLUMN, BATCH_COLUMN]}
    (
        DeltaTable.forPath(spark, target)
        .alias("t")
        .merge(source.alias("s"), F.col("t.id") == F.col("s.id"))
        .whenMatchedDelete(condition=deleting)
        .whenMatchedUpdate(condition=~deleting, set=values)
        .whenNotMatchedInsert(condition=~deleting, values=values)
        .execute()
    )


def _without_aqe(spark: SparkSession, merge: Callable[[], None]) -> Callable[[], None]:
    """``merge`` with adaptive query execution off: each shuffle or broadcast stage is then
    part of one job instead of a job of its own."""

    def run() -> None:
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        try:
            merge()
        finally:
            spark.conf.set("spark.sql.adaptive.enabled", "true")

    return run


def forms() -> dict[str, Any]:
    from watermark_dagster.write.merge import MergeForm

    ours = MergeForm()
    return {
        "ours": ours,
        "ours without null-safe keys": replace(ours, null_safe=False),
        "ours without skipping condition": replace(ours, skipping=False),
        "ours without broadcast hint": replace(ours, broadcast=False),
        "ours without schema evolution": replace(ours, schema_evolution=False),
        "ours without _wm_seq guard": replace(ours, guard=False),
        "ours without all four": MergeForm(
            null_safe=False, skipping=False, broadcast=False, schema_evolution=False, guard=True
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=_rows, default=2_000_000, help="target rows (2M)")
    parser.add_argument("--change", type=_fraction, default=0.001, help="rows changed (0.1%%)")
    parser.add_argument("--repeats", type=int, default=5, help="rotated repeats (5)")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory (4g)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument(
        "--forms",
        type=lambda text: [f.strip() for f in text.split(",") if f.strip()],
        default=None,
        help="comma-separated subset of the forms' names (default: all; 'plain' always runs)",
    )
    args = parser.parse_args(argv)
    known = ["plain", *forms(), *(f"{n} without adaptive execution" for n in ("plain", "ours"))]
    unknown = [f for f in args.forms or [] if f not in known]
    if unknown:
        parser.error(f"unknown form(s) {unknown}; known: {known}")

    from watermark_dagster.write.merge import _merge, merge_into_target, prepare_changes
    from watermark_dagster.write.summary import range_keys, summarize

    spark = build_session(
        "local[2]", {"spark.driver.memory": args.driver_memory}, "bench-merge-forms"
    )
    spark.sparkContext.setLogLevel("ERROR")
    root = Path(tempfile.mkdtemp(prefix="merge-forms-"))
    target = str(root / "target")
    load = [os.getloadavg()[0]]
    print(f"first load: {args.rows:,} rows into {target} ...", flush=True)
    merge_into_target(
        spark, _table(spark, args.rows), target=target, keys=KEYS, batch_seq=1,
        batch_id="b000001", pipeline="bench",
    )  # fmt: skip
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, target)
    base = table.history(1).collect()[0]["version"]
    prepared = prepare_changes(
        _changes(spark, args.rows, args.change),
        keys=KEYS, batch_seq=2, batch_id="b000002", pipeline="bench",
    ).persist(StorageLevel.MEMORY_AND_DISK)  # fmt: skip
    summary = summarize(prepared, keys=KEYS, ranges=range_keys(prepared, KEYS))
    print(f"change set: {summary.rows:,} rows ({summary.deletes:,} deletes)", flush=True)

    contenders: dict[str, Callable[[], None]] = {"plain": lambda: _plain(spark, prepared, target)}
    for name, form in forms().items():
        contenders[name] = lambda form=form: _merge(
            spark, prepared, summary, target=target, keys=KEYS, insert_missing=True, form=form
        )
    for name in ("plain", "ours"):
        contenders[f"{name} without adaptive execution"] = _without_aqe(spark, contenders[name])
    if args.forms:
        contenders = {n: c for n, c in contenders.items() if n == "plain" or n in args.forms}
    runs: dict[str, list[Run]] = {name: [] for name in contenders}
    expected: set[tuple[Any, ...]] | None = None
    names = list(contenders)
    # One untimed round first: the JVM's JIT and Delta's caches warm up on every form.
    for name in names:
        table.restoreToVersion(base)
        contenders[name]()
    for repeat in range(args.repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            table.restoreToVersion(base)
            group = f"merge-forms-{repeat}-{name}"
            spark.sparkContext.setJobGroup(group, group)
            started = time.perf_counter()
            contenders[name]()
            seconds = time.perf_counter() - started
            spark.sparkContext.setJobGroup("check", "check")
            runs[name].append(Run(seconds, _jobs(spark, group), _merge_metrics(spark, target)))
            rows = spark.read.format("delta").load(target).select(*COLUMNS)
            digest = {tuple(r) for r in rows.where(F.col("id") % 997 == 0).collect()}
            total = rows.count()
            if expected is None:
                expected = {("total", total), *digest}
            elif expected != {("total", total), *digest}:
                print(f"{name}: the target differs from the first form's result", flush=True)
                return 1
            print(f"repeat {repeat + 1} {name}: {seconds:.2f} s", flush=True)
        load.append(os.getloadavg()[0])

    plain = [r.seconds for r in runs["plain"]]
    print(
        f"\n{args.rows:,} rows, {args.change:.2%} changed, {args.repeats} repeats, "
        f"load average {min(load):.1f} to {max(load):.1f}\n"
    )
    header = (
        "form | median s (min-max) | / plain, paired | jobs | Delta exec/scan/rewrite ms | "
        "copied | files +/- | DVs"
    )
    print(header)
    print(" | ".join("---" for _ in header.split(" | ")))
    report: dict[str, Any] = {"rows": args.rows, "change": args.change, "load": load}
    for name, rs in runs.items():
        secs = [r.seconds for r in rs]
        ratios = [s / p for s, p in zip(secs, plain, strict=True)]
        med = {m: statistics.median(r.metrics[m] for r in rs) for m in METRICS}
        jobs = statistics.median(r.jobs for r in rs)
        print(
            f"{name} | {statistics.median(secs):.2f} ({min(secs):.2f}-{max(secs):.2f}) | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{jobs:.0f} | {med['executionTimeMs']:.0f}/{med['scanTimeMs']:.0f}/"
            f"{med['rewriteTimeMs']:.0f} | {med['numTargetRowsCopied']:.0f} | "
            f"{med['numTargetFilesAdded']:.0f}/{med['numTargetFilesRemoved']:.0f} | "
            f"{med['numTargetDeletionVectorsAdded']:.0f}"
        )
        report[name] = {"seconds": secs, "ratios": ratios, "jobs": jobs, "metrics": med}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
