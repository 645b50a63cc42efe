"""Observation cost: our no-JVM observation vs a cold delta-rs load vs Spark's table history.

One table (the default): builds a local Delta table with N commits (delta-rs, no JVM), then
measures, in the same run, the median time of:

* ``Observer.observe`` when nothing changed (one listing of ``_delta_log``),
* a cold ``deltalake.DeltaTable(path)`` load (what a naive observer would do each tick),
* Spark ``DeltaTable.forPath(spark, path).history(1)`` (the JVM way, session already warm).

Many tables (``--tables 50 500 2000``): builds that many small local tables and measures
:func:`observation_costs` for each count: one ``Observer.observe_all`` over all of them
cold (a new observer: nothing seen in this process), warm with nothing new, and warm with
10% of the tables changed by one commit, against the floor of one ``os.listdir`` of each
``_delta_log`` and a delta-rs load of every table. CPU and wall seconds, median and min-max
of the repeats. "Cold" is cold for the process; the files are in the OS page cache.

Usage:
    .venv/bin/python benchmarks/observe.py [--commits 20] [--repeat 200] [--no-spark]
    .venv/bin/python benchmarks/observe.py --tables 50 500 2000 [--repeat 5] [--json out.json]
"""

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.observe.log import REPLAY_COUNTS
from watermark_dagster.observe.observer import Observer


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def make_tables(root: Path, count: int, *, commits: int = 3) -> list[DeltaUpstream]:
    """``count`` small local tables under ``root`` (each its own schema, CDF on, ``commits``
    commits), as upstreams named ``t0``, ``t1``, ..."""
    upstreams = []
    for i in range(count):
        path = str(root / f"t{i}")
        for c in range(commits):
            write_deltalake(
                path,
                pa.table({"id": pa.array([c], pa.int64()), f"v{i}": pa.array([c], pa.int64())}),
                mode="append",
                configuration={"delta.enableChangeDataFeed": "true"},
            )
        upstreams.append(DeltaUpstream(name=f"t{i}", path=path))
    return upstreams


def _summary(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def _timed(fn: Callable[[], object], repeat: int, before: Callable[[], object]) -> dict:
    """CPU and wall seconds of ``fn`` over ``repeat`` runs, ``before`` run untimed first."""
    cpu, wall = [], []
    for _ in range(repeat):
        before()
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"cpu_s": _summary(cpu), "wall_s": _summary(wall)}


def observation_costs(
    upstreams: list[DeltaUpstream], *, repeat: int = 5, changed: float = 0.1, seed: int = 13
) -> dict[str, Any]:
    """Observation of ``upstreams`` (local Delta tables): cold, warm with nothing new, warm
    with a fraction ``changed`` of the tables given one new commit each (written before
    the timed look), the floor (one ``os.listdir`` of each ``_delta_log``) and a delta-rs
    load of every table, each ``repeat`` times.

    Returns:
        case -> ``{"cpu_s": {median, min, max}, "wall_s": {...}}``, plus ``files_read``:
        the commit files and checkpoints one cold and one changed look read.
    """
    logs = [os.path.join(u.path, "_delta_log") for u in upstreams]
    rng = random.Random(seed)
    observer = Observer()
    out: dict[str, Any] = {"tables": len(upstreams)}

    def fresh() -> None:
        nonlocal observer
        observer = Observer()

    def look() -> None:
        results = observer.observe_all(upstreams)
        assert all(not isinstance(r, Exception) for r in results.values()), results

    out["floor_listdir"] = _timed(lambda: [os.listdir(p) for p in logs], repeat, lambda: None)
    before = (REPLAY_COUNTS.commits, REPLAY_COUNTS.checkpoints)
    out["cold"] = _timed(look, repeat, fresh)
    cold_files = (
        (REPLAY_COUNTS.commits - before[0]) // repeat,
        (REPLAY_COUNTS.checkpoints - before[1]) // repeat,
    )
    out["warm_nothing_new"] = _timed(look, repeat, lambda: None)
    step = [0]

    def change() -> None:
        step[0] += 1
        for u in rng.sample(upstreams, max(1, round(len(upstreams) * changed))):
            write_deltalake(
                u.path,
                pa.table({"id": pa.array([100 + step[0]], pa.int64())}),
                mode="append",
                schema_mode="merge",
            )

    before = (REPLAY_COUNTS.commits, REPLAY_COUNTS.checkpoints)
    out[f"warm_{round(changed * 100)}pct_changed"] = _timed(look, repeat, change)
    changed_files = (
        (REPLAY_COUNTS.commits - before[0]) // repeat,
        (REPLAY_COUNTS.checkpoints - before[1]) // repeat,
    )
    out["deltars_load_each"] = _timed(
        lambda: [DeltaTable(u.path).version() for u in upstreams], 1, lambda: None
    )
    out["files_read"] = {
        "cold": {"commits": cold_files[0], "checkpoints": cold_files[1]},
        "changed": {"commits": changed_files[0], "checkpoints": changed_files[1]},
    }
    return out


def print_costs(costs: dict[str, Any]) -> None:
    """Print what :func:`observation_costs` measured, with ratios to the listing floor."""
    floor = costs["floor_listdir"]
    print(f"{costs['tables']} tables: seconds, median [min-max], and median / the listing floor's")
    for case, m in costs.items():
        if not isinstance(m, dict) or "cpu_s" not in m:
            continue
        cells = []
        for kind in ("cpu_s", "wall_s"):
            t, f = m[kind], floor[kind]["median"]
            cells.append(
                f"{kind[:-2]} {t['median']:7.4f} [{t['min']:.4f}-{t['max']:.4f}]"
                f" {t['median'] / f:6.1f}x"
            )
        print(f"  {case:22s} " + "   ".join(cells))
    print(f"  files read per look: {costs['files_read']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--tables", type=int, nargs="+", help="observe this many tables")
    parser.add_argument("--json", type=Path, help="write the many-table results here")
    parser.add_argument("--table-commits", type=int, default=3, help="commits per table")
    args = parser.parse_args()

    if args.tables:
        results = []
        for count in args.tables:
            root = Path(tempfile.mkdtemp(prefix=f"observe-{count}-"))
            upstreams = make_tables(root, count, commits=args.table_commits)
            costs = observation_costs(upstreams, repeat=args.repeat or 5)
            print_costs(costs)
            results.append(costs)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return
    args.repeat = args.repeat or 200
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
