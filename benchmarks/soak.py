"""Soak run of a model test: many random histories in a row, in worker processes.

    .venv/bin/python -m benchmarks.soak --cases 500 --workers 2 --first-seed 1000 --steps 5
    .venv/bin/python -m benchmarks.soak --declared --cases 100 --workers 2 --first-seed 1000

The default is the crash soak, the exactly-once model of ``tests/model/harness.py`` (5 steps
a case). ``--declared`` runs the declared pipelines' cases of ``tests/model/declared.py``
instead (10 steps a case, what ``pytest -m soak`` runs in one process), each checked
against its recompute after every batch.

Each worker process runs cases with its own local Spark session; a failing case prints
its seed and error and the worker goes on with the next seed, so one run lists every
failing seed (replay one with ``run_case(spark, root, SEED)`` from the module above, or
``WATERMARK_DECLARED_SEEDS=SEED WATERMARK_DECLARED_STEPS=10 pytest tests/model/test_declared.py``).
Progress lines go to stdout; the final line sums what the cases did (commits, cycles,
crashes, injected pipeline failures, replays, backfills, batches) and counts failed cases.
"""

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _worker(
    seeds: list[int],
    steps: int,
    declared: bool,
    queue: "multiprocessing.Queue",  # type: ignore[type-arg]
) -> None:
    from tests.conftest import LONG_LIVED_SPARK_CONF
    from watermark_dagster.runtime.spark import build_spark_session

    if declared:
        from tests.model.declared import run_case

        def summary(stats: Any) -> dict[str, int]:
            return dict(vars(stats))
    else:
        from tests.model.harness import run_case, summary

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
            stats = run_case(spark, root, seed, steps=steps)  # type: ignore[operator]
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
    parser.add_argument(
        "--declared", action="store_true", help="the declared pipelines' cases, not the crash model"
    )
    parser.add_argument("--steps", type=int, default=None, help="steps a case (5; 10 declared)")
    args = parser.parse_args(argv)
    steps = args.steps if args.steps is not None else (10 if args.declared else 5)

    seeds = list(range(args.first_seed, args.first_seed + args.cases))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(seeds[i :: args.workers], steps, args.declared, queue))
        for i in range(args.workers)
    ]
    for w in workers:
        w.start()
    totals: dict[str, int] = {}
    done = failed = 0
    started = time.monotonic()
    print(
        f"{'declared' if args.declared else 'crash'} soak: {args.cases} cases "
        f"(seeds {seeds[0]}..{seeds[-1]}), {steps} steps each, "
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
