"""Soak run of a model test: many random histories in a row, in worker processes.

    .venv/bin/python -m benchmarks.soak --cases 500 --workers 2 --first-seed 1000 --steps 5
    .venv/bin/python -m benchmarks.soak --declared --cases 100 --workers 2 --first-seed 1000
    .venv/bin/python -m benchmarks.soak --sql --cases 12 --workers 1 --shapes 25 --steps 2

The default is the crash soak, the exactly-once model of ``tests/model/harness.py`` (5 steps
a case). ``--declared`` runs the declared pipelines' cases of ``tests/model/declared.py``
instead (10 steps a case, what ``pytest -m soak`` runs in one process), each checked
against its recompute after every batch. ``--sql`` runs the generated declared SQL
pipelines of ``tests/model/sql_shapes.py`` (``--shapes`` accepted shapes a case, 25 by
default, over one history of ``--steps`` random batches after the first load and a batch
moving each child's join key, 2 by default), each target compared with DataFusion after
every batch; its final lines count the shapes accepted, checked and refused by reason, and
print every mismatch, failed batch and DataFusion error with its seed and SQL.

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


def _as_is(stats: Any) -> Any:
    return stats


def _worker(
    seeds: list[int],
    steps: int,
    declared: bool,
    queue: "multiprocessing.Queue",  # type: ignore[type-arg]
    shapes: int | None = None,
) -> None:
    from tests.conftest import LONG_LIVED_SPARK_CONF
    from watermark_dagster.runtime.spark import build_spark_session

    if shapes is not None:
        from tests.model.sql_shapes import run_sql_case

        def run_case(spark: Any, root: Path, seed: int, steps: int) -> Any:
            return run_sql_case(spark, root, seed, steps=steps, shapes=shapes)

        summary = _as_is  # an SqlStats, summed by the parent
    elif declared:
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
    parser.add_argument(
        "--sql", action="store_true", help="generated declared SQL checked against DataFusion"
    )
    parser.add_argument("--shapes", type=int, default=25, help="accepted shapes a --sql case")
    parser.add_argument(
        "--steps", type=int, default=None, help="steps a case (5; 10 declared; 2 sql)"
    )
    args = parser.parse_args(argv)
    default_steps = 2 if args.sql else 10 if args.declared else 5
    steps = args.steps if args.steps is not None else default_steps
    shapes = args.shapes if args.sql else None
    mode = "sql" if args.sql else "declared" if args.declared else "crash"

    seeds = list(range(args.first_seed, args.first_seed + args.cases))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker, args=(seeds[i :: args.workers], steps, args.declared, queue, shapes)
        )
        for i in range(args.workers)
    ]
    for w in workers:
        w.start()
    totals: dict[str, int] = {}
    sql_totals = None
    done = failed = 0
    started = time.monotonic()
    print(
        f"{mode} soak: {args.cases} cases "
        f"(seeds {seeds[0]}..{seeds[-1]}), {steps} steps each, "
        f"{args.workers} workers",
        flush=True,
    )
    while done < args.workers:
        kind, seed, *rest = queue.get()
        if kind == "ok" and shapes is not None:
            stats, seconds = rest
            if sql_totals is None:
                sql_totals = stats
            else:
                sql_totals.add(stats)
            findings = len(stats.mismatches) + len(stats.run_failures)
            findings += len(stats.datafusion_errors)
            refusals = len(stats.duplicate_refusals)
            print(
                f"case seed={seed} ok in {seconds:.1f}s: {stats.checked} shapes checked "
                f"after {stats.batches} batches, {findings} findings"
                + (f", {refusals} refused at run time (several rows a key)" if refusals else "")
                + "; so far "
                f"{sql_totals.cases} cases, {sql_totals.checked} shapes checked, "
                f"{time.monotonic() - started:.0f}s",
                flush=True,
            )
            failed += findings > 0
        elif kind == "ok":
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
    if sql_totals is not None:
        for title, findings in (
            ("MISMATCH", sql_totals.mismatches),
            ("RUN-TIME FAILURE", sql_totals.run_failures),
            ("DATAFUSION ERROR", sql_totals.datafusion_errors),
            ("REFUSED AT RUN TIME (not a finding)", sql_totals.duplicate_refusals),
        ):
            for finding in findings:
                print(f"\n{title} {finding}", flush=True)
        print(f"\nsql soak: {sql_totals.summary()}", flush=True)
    print(f"soak: {totals or 'see above'} in {seconds:.0f}s, failed cases: {failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
