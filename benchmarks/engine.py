"""What a long-lived Spark saves: one demo batch through `watermark run` with its own JVM,
on the home's Spark Connect engine (`watermark engine`), in a process whose JVM is warm,
and launched by the daemon under `watermark dev`.

    .venv/bin/python -m benchmarks.engine --rounds 3 [--out engine.json]

The run that compared the Connect engine with the former resident engine (a socket
protocol of ours, removed after it) is ``benchmarks/results/engine-connect.json``.

Steps, on a fresh demo home (WATERMARK_HOME in a temporary folder):

1. ``watermark demo --rounds 0`` seeds the upstreams and runs the first loads (not timed).
2. ``watermark run`` with nothing to do, timed: the fixed cost of a process without a JVM
   (Python, Dagster, observing and planning).
3. The Connect engine is started; it runs one untimed batch.
4. ``--rounds`` repeats, the contenders in an order rotated from repeat to repeat; for each
   contender one round of demo changes is committed (not timed), then its batch is timed:

   * ``process``: ``watermark run`` (``WATERMARK_ENGINE=process``): a new process and a JVM;
   * ``connect``: ``watermark run`` (``WATERMARK_ENGINE=connect``): no JVM in the process,
     the pipelines on the Connect server;
   * ``warm``: ``HeadlessRunner.run_until_idle()`` in this process, its JVM warm: the same
     batch with no process start at all (the floor).
5. ``watermark dev`` (its engine on, sensors every second): ``--rounds`` times a round is
   committed, and each batch the daemon runs for it is timed from the newest upstream
   commit it reads (its Delta commit timestamp) until the control tables show it COMPLETED
   (sensor ticks, the daemon's run launch, the run on the engine, the finalizer). A round
   commits several versions, so the daemon may take it in two batches, one after the other.
6. The incremental benchmark's cycle (``benchmarks.incremental`` with ``--incremental-size``
   rows, 1% change, ``--rounds`` paired repeats): ``ours_warm``, ``ours_connect`` and
   ``ours_cold``, each ``watermark run`` checked against a recompute.

   Each such batch is broken down from the Dagster instance's own records (the run's
   creation, its launch, the run worker's start, its steps) and the control tables (the
   batch's planning): see :data:`SEGMENTS`.

Prints medians and min-max, the ratios the issue sets targets for, and the load average;
writes JSON with ``--out``. Measured against baselines in the same run; never asserted in
tests.
"""

import argparse
import contextlib
import itertools
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
CONTENDERS = ("process", "connect", "warm")
DEMO_UPSTREAMS = ("customers", "orders", "payments")

# Where a batch under `watermark dev` spends its time, from the newest commit it reads to
# the batch completed:
# (name, what it covers); each segment ends where the next begins.
SEGMENTS = (
    ("detect", "commit -> the coordinator tick planned the batch (the sensor daemon's loop)"),
    ("submit", "planned -> its run created (the rest of the coordinator tick)"),
    ("queue", "run created -> launched (RUN_STARTING: the run queue daemon's loop)"),
    (
        "launch",
        "launched -> run worker started (a new process: Python, Dagster, the code location)",
    ),
    ("init", "run started -> first step started (resources, the Connect session)"),
    ("steps", "first step started -> last step ended (the pipelines on the engine)"),
    ("run_end", "last step ended -> run success"),
    ("finalize", "run success -> batch completed (the finalizer tick)"),
)


def _breakdown(instance, store, batch_id: str, committed: float, completed: float) -> dict:
    """Seconds per :data:`SEGMENTS` of one batch, from the instance's run records and
    events and the batch's planning time; None where the batch had no run."""
    from dagster import DagsterEventType, RunsFilter

    [record] = instance.get_run_records(RunsFilter(tags={"dagster/partition": batch_id}))
    run_id = record.dagster_run.run_id
    events = instance.all_logs(run_id)

    def first(kind: DagsterEventType) -> float:
        return min(e.timestamp for e in events if e.dagster_event_type == kind)

    step_end = max(
        e.timestamp
        for e in events
        if e.dagster_event_type in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE)
    )
    marks = [
        committed,
        store.get_batch(batch_id).created_at.timestamp(),
        record.create_timestamp.timestamp(),
        first(DagsterEventType.RUN_STARTING),
        first(DagsterEventType.RUN_START),
        first(DagsterEventType.STEP_START),
        step_end,
        first(DagsterEventType.RUN_SUCCESS),
        completed,
    ]
    spans = zip(SEGMENTS, itertools.pairwise(marks), strict=True)
    return {name: round(b - a, 2) for (name, _), (a, b) in spans}


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
        "n": len(values),
    }


