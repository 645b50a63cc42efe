"""Control-plane cost against history size: sensor ticks, run-side bookkeeping, CLI reads.

For each history size N (``--batches 100,1000,5000``) it builds, in a fresh folder, a code
location of 10 upstream Delta tables (delta-rs, no JVM) and 20 pipelines (each reads one
or two upstreams), preloads N completed batches into the control tables, then drives a
whole maintenance cycle of ``--cycle`` batches (default 50, the finalizer's
``maintain_every_batches``) through the real API, and measures each step of every batch:

* ``plan_tick``: the coordinator tick that plans a batch (new upstream commits waiting);
* ``run_side_per_pipeline``: the store work of one pipeline run, without Spark and without
  target writes: ``decide_pipeline``, ``begin_checkpoint``, ``finish_checkpoint`` and the
  ``PIPELINE_SUCCEEDED`` history row, as ``operations/run_pipeline.py`` does;
* ``finalizer_tick``: the finalizer tick that advances the watermarks and completes it;
* ``idle_tick``: a coordinator tick with nothing to do (no open batch, nothing new);
* ``cli_list``, ``cli_batches_limit_20``, ``cli_get_history``: ``watermark list``,
  ``watermark batches --limit 20`` and ``watermark get -t <upstream> --history``, run
  in-process (every ``--cli-every`` batches).

Ticks are ``evaluate_tick`` of the location's sensors with ``build_sensor_context`` against
a real ``DagsterInstance`` (a temporary DAGSTER_HOME); their partition requests are applied
to the instance as the daemon would. Each measurement is CPU seconds of the process
(``time.process_time``, all threads) and wall seconds, reported as median with min-max
over the cycle, with the rows and files each step read and the commits it made (the
store's own counters, :attr:`WatermarkStore.scans`).

Preloaded history is built with the rows the store itself writes
(:mod:`watermark_dagster.store.codec`, planned with :func:`core.planning.plan_batch`), in
one ``append_rows`` commit per table per 50 batches, so the tables have a realistic file
count; the upstream tables get the real commits those batches read.

The sensors log to stderr as they do under the daemon (planned, completed, compacted);
the table is printed on stdout.

Usage:
    .venv/bin/python -m benchmarks.control_plane [--batches 100,1000] [--cycle 50] 2>/dev/null
"""

import argparse
import contextlib
import dataclasses
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from dagster import DagsterInstance, build_sensor_context
from dagster._core.definitions.sensor_definition import SensorExecutionData
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable, write_deltalake

from benchmarks import observe
from watermark_dagster.cli.app import run as cli_run
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.finalizing import advanced_watermark
from watermark_dagster.core.planning import UpstreamPosition, plan_batch
from watermark_dagster.core.records import (
    Batch,
    BatchKind,
    BatchStatus,
    Checkpoint,
    CheckpointStatus,
    batch_id_for,
    version_text,
)
from watermark_dagster.dagster_defs.definitions import WatermarkLocation, build_location
from watermark_dagster.dagster_defs.names import BATCHES_PARTITIONS_NAME
from watermark_dagster.dagster_defs.sensors import COORDINATOR, FINALIZER
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.run_pipeline import decide_pipeline
from watermark_dagster.store import WatermarkStore, codec

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

UPSTREAMS = tuple(f"up{i:02d}" for i in range(10))
PIPELINES = tuple(f"p{i:02d}" for i in range(20))
CHUNK = 50  # batches per preload commit: one append per table, as ~50 batches of files
CONTROL_TABLES = ("batches", "committed_watermarks", "pipeline_checkpoints", "history")

COORDINATOR_ACTOR = f"sensor:{COORDINATOR}"
FINALIZER_ACTOR = f"sensor:{FINALIZER}"

# The measurements, in the order they are printed and plotted.
STEPS = (
    "idle_tick",
    "plan_tick",
    "finalizer_tick",
    "run_side_per_pipeline",
    "cli_list",
    "cli_batches_limit_20",
    "cli_get_history",
)
TICKS = ("idle_tick", "plan_tick", "finalizer_tick")

# The module the in-process CLI loads the location from (``--defs``).
_DEFS_MODULE = "_control_plane_bench_location"


