"""What a long-lived Spark engine saves: one demo batch through `watermark run` (a new
process, a new JVM) against the same batch sent to the resident engine (`watermark engine`)
and in a process whose JVM is already warm.

    .venv/bin/python benchmarks/engine.py --rounds 3 [--out engine.json]

Steps, on a fresh demo home (WATERMARK_HOME in a temporary folder):

1. ``watermark demo --rounds 0`` seeds the upstreams and runs the first loads (not timed).
2. ``watermark run`` with nothing to do, timed: the fixed cost of a cycle without a JVM
   (Python, Dagster, observing and planning).
3. ``--rounds`` times: one round of demo changes is committed (by this process, not timed),
   then ``watermark run`` is timed: a cold process that starts a JVM and runs the batch.
4. ``watermark engine`` is started; after one untimed batch, ``--rounds`` times: commit a
   round, time ``watermark run`` with ``WATERMARK_ENGINE=resident`` (the run process starts
   no JVM; the engine runs the pipelines on its warm session).
5. ``--rounds`` times, in this process with its JVM warmed by one untimed batch: commit a
   round, time ``HeadlessRunner.run_until_idle()``: the same batch with no process start
   at all (the floor).

Prints medians and min-max, and writes JSON with ``--out``. Measured against a baseline in
the same run; never asserted in tests.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("watermark")


def _timed_cli(env: dict[str, str], *args: str) -> tuple[float, dict]:
    began = time.perf_counter()
    proc = subprocess.run(
        [str(SCRIPT), *args, "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        stdin=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"watermark {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return seconds, json.loads(proc.stdout)


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed batches per side (3)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    env = {
        **os.environ,
        "WATERMARK_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "NO_COLOR": "1",
    }
    os.environ.update({k: env[k] for k in ("WATERMARK_HOME", "DAGSTER_HOME")})
    _timed_cli(env, "demo", "--rounds", "0", "--quiet")
    noop = [_timed_cli(env, "run")[0] for _ in range(args.rounds)]

    from dagster import DagsterInstance

    from watermark_dagster.dagster_defs.headless import HeadlessRunner
    from watermark_dagster.definitions import build_demo_definitions
    from watermark_dagster.demo import DemoPaths, apply_round
    from watermark_dagster.runtime.engine import EngineAddress
    from watermark_dagster.runtime.spark import build_spark_session

    spark = build_spark_session(master=os.environ.get("WATERMARK_SPARK_MASTER", "local[*]"))
    spark.sparkContext.setLogLevel("ERROR")
    paths = DemoPaths(home)
    round_no = 0

    def commit_round() -> None:
        nonlocal round_no
        round_no += 1
        apply_round(spark, paths, round_no)

    cold = []
    for _ in range(args.rounds):
        commit_round()
        seconds, out = _timed_cli(env, "run")
        assert len(out["completed"]) == 1, out
        cold.append(seconds)

    # The resident engine: `watermark engine` in its own process, runs sent to it.
    engine_env = {**env, "WATERMARK_ENGINE": "resident"}
    address = EngineAddress.under(home)
    with (home / "engine.log").open("w") as out:
        engine = subprocess.Popen(
            [str(SCRIPT), "engine"], env=engine_env, cwd=REPO, stdout=out, stderr=out
        )
    resident = []
    try:
        while not address.socket.exists():
            if engine.poll() is not None:
                raise SystemExit(f"watermark engine exited: {(home / 'engine.log').read_text()}")
            time.sleep(0.5)
        commit_round()
        _timed_cli(engine_env, "run")  # the engine's first batch warms its JIT; not timed
        for _ in range(args.rounds):
            commit_round()
            seconds, out = _timed_cli(engine_env, "run")
            assert len(out["completed"]) == 1, out
            resident.append(seconds)
    finally:
        engine.send_signal(signal.SIGTERM)
        engine.wait(timeout=120)

    runner = HeadlessRunner(build_demo_definitions(home), DagsterInstance.get())
    commit_round()
    runner.run_until_idle()  # warms the JIT and Delta's caches; not timed
    warm = []
    for _ in range(args.rounds):
        commit_round()
        began = time.perf_counter()
        report = runner.run_until_idle()
        warm.append(time.perf_counter() - began)
        assert len(report.completed) == 1, report
        assert not report.failed_runs, report
    spark.stop()

    figures = {
        "machine": f"{os.cpu_count()} cores",
        "rounds": args.rounds,
        "noop_watermark_run_s": _summary(noop),
        "cold_watermark_run_batch_s": _summary(cold),
        "warm_in_process_batch_s": _summary(warm),
        "resident_engine_watermark_run_batch_s": _summary(resident),
        "resident_engine_estimate_s": round(statistics.median(noop) + statistics.median(warm), 2),
        "home": str(home),
    }
    figures["cold_over_resident"] = round(
        figures["cold_watermark_run_batch_s"]["median"]
        / figures["resident_engine_watermark_run_batch_s"]["median"],
        2,
    )
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