@contextlib.contextmanager
def _process(argv: list[str], env: dict[str, str], log: Path, ready, what: str):
    """``argv`` in its own process group until ``ready()``; stopped with SIGTERM after."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 600
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{what} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed batches per contender (3)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument(
        "--incremental-size",
        default="500k",
        help="rows of the incremental benchmark's cycle (500k; 0 leaves it out)",
    )
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="of process,connect,warm: the batches timed before watermark dev (all; warm is "
        "the floor the daemon's batch is compared with)",
    )
    args = parser.parse_args()
    contenders = [c for c in args.contenders.split(",") if c]
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders {unknown}; choose from {list(CONTENDERS)}")

    home = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    env = {
        **os.environ,
        "WATERMARK_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "NO_COLOR": "1",
    }
    env.pop("WATERMARK_ENGINE", None)
    os.environ.update({k: env[k] for k in ("WATERMARK_HOME", "DAGSTER_HOME")})
    os.environ["WATERMARK_ENGINE"] = "process"  # this process's own runs: its warm JVM
    _timed_cli({**env, "WATERMARK_ENGINE": "process"}, "demo", "--rounds", "0", "--quiet")
    noop = [_timed_cli(env, "run")[0] for _ in range(args.rounds)]

    from dagster import DagsterInstance
    from deltalake import DeltaTable

    from watermark_dagster.dagster_defs.headless import HeadlessRunner
    from watermark_dagster.definitions import build_demo_definitions
    from watermark_dagster.demo import DemoPaths, apply_round
    from watermark_dagster.runtime.connect import engine_folder, free_port, live_engine
    from watermark_dagster.runtime.spark import build_spark_session
    from watermark_dagster.store import ReadOnlyWatermarkStore

    spark = build_spark_session(master=os.environ.get("WATERMARK_SPARK_MASTER", "local[*]"))
    spark.sparkContext.setLogLevel("ERROR")
    paths = DemoPaths(home)
    round_no = 0

    def commit_round() -> None:
        nonlocal round_no
        round_no += 1
        apply_round(spark, paths, round_no)

    runner = HeadlessRunner(build_demo_definitions(home), DagsterInstance.get())
    times: dict[str, list[float]] = {c: [] for c in contenders}
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            _process(
                [str(SCRIPT), "engine"],
                env,
                home / "connect-engine.out",
                lambda: live_engine(engine_folder(home)) is not None,
                "watermark engine",
            )
        )

        def batch(contender: str) -> float:
            commit_round()
            if contender == "warm":
                began = time.perf_counter()
                report = runner.run_until_idle()
                seconds = time.perf_counter() - began
                assert len(report.completed) == 1, report
                assert not report.failed_runs, report
                return seconds
            seconds, out = _timed_cli({**env, "WATERMARK_ENGINE": contender}, "run")
            assert len(out["completed"]) == 1, out
            return seconds

        for contender in contenders:
            if contender != "process":
                batch(contender)  # warms the engine's (or this process's) JIT; not timed
        for repeat in range(args.rounds):
            shift = repeat % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                times[contender].append(batch(contender))
                print(f"repeat {repeat + 1}: {contender} {times[contender][-1]:.1f} s", flush=True)

    # The daemon under `watermark dev`: commit, then wait for the batch to complete.
    store = ReadOnlyWatermarkStore(str(home / "control"))
    dev_env = {**env, "WATERMARK_SENSOR_INTERVAL_SECONDS": "1"}
    port = free_port()
    dev_times: list[float] = []
    dev_parts: list[dict] = []

    seen_completed: dict[str, float] = {}

    def completed() -> list[str]:
        ids = [b.batch_id for b in store.batches(limit=1000) if b.status.name == "COMPLETED"]
        now = time.time()
        for batch_id in ids:
            seen_completed.setdefault(batch_id, now)
        return ids

    commit_times: dict[tuple[str, int], float] = {}

    def last_change_at(batch_id: str) -> float:
        """When the newest commit the batch reads landed (its Delta commit timestamp)."""
        ends = [(u, i.range.end) for u, i in store.get_batch(batch_id).inputs.items() if i.range]
        for u, _ in ends:
            for entry in DeltaTable(paths.upstream(u)).history():
                commit_times[(u, entry["version"])] = entry["timestamp"] / 1000
        return max(commit_times[end] for end in ends)

    with _process(
        [str(SCRIPT), "dev", "--host", "127.0.0.1", "--port", str(port)],
        dev_env,
        home / "watermark-dev.out",
        lambda: live_engine(engine_folder(home)) is not None,
        "watermark dev",
    ):
        for n in range(args.rounds + 1):
            done = set(completed())
            commit_round()
            # The daemon may plan a batch while the round is still committing (it commits
            # several versions): a round is done when every upstream's committed watermark
            # reaches its last version and every batch it took has completed. Each batch is
            # timed from the newest commit it reads to its completion, as a user waits.
            wanted = {u: DeltaTable(paths.upstream(u)).version() for u in DEMO_UPSTREAMS}
            deadline = time.perf_counter() + 900
            while any((store.committed_versions().get(u) or -1) < v for u, v in wanted.items()) or (
                store.open_batch() is not None
            ):
                if time.perf_counter() > deadline:
                    raise SystemExit(f"the round was not processed in 900 s ({home})")
                completed()
                time.sleep(0.1)
            new = sorted(b for b in completed() if b not in done)
            if not n:  # the first round warms the engine and the daemon; not timed
                continue
            for batch_id in new:
                began = last_change_at(batch_id)
                seconds = seen_completed[batch_id] - began
                dev_times.append(seconds)
                parts = _breakdown(
                    runner.instance, store, batch_id, began, seen_completed[batch_id]
                )
                dev_parts.append(parts)
                print(f"watermark dev round {n}, {batch_id}: {seconds:.1f} s {parts}", flush=True)
    spark.stop()

    incremental = None
    if args.incremental_size not in ("0", ""):
        out = home / "incremental.json"
        names = ["ours_warm", "ours_connect", "ours_cold"]
        argv = [sys.executable, "-m", "benchmarks.incremental", "--sizes", args.incremental_size]
        argv += ["--changes", "1%", "--repeats", str(args.rounds), "--contenders"]
        argv += [",".join(names), "--out", str(out)]
        print("incremental cycle: " + " ".join(argv[1:]), flush=True)
        subprocess.run(argv, cwd=REPO, check=True, env={**env, "WATERMARK_ENGINE": "process"})
        [size] = json.loads(out.read_text())["sizes"]
        [change] = size["changes"]
        incremental = {"rows": size["rows"], **change["summary"]}

    figures: dict = {
        "machine": f"{os.cpu_count()} cores",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "rounds": args.rounds,
        "noop_watermark_run_s": _summary(noop),
        **{f"{c}_batch_s": _summary(times[c]) for c in contenders},
        "watermark_dev_daemon_batch_s": _summary(dev_times),
        "watermark_dev_breakdown_s": {
            name: _summary([p[name] for p in dev_parts]) for name, _ in SEGMENTS
        },
        "incremental_cycle_1pct": incremental,
        "home": str(home),
    }
    med = {c: statistics.median(times[c]) for c in contenders}
    ratios = {}
    if {"process", "connect"} <= med.keys():
        ratios["process/connect"] = med["process"] / med["connect"]
    if {"connect", "warm"} <= med.keys():
        ratios["connect/warm"] = med["connect"] / med["warm"]
        ratios["connect/(warm+noop)"] = med["connect"] / (med["warm"] + statistics.median(noop))
    if "warm" in med:
        ratios["dev_daemon/warm"] = statistics.median(dev_times) / med["warm"]
    if incremental is not None and {"ours_connect", "ours_warm"} <= incremental["seconds"].keys():
        seconds = incremental["seconds"]
        ratios["incremental connect/warm"] = (
            seconds["ours_connect"]["median"] / seconds["ours_warm"]["median"]
        )
        ratios["incremental cold/connect"] = (
            seconds["ours_cold"]["median"] / seconds["ours_connect"]["median"]
        )
    figures["ratios"] = {k: round(v, 2) for k, v in ratios.items()}
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
