"""Soak run of the model-based exactly-once test: many random histories in a row.

    .venv/bin/python -m benchmarks.soak --cases 500 --workers 2 --first-seed 1000 --steps 5

Each worker process runs cases with its own local Spark session; a failing case prints
its seed and error and the worker goes on with the next seed, so one run lists every
failing seed (replay one with ``run_case(spark, root, SEED)`` from ``tests/model/harness.py``).
Progress lines go to stdout; the final line sums what the cases did (commits, cycles,
crashes, injected pipeline failures, replays, backfills, batches) and counts failed cases.
"""

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path


def _worker(seeds: list[int], steps: int, queue: "multiprocessing.Queue") -> None:  # type: ignore[type-arg]
    from tests.conftest import LONG_LIVED_SPARK_CONF
    from tests.model.harness import run_case, summary
    from watermark_dagster.runtime.spark import build_spark_session

    # One core per worker needs one shuffle partition. With the full JIT of a long-lived
    # JVM, 5 cases in a row took 69 s against 93 s with the short-lived test settings.
    conf = {
        **LONG_LIVED_SPARK_CONF,
        "spark.sql.shuffle.partitions": "1",
        "spark.default.parallelism": "1",
    }
    spark = build_spark_session(master="local[1]", app_name="soak", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    root = Path(tempfile.mkdtemp(prefix="soak-"))
    for seed in seeds:
        started = time.monotonic()
        try:
            stats = run_case(spark, root, seed, steps=steps)
        except Exception as e:  # reported to the parent with the seed
            queue.put(("failed", seed, f"{type(e).__name__}: {e}"))
            continue
        queue.put(("ok", seed, summary(stats), time.monotonic() - started))
    queue.put(("done", None, None))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)

    seeds = list(range(args.first_seed, args.first_seed + args.cases))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(seeds[i :: args.workers], args.steps, queue))
        for i in range(args.workers)
    ]
    for w in workers:
        w.start()
    totals: dict[str, int] = {}
    done = failed = 0
    started = time.monotonic()
    print(
        f"soak: {args.cases} cases (seeds {seeds[0]}..{seeds[-1]}), {args.steps} steps each, "
        f"{args.workers} workers",
        flush=True,
    )
    while done < args.workers:
        kind, seed, *rest = queue.get()
        if kind == "ok":
            stats, seconds = rest
            for key, value in stats.items():
                totals[key] = totals.get(key, 0) + value
            print(
                f"case seed={seed} ok in {seconds:.1f}s; so far {totals['cases']} cases, "
                f"{totals['commits']} commits, {totals['crashes']} crashes, "
                f"{time.monotonic() - started:.0f}s",
                flush=True,
            )
        elif kind == "failed":
            failed += 1
            print(f"case seed={seed} FAILED: {rest[0]}", flush=True)
        else:
            done += 1
    for w in workers:
        w.join()
    seconds = time.monotonic() - started
    print(f"soak: {totals} in {seconds:.0f}s, failed cases: {failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