def pipeline_inputs() -> dict[str, tuple[str, ...]]:
    """Pipeline -> the upstreams it reads: two pipelines per upstream, every fourth
    pipeline also reads the next upstream (so 1-2 upstreams each)."""
    inputs: dict[str, tuple[str, ...]] = {}
    for i, name in enumerate(PIPELINES):
        primary = UPSTREAMS[i // 2]
        inputs[name] = (
            (primary, UPSTREAMS[(i // 2 + 1) % len(UPSTREAMS)]) if i % 4 == 0 else (primary,)
        )
    return inputs


def moved_upstreams(rng: random.Random) -> list[str]:
    """The upstreams that get a new commit before one batch: two, sometimes three."""
    return rng.sample(UPSTREAMS, 3 if rng.random() < 0.2 else 2)


def _never_called(batch: Any) -> Any:
    raise AssertionError("the control-plane benchmark runs no transform")


def _commit(path: Path, value: int) -> None:
    table = pa.table({"id": pa.array([value], pa.int64())})
    write_deltalake(
        str(path), table, mode="append", configuration={"delta.enableChangeDataFeed": "true"}
    )


# ---------------------------------------------------------------- measuring


def scan_counter(store: WatermarkStore) -> Callable[[], dict[str, int]]:
    """A reader of the store's scan counters (:attr:`WatermarkStore.scans`: data files
    opened, rows read, tables loaded and refreshed, commits made so far). The sensors, the
    CLI and the run-side steps of this thread share this store (``shared_store``)."""
    return store.scans.snapshot


@dataclasses.dataclass
class Samples:
    """The samples of one measured step over the cycle."""

    cpu: list[float] = dataclasses.field(default_factory=list)
    wall: list[float] = dataclasses.field(default_factory=list)
    scans: list[dict[str, int]] = dataclasses.field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Median, min and max of CPU and wall seconds (and of each scan counter)."""

        def stats(values: Sequence[float]) -> dict[str, float]:
            return {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }

        scan = None
        if self.scans:
            keys = sorted({k for s in self.scans for k in s})
            scan = {k: stats([s.get(k, 0) for s in self.scans]) for k in keys}
        return {
            "samples": len(self.cpu),
            "cpu_seconds": stats(self.cpu),
            "wall_seconds": stats(self.wall),
            "scan": scan,
            "cpu_samples": [round(v, 4) for v in self.cpu],
            "wall_samples": [round(v, 4) for v in self.wall],
        }


class Meter:
    """Times steps by name (CPU of the whole process and wall clock) and reads the store's
    scan counters around them when there are any."""

    def __init__(self, counter: Callable[[], dict[str, int]] | None) -> None:
        self.counter = counter
        self.samples: dict[str, Samples] = {step: Samples() for step in STEPS}

    def measure(self, step: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` once, record its cost under ``step`` and return its result."""
        before = self.counter() if self.counter else None
        cpu, wall = time.process_time(), time.perf_counter()
        result = fn()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        sample = self.samples[step]
        sample.cpu.append(cpu)
        sample.wall.append(wall)
        if self.counter is not None and before is not None:
            after = self.counter()
            sample.scans.append({k: v - before.get(k, 0) for k, v in after.items()})
        return result


# ---------------------------------------------------------------- the location


class Bench:
    """One history size: upstream tables, pipeline targets, control root and a Dagster
    instance under ``root``."""

    def __init__(self, root: Path, *, cycle: int, seed: int) -> None:
        self.root = root
        self.cycle = cycle
        self.rng = random.Random(seed)
        self.paths = {u: root / "upstreams" / u for u in UPSTREAMS}
        self.latest: dict[str, int] = {}
        self.commits = 0
        self.inputs = pipeline_inputs()
        registry = Registry(
            upstreams=[DeltaUpstream(name=u, path=str(p)) for u, p in self.paths.items()],
            pipelines=[
                Pipeline(
                    name=p,
                    upstreams=ups,
                    target=str(root / "targets" / p),
                    keys=("id",),
                    transform=_never_called,
                )
                for p, ups in self.inputs.items()
            ],
        )
        # The finalizer's maintenance runs every `cycle` batches: the measured cycle spans
        # one whole maintenance cycle.
        self.settings = WatermarkSettings(
            min_batch_interval_seconds=0, maintain_every_batches=cycle
        )
        self.location: WatermarkLocation = build_location(
            registry, control_root=str(root / "control"), settings=self.settings
        )
        self.defs = self.location.definitions
        self.registry = registry
        home = root / "dagster_home"
        home.mkdir(parents=True)
        shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
        self.dagster_home = home
        os.environ["DAGSTER_HOME"] = str(home)
        os.environ["WATERMARK_HOME"] = str(root / "watermark_home")
        self.instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))
        self.cursor: str | None = None
        self.pipelines_per_batch: list[int] = []

    def close(self) -> None:
        """Release the Dagster instance."""
        self.instance.dispose()

    # ------------------------------------------------------------ synthesis

    def create_tables(self) -> None:
        """The upstream tables at version 0 and one target per pipeline (as their first
        runs would have left them: the planner then asks for no first load)."""
        for u, path in self.paths.items():
            _commit(path, 0)
            self.latest[u] = 0
        for p in PIPELINES:
            _commit(self.root / "targets" / p, 0)

    def commit_to(self, upstreams: Sequence[str]) -> None:
        """One new commit on each of ``upstreams``."""
        for u in upstreams:
            self.latest[u] += 1
            _commit(self.paths[u], self.latest[u])
            self.commits += 1

    def preload(self, batches: int) -> dict[str, float]:
        """Write ``batches`` completed batches into the control tables with the rows the
        store itself writes, one ``append_rows`` commit per table per ``CHUNK`` batches.
        Returns seconds spent on upstream commits and on the control rows."""
        observer = Observer()
        identity = {u: observer.observe(self.registry.upstreams[u]) for u in UPSTREAMS}
        store = self.location.store()
        committed: dict[str, int | None] = dict.fromkeys(UPSTREAMS)
        marks: dict[str, Any] = {}
        pending: dict[str, list[dict[str, Any]]] = {t: [] for t in CONTROL_TABLES}
        spent = {"upstream_commits": 0.0, "control_rows": 0.0}
        # Planned a minute apart, ending now: the last planned time is in the past.
        start = datetime.now(UTC) - timedelta(minutes=batches + 1)
        for seq in range(1, batches + 1):
            t0 = time.perf_counter()
            if seq > 1:  # the first batch loads every upstream's snapshot at version 0
                self.commit_to(moved_upstreams(self.rng))
            t1 = time.perf_counter()
            at = start + timedelta(minutes=seq)
            batch, rows = self._completed_batch(seq, at, committed, identity)
            pending["batches"] += rows
            pending["pipeline_checkpoints"] += self._checkpoints(batch, at)
            pending["history"] += self._history(batch, at, committed)
            for u in batch.ranged_upstreams:
                mark = advanced_watermark(
                    batch, batch.inputs[u], recheck_at=None, actor=FINALIZER_ACTOR, now=at
                )
                marks[u] = mark
                committed[u] = mark.committed_version
            if seq % CHUNK == 0 or seq == batches:
                for table in ("batches", "pipeline_checkpoints", "history"):
                    store.append_rows(table, pending[table])
                    pending[table] = []
            spent["upstream_commits"] += t1 - t0
            spent["control_rows"] += time.perf_counter() - t1
        t1 = time.perf_counter()
        store.append_rows("committed_watermarks", [codec.watermark_row(m) for m in marks.values()])
        # The newest batch partitions the finalizer keeps in Dagster.
        keep = self.settings.keep_batch_partitions
        first = 1 if not keep else max(1, batches - keep + 1)
        self.instance.add_dynamic_partitions(
            BATCHES_PARTITIONS_NAME, [batch_id_for(s) for s in range(first, batches + 1)]
        )
        spent["control_rows"] += time.perf_counter() - t1
        return spent

    def _completed_batch(
        self,
        seq: int,
        at: datetime,
        committed: Mapping[str, int | None],
        identity: Mapping[str, Any],
    ) -> tuple[Batch, list[dict[str, Any]]]:
        """Batch ``seq`` planned as the coordinator plans it, and its ``batches`` rows as
        they stand once the finalizer completed it."""
        positions = [
            UpstreamPosition(name=u, latest_version=self.latest[u], committed_version=committed[u])
            for u in UPSTREAMS
        ]
        plan = plan_batch(positions, self.inputs)
        batch = codec.new_batch(
            seq,
            BatchKind.SCHEDULED,
            plan.inputs,
            pipelines=plan.pipelines,
            actor=COORDINATOR_ACTOR,
            full_load=plan.full_load,
            table_ids={u: identity[u].table_id for u in plan.inputs},
            schema_fingerprints={u: identity[u].schema_fingerprint for u in plan.inputs},
            source_states=dict.fromkeys(plan.inputs),
        )
        batch = dataclasses.replace(batch, created_at=at)
        self.pipelines_per_batch.append(len(batch.pipelines))
        latest = {u: self.latest[u] for u in UPSTREAMS}
        done = at + timedelta(seconds=30)
        rows = codec.batch_rows(
            dataclasses.replace(batch, status=BatchStatus.COMPLETED),
            committed=committed,
            latest=latest,
        )
        for row in rows:
            row["updated_at"] = done
            if row["upstream"] in batch.ranged_upstreams:
                row["advanced_at"] = done
        return batch, rows

    def _checkpoints(self, batch: Batch, at: datetime) -> list[dict[str, Any]]:
        return [
            codec.checkpoint_row(
                Checkpoint(
                    pipeline=p,
                    batch_id=batch.batch_id,
                    attempt=1,
                    status=CheckpointStatus.SUCCESS,
                    rows_read=1,
                    rows_written=1,
                    run_id=uuid.uuid4().hex,
                    started_at=at + timedelta(seconds=5),
                    finished_at=at + timedelta(seconds=20),
                    error=None,
                )
            )
            for p in batch.pipelines
        ]

    def _history(
        self, batch: Batch, at: datetime, committed: Mapping[str, int | None]
    ) -> list[dict[str, Any]]:
        """The history rows of one planned, run and completed batch, as the store writes
        them (``ensure_plan_recorded``, ``run_pipeline``, ``advance``, ``set_batch_status``)."""
        rows = [
            codec.history_row(
                "BATCH_PLANNED",
                COORDINATOR_ACTOR,
                batch_id=batch.batch_id,
                detail={
                    "pipelines": list(batch.pipelines),
                    "full_load": list(batch.full_load),
                    "ranges": {u: i.describe() for u, i in batch.inputs.items()},
                },
            )
        ]
        for p in batch.pipelines:
            rows.append(
                codec.history_row(
                    "PIPELINE_SUCCEEDED",
                    uuid.uuid4().hex,
                    batch_id=batch.batch_id,
                    pipeline=p,
                    detail={"attempt": 1, "rows_read": 1, "rows_written": 1},
                )
            )
        for u in batch.ranged_upstreams:
            planned = batch.inputs[u]
            assert planned.range is not None
            rows.append(
                codec.history_row(
                    "WATERMARK_ADVANCED",
                    FINALIZER_ACTOR,
                    batch_id=batch.batch_id,
                    upstream=u,
                    old_value=version_text(committed[u]),
                    new_value=str(planned.range.end),
                    detail={"read": planned.describe()},
                )
            )
        rows.append(
            codec.history_row(
                f"BATCH_{BatchStatus.COMPLETED.value}", FINALIZER_ACTOR, batch_id=batch.batch_id
            )
        )
        for row in rows:
            row["at"] = at
        return rows

    # ------------------------------------------------------------ the driven cycle

    def tick(
        self, meter: Meter | None, step: str, name: str, cursor: str | None = None
    ) -> SensorExecutionData:
        """One evaluation of sensor ``name``, measured as ``step`` (building the context,
        which opens the instance from its ref as the test harness does, is not measured)."""
        with build_sensor_context(
            instance_ref=self.instance.get_ref(),
            definitions=self.defs,
            sensor_name=name,
            cursor=cursor,
            resources=dict(self.defs.resources or {}),
        ) as context:
            sensor_def = self.defs.resolve_sensor_def(name)
            if meter is None:
                return sensor_def.evaluate_tick(context)
            return meter.measure(step, lambda: sensor_def.evaluate_tick(context))

    def apply_partitions(self, result: SensorExecutionData) -> None:
        """Add and delete the batch partitions a tick asked for."""
        for request in result.dynamic_partitions_requests or ():
            keys = list(request.partition_keys)
            if type(request).__name__.startswith("Add"):
                self.instance.add_dynamic_partitions(BATCHES_PARTITIONS_NAME, keys)
            else:
                for key in keys:
                    self.instance.delete_dynamic_partition(BATCHES_PARTITIONS_NAME, key)

    def run_side(self, pipeline: str, batch_id: str) -> None:
        """The store work of one pipeline run (``execute_pipeline`` without Spark and
        without the target write): decide, checkpoint, succeed, record."""
        store = self.location.store()
        decision = decide_pipeline(
            store=store, registry=self.registry, pipeline_name=pipeline, batch_id=batch_id
        )
        assert decision.skip is None, decision.skipped_reason
        run_id = uuid.uuid4().hex
        attempt = store.begin_checkpoint(pipeline, batch_id, run_id=run_id)
        # One commit closes the attempt with its history row, as run_pipeline's does.
        store.finish_checkpoint(
            pipeline,
            batch_id,
            attempt,
            CheckpointStatus.SUCCESS,
            rows_read=1,
            rows_written=1,
            actor=run_id,
            detail={"attempt": attempt, "rows_read": 1, "rows_written": 1},
        )

    def cli(self, *argv: str) -> None:
        """One ``watermark`` command, in-process, output discarded."""
        args = [argv[0], "--defs", f"{_DEFS_MODULE}:defs", "--home", os.environ["WATERMARK_HOME"]]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = cli_run([*args, *argv[1:]])
        if code != 0:
            raise RuntimeError(f"watermark {' '.join(argv)} exited {code}")

    def drive(self, meter: Meter, *, cli_every: int) -> None:
        """``cycle`` batches through the real API: commit, plan tick, run-side work of each
        pipeline, finalizer tick, idle tick; the CLI reads every ``cli_every`` batches."""
        module = types.ModuleType(_DEFS_MODULE)
        module.defs = self.defs  # pyright: ignore[reportAttributeAccessIssue]
        sys.modules[_DEFS_MODULE] = module
        store = self.location.store()
        # The first tick of the process: it catches up observations and the plan record.
        self.cursor = self.tick(None, "", COORDINATOR, self.cursor).cursor
        for i in range(self.cycle):
            self.commit_to(moved_upstreams(self.rng))
            planned = self.tick(meter, "plan_tick", COORDINATOR, self.cursor)
            if not planned.run_requests:
                raise RuntimeError(f"the plan tick planned nothing: {planned.skip_message}")
            self.cursor = planned.cursor
            self.apply_partitions(planned)
            batch = store.open_batch()
            assert batch is not None
            self.pipelines_per_batch.append(len(batch.pipelines))
            for p in batch.pipelines:
                meter.measure(
                    "run_side_per_pipeline",
                    lambda p=p, b=batch.batch_id: self.run_side(p, b),
                )
            done = self.tick(meter, "finalizer_tick", FINALIZER)
            if done.skip_message != f"batch {batch.batch_id} completed":
                raise RuntimeError(f"the finalizer did not complete: {done.skip_message}")
            self.apply_partitions(done)
            idle = self.tick(meter, "idle_tick", COORDINATOR, self.cursor)
            if idle.run_requests or "no upstream has new versions" not in (idle.skip_message or ""):
                raise RuntimeError(f"the idle tick was not idle: {idle.skip_message}")
            self.cursor = idle.cursor
            if i % cli_every == 0 or i == self.cycle - 1:
                upstream = UPSTREAMS[i % len(UPSTREAMS)]
                meter.measure("cli_list", lambda: self.cli("list"))
                meter.measure("cli_batches_limit_20", lambda: self.cli("batches", "--limit", "20"))
                meter.measure(
                    "cli_get_history", lambda u=upstream: self.cli("get", "-t", u, "--history")
                )
        del sys.modules[_DEFS_MODULE]

    def control_tables(self) -> dict[str, dict[str, int]]:
        """Each control table's version, file count and row count."""
        found = {}
        for table in CONTROL_TABLES:
            dt = DeltaTable(str(self.root / "control" / table))
            found[table] = {
                "version": dt.version(),
                "files": len(dt.file_uris()),
                "rows": dt.to_pyarrow_dataset().count_rows(),
            }
        return found


# ---------------------------------------------------------------- one size, all sizes


def measure_size(batches: int, *, cycle: int, cli_every: int, work: Path) -> dict[str, Any]:
    """Synthesize ``batches`` of history in a fresh folder and measure one cycle on it."""
    root = work / f"b{batches}"
    shutil.rmtree(root, ignore_errors=True)
    started = time.perf_counter()
    bench = Bench(root, cycle=cycle, seed=batches)
    try:
        result: dict[str, Any] = {"batches": batches, "loadavg_before": list(os.getloadavg())}
        bench.create_tables()
        spent = bench.preload(batches)
        preloaded = len(bench.pipelines_per_batch)
        result["synthesize_seconds"] = {
            **{k: round(v, 2) for k, v in spent.items()},
            "total": round(time.perf_counter() - started, 2),
        }
        result["control_tables_after_preload"] = bench.control_tables()
        meter = Meter(scan_counter(bench.location.store()))
        measured = time.perf_counter()
        bench.drive(meter, cli_every=cli_every)
        result["measure_seconds"] = round(time.perf_counter() - measured, 2)
        result["control_tables_after_cycle"] = bench.control_tables()
        result["upstream_commits"] = bench.commits
        result["pipelines_per_batch"] = {
            "preloaded_mean": round(statistics.mean(bench.pipelines_per_batch[:preloaded]), 2),
            "cycle_mean": round(statistics.mean(bench.pipelines_per_batch[preloaded:]), 2),
        }
        result["scan_stats"] = meter.counter is not None
        result["measurements"] = {s: meter.samples[s].summary() for s in STEPS}
        result["loadavg_after"] = list(os.getloadavg())
        return result
    finally:
        bench.close()


def git_commit() -> str | None:
    """The short commit of the checkout the benchmark runs from (None outside git)."""
    git = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return git.stdout.strip() or None


def table(result: Mapping[str, Any]) -> str:
    """The results as a readable table: CPU median (min-max) and wall median per step."""
    lines = [
        f"control plane, commit {result['commit']}, cycle {result['cycle']} batches, "
        f"load average {' '.join(f'{v:.2f}' for v in result['loadavg_before'])}"
    ]
    header = f"{'step':<24}" + "".join(
        f"{str(s['batches']) + ' batches':>34}" for s in result["sizes"]
    )
    lines += [header, f"{'':<24}" + f"{'CPU s median (min-max) / wall':>34}" * len(result["sizes"])]
    for step in STEPS:
        cells = []
        for size in result["sizes"]:
            m = size["measurements"][step]
            cpu, wall = m["cpu_seconds"], m["wall_seconds"]
            cells.append(
                f"{cpu['median']:.3f} ({cpu['min']:.3f}-{cpu['max']:.3f}) / {wall['median']:.3f}"
            )
        lines.append(f"{step:<24}" + "".join(f"{c:>34}" for c in cells))
    for size in result["sizes"]:
        synth = size["synthesize_seconds"]
        files = {t: v["files"] for t, v in size["control_tables_after_cycle"].items()}
        lines.append(
            f"{size['batches']} batches: synthesized in {synth['total']} s (upstream commits "
            f"{synth['upstream_commits']} s, control rows {synth['control_rows']} s), cycle "
            f"measured in {size['measure_seconds']} s; pipelines per batch "
            f"{size['pipelines_per_batch']['cycle_mean']}; files after the cycle {files}; "
            f"load {size['loadavg_before'][0]:.2f} to {size['loadavg_after'][0]:.2f}"
        )
    lines.append("store reads and commits per step, median (max): files / rows / commits / loads")
    for step in (*TICKS, "run_side_per_pipeline"):
        cells = []
        for size in result["sizes"]:
            scan = size["measurements"][step]["scan"] or {}
            cells.append(
                " / ".join(
                    f"{scan[k]['median']:g} ({scan[k]['max']:g})" if k in scan else "-"
                    for k in ("files", "rows", "commits", "loads")
                )
            )
        lines.append(f"{step:<24}" + "".join(f"{c:>40}" for c in cells))
    return "\n".join(lines)


def plot(result: Mapping[str, Any], path: Path) -> str:
    """Tick and run-side CPU seconds against history size, medians with min-max bars."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is missing (pip install -e '.[bench]')"
    sizes = [s["batches"] for s in result["sizes"]]
    fig, ax = plt.subplots(figsize=(8, 5))
    for step in (*TICKS, "run_side_per_pipeline"):
        cpu = [s["measurements"][step]["cpu_seconds"] for s in result["sizes"]]
        medians = [c["median"] for c in cpu]
        below = [c["median"] - c["min"] for c in cpu]
        above = [c["max"] - c["median"] for c in cpu]
        ax.errorbar(sizes, medians, yerr=[below, above], marker="o", capsize=4, label=step)
    ax.axhline(0.3, color="grey", linestyle="--", linewidth=1, label="target 0.3 s")
    ax.set_xscale("log")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.minorticks_off()  # only the measured sizes are labelled on the log axis
    ax.set_xlabel("batches of history")
    ax.set_ylabel("CPU seconds (median, min-max over the cycle)")
    ax.set_title(
        f"control plane cost vs history, {result['cycle']}-batch cycle (commit {result['commit']})"
    )
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return str(path)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--batches {text!r}: give history sizes as comma-separated integers, e.g. 100,1000"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--batches {text!r}: every size must be at least 1")
    return sizes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--batches", type=_sizes, default=[100, 1000, 5000], help="history sizes (100,1000,5000)"
    )
    parser.add_argument(
        "--cycle", type=int, default=50, help="batches driven and measured per size (50)"
    )
    parser.add_argument(
        "--cli-every", type=int, default=5, help="run the CLI reads every N batches (5)"
    )
    parser.add_argument(
        "--observe-tables",
        type=lambda text: _sizes(text) if text else [],
        default=[50, 500, 2000],
        help="also observe this many local tables cold, warm and with 10%% changed, against "
        "one listing of each _delta_log (benchmarks/observe.py); '' skips it (50,500,2000)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "control_plane.json")
    # The docs site shows the plot (docs/benchmarks.md).
    parser.add_argument("--plot", type=Path, default=REPO / "docs" / "img" / "control_plane.png")
    parser.add_argument("--root", type=Path, default=None, help="work folder (default: a temp)")
    parser.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        default=None,
        help="measure nothing: merge the sizes of these result files into --out and plot them",
    )
    args = parser.parse_args(argv)
    for flag in ("cycle", "cli_every"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    return args


@contextlib.contextmanager
def _work_folder(root: Path | None) -> Iterator[Path]:
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
        yield root
        return
    with tempfile.TemporaryDirectory(prefix="control-plane-") as tmp:
        yield Path(tmp)


def write(result: dict[str, Any], args: argparse.Namespace, started: float) -> None:
    """Write the JSON and the plot of the sizes measured so far (after every size, so a
    long run that is stopped keeps what it measured)."""
    result["loadavg_after"] = list(os.getloadavg())
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["plot"] = plot(result, args.plot)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")


def combine(paths: Sequence[Path]) -> dict[str, Any]:
    """One result of the sizes of several result files (sizes run as separate processes),
    ordered by size. Refused when they were measured with different cycles or commits."""
    results = [json.loads(p.read_text()) for p in paths]
    for key in ("cycle", "cli_every", "commit", "pipeline_inputs"):
        values = {json.dumps(r.get(key)) for r in results}
        if len(values) > 1:
            raise SystemExit(
                f"--combine: the files differ in {key} ({sorted(values)}); combine only runs "
                "of one commit with the same --cycle and --cli-every."
            )
    merged = dict(results[0])
    merged["sizes"] = sorted((s for r in results for s in r["sizes"]), key=lambda s: s["batches"])
    merged["combined_from"] = [str(p) for p in paths]
    merged["loadavg_before"] = results[0]["loadavg_before"]
    merged["seconds"] = max(r["seconds"] for r in results)
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    """Run every size, print the table, write the JSON and the plot."""
    args = parse_args(argv)
    if args.combine:
        result = combine(args.combine)
        result["plot"] = plot(result, args.plot)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(table(result))
        print(f"\nresults: {args.out}; plot: {result['plot']}")
        return 0
    saved = {k: os.environ.get(k) for k in ("DAGSTER_HOME", "WATERMARK_HOME")}
    started = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "control_plane",
        "commit": git_commit(),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "loadavg_before": list(os.getloadavg()),
        "cycle": args.cycle,
        "cli_every": args.cli_every,
        "upstreams": len(UPSTREAMS),
        "pipelines": len(PIPELINES),
        "pipeline_inputs": pipeline_inputs(),
        "sizes": [],
    }
    try:
        with _work_folder(args.root) as work:
            for batches in args.batches:
                print(f"{batches} batches: synthesizing and measuring...", flush=True)
                size = measure_size(batches, cycle=args.cycle, cli_every=args.cli_every, work=work)
                result["sizes"].append(size)
                write(result, args, started)
            result["observation"] = []
            for count in args.observe_tables:
                print(f"observing {count} tables...", flush=True)
                upstreams = observe.make_tables(work / f"observe{count}", count)
                result["observation"].append(observe.observation_costs(upstreams))
                write(result, args, started)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    print(table(result))
    for costs in result.get("observation", []):
        observe.print_costs(costs)
    print(f"\nresults: {args.out}; plot: {result['plot']}; total {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
