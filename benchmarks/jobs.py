"""Where a batch's Spark jobs go: one incremental batch of the declared demo pipelines (or
the hand-written ones), its jobs listed per pipeline and per phase, each with the call site
Spark records for it.

    .venv/bin/python -m benchmarks.jobs                  # 20k orders, 1%, declared incremental
    .venv/bin/python -m benchmarks.jobs --registry declared_full --orders 50k
    .venv/bin/python -m benchmarks.jobs --orders 2k --warm 2 --describe   # each job, named

``--warm N`` runs N cycles first, so the measured one is what a long-lived process pays;
``--describe`` lists every job with its seconds and the description Spark gives it (Delta
names its steps there: computing a snapshot, filtering files, a MERGE's phases).

The upstreams, the first load and the commits are those of :mod:`benchmarks.declared`. The
phases are the stages of ``run_pipeline`` (bind, transform, write, record) and the steps
inside them (bind the inputs, count the rows read where the log does not say them, build
the transform, the write's summary, skipping values and MERGE), each run in a job group of
its own: a profile of the mechanism, not a timing (see ``benchmarks.declared`` for the
times).
"""

import argparse
import contextlib
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.baselines import build_session
from benchmarks.declared import KEYS, Lab, _fraction, _rows, build_upstreams, commit_changes
from benchmarks.incremental import QUICK_CONF


class PhaseJobs:
    """Job groups named ``<pipeline>/<phase>``, and the call sites of their jobs."""

    def __init__(self, spark: Any) -> None:
        self.context = spark.sparkContext
        self.tracker = self.context.statusTracker()
        self.pipeline = "-"
        self.groups: list[str] = []
        self.seconds: dict[str, float] = {}
        self._open: list[str] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        group = f"{self.pipeline}/{name}"
        previous = self.context.getLocalProperty("spark.jobGroup.id")
        self.context.setJobGroup(group, group)
        if group not in self.groups:
            self.groups.append(group)
        started = time.perf_counter()
        self._open.append(group)
        try:
            yield
        finally:
            # Seconds spent in this phase and not in a phase nested in it.
            spent = time.perf_counter() - started
            self._open.pop()
            self.seconds[group] = self.seconds.get(group, 0.0) + spent
            if self._open:
                outer = self._open[-1]
                self.seconds[outer] = self.seconds.get(outer, 0.0) - spent
            if previous is not None:
                self.context.setJobGroup(previous, previous)

    def jobs(self, group: str) -> list[int]:
        """The ids of ``group``'s jobs, in order."""
        return sorted(self.tracker.getJobIdsForGroup(group))

    def sites(self, group: str) -> list[str]:
        """The call site of each job of ``group`` (its last stage's name)."""
        found = []
        for job in self.jobs(group):
            info = self.tracker.getJobInfo(job)
            stages = sorted(info.stageIds) if info is not None else []
            stage = self.tracker.getStageInfo(stages[-1]) if stages else None
            found.append(stage.name if stage is not None else "?")
        return found


