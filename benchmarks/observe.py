"""Observation cost: our no-JVM observation vs a cold delta-rs load vs Spark's table history.

Builds a local Delta table with N commits (delta-rs, no JVM), then measures, in the same
run, the median time of:

* ``Observer.observe`` when nothing changed (one listing of ``_delta_log``),
* a cold ``deltalake.DeltaTable(path)`` load (what a naive observer would do each tick),
* Spark ``DeltaTable.forPath(spark, path).history(1)`` (the JVM way, session already warm).

Prints each and the ratios against ours. Usage:
    .venv/bin/python benchmarks/observe.py [--commits 20] [--repeat 200] [--no-spark]
"""

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.observe.observer import Observer


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()

    path = str(Path(tempfile.mkdtemp()) / "table")
    for i in range(args.commits):
        write_deltalake(
            path,
            pa.table({"id": pa.array([i], pa.int64())}),
            mode="append",
            configuration={"delta.enableChangeDataFeed": "true"},
        )
    upstream = DeltaUpstream(name="bench", path=path)
    observer = Observer()
    observer.observe(upstream)  # first look loads the metadata once

    ours = median_ms(lambda: observer.observe(upstream), args.repeat)
    cold = median_ms(lambda: DeltaTable(path).version(), max(20, args.repeat // 10))
    print(f"table with {args.commits} commits, median of repeated runs")
    print(f"  watermark observe (no new commit): {ours:8.3f} ms")
    print(f"  delta-rs cold load:                {cold:8.3f} ms   ({cold / ours:,.0f}x ours)")
    if not args.no_spark:
        from delta.tables import DeltaTable as SparkDeltaTable

        from watermark_dagster.runtime.spark import build_spark_session

        spark = build_spark_session(master="local[1]")
        spark.sparkContext.setLogLevel("ERROR")
        history = lambda: SparkDeltaTable.forPath(spark, path).history(1).collect()  # noqa: E731
        history()  # warm the JVM and Delta's caches
        hist = median_ms(history, max(10, args.repeat // 20))
        print(f"  Spark history(1), warm session:    {hist:8.3f} ms   ({hist / ours:,.0f}x ours)")
        spark.stop()


if __name__ == "__main__":
    main()