def _descriptions(spark: Any) -> dict[int, tuple[float, str]]:
    """Each job's seconds and description, from the REST API of the session's UI."""
    import json
    import urllib.request

    base = f"{spark.sparkContext.uiWebUrl}/api/v1/applications"
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"{base}/{app}/jobs") as response:
        jobs = json.load(response)

    def seconds(job: dict[str, Any]) -> float:
        stamps = [job.get(k) for k in ("submissionTime", "completionTime")]
        if not all(stamps):
            return 0.0
        begun, ended = (datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%f%Z") for t in stamps)
        return (ended - begun).total_seconds()

    return {j["jobId"]: (seconds(j), j.get("description") or "") for j in jobs}


def _wrap(owner: Any, name: str, phases: PhaseJobs, phase: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with phases.phase(phase):
            return original(*args, **kwargs)

    setattr(owner, name, wrapped)


def instrument(phases: PhaseJobs) -> None:
    """Run each step of ``run_pipeline`` in its phase's job group."""
    from watermark_dagster.operations import run_pipeline as rp
    from watermark_dagster.read.inputs import UpstreamInput

    _wrap(rp, "_bind_inputs", phases, "bind inputs")
    _wrap(UpstreamInput, "count_rows", phases, "count rows read")
    _wrap(rp, "transformed", phases, "transform (build)")
    original_writer = rp.target_writer

    def writer(pipeline: Any) -> Callable[..., Any]:
        write = original_writer(pipeline)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with phases.phase("write target (other)"):
                return write(*args, **kwargs)

        return wrapped

    rp.target_writer = writer
    from watermark_dagster.write import merge

    _wrap(merge, "summarize", phases, "write: persist + summary")
    _wrap(merge, "first_key_spans", phases, "write: skipping values")
    _wrap(merge, "_merge", phases, "write: MERGE")

    # Each stage of the run (frames/stages.py) is a phase too: the jobs a stage runs outside
    # the steps above are its own ("stage record": a rows-read count the log could not give).
    @contextlib.contextmanager
    def stage(spark: Any, pipeline: str, batch_id: str, name: str) -> Iterator[None]:
        with phases.phase(f"stage {name}"):
            yield

    rp.spark_stage = stage
    original_execute = rp.execute_pipeline

    def execute(*args: Any, **kwargs: Any) -> Any:
        phases.pipeline = kwargs["pipeline_name"]
        with phases.phase("other"):
            return original_execute(*args, **kwargs)

    rp.execute_pipeline = execute


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--orders", type=_rows, default=20_000)
    parser.add_argument("--change", type=_fraction, default=0.01)
    parser.add_argument(
        "--registry",
        choices=(
            "declared_incremental",
            "declared_maintain",
            "declared_full",
            "declared_rewrite",
            "declared_minimal",
            "declared",
            "handwritten",
        ),
        default="declared_incremental",
        help="the demo pipelines declared with strategy incremental (default), full or auto "
        "(declared), or written by hand",
    )
    parser.add_argument(
        "--describe",
        action="store_true",
        help="list every job with the description Spark gives it (Delta names its steps "
        "there); starts Spark's UI to read them",
    )
    parser.add_argument(
        "--warm",
        type=int,
        default=0,
        help="cycles run (each after its own commits) before the one measured, so the JVM "
        "has run every step once: the cost a long-lived process pays",
    )
    parser.add_argument(
        "--profile",
        choices=("uniform", "recent"),
        default="uniform",
        help="the shape of the changes, as in benchmarks.declared (recent: CDC-shaped)",
    )
    args = parser.parse_args(argv)

    import watermark_dagster  # noqa: F401 - build_session then uses the project's session

    ui = {"spark.ui.enabled": "true", "spark.ui.port": "0"} if args.describe else {}
    conf = {"spark.driver.memory": "2g", **QUICK_CONF, **ui}
    spark = build_session("local[2]", conf, "bench-jobs")
    spark.sparkContext.setLogLevel("ERROR")
    root = Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    from deltalake import DeltaTable as RsTable

    upstreams = root / "upstreams"
    build_upstreams(spark, upstreams, args.orders)
    lab = Lab(spark, root, [args.registry])
    lab.setup(args.registry, {t: RsTable(str(upstreams / t)).version() for t in KEYS})
    for salt in range(args.warm):
        commit_changes(
            spark, upstreams, fraction=args.change, salt=100 + salt, profile=args.profile
        )
        assert lab.ours[args.registry].cycle(lab.counter, args.registry) is not None
    commits = commit_changes(spark, upstreams, fraction=args.change, salt=1, profile=args.profile)
    phases = PhaseJobs(spark)
    instrument(phases)
    # Ours.cycle imports execute_pipeline from its module when called: patched above.
    outcome = lab.ours[args.registry].cycle(lab.counter, args.registry)
    assert outcome is not None
    versions = {t: c.version for t, c in commits.items()}
    total = sum(len(phases.sites(g)) for g in phases.groups)
    descriptions = _descriptions(spark) if args.describe else {}
    print(f"{args.registry}: {args.orders:,} orders, {args.change:.2%} change "
          f"({args.profile}); upstream "
          f"versions {versions}; {total} Spark jobs in the pipelines' runs")  # fmt: skip
    for group in phases.groups:
        sites = phases.sites(group)
        print(f"  {group:<42} {len(sites):3d} jobs {phases.seconds.get(group, 0.0):7.2f} s")
        if args.describe:
            for job, site in zip(phases.jobs(group), sites, strict=True):
                seconds, text = descriptions.get(job, (0.0, ""))
                print(f"      {job:4d} {seconds:5.2f} s {site[:50]:<50} | {text[:70]}")
            continue
        for site, n in Counter(sites).most_common():
            print(f"      {n:3d} x {site}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
