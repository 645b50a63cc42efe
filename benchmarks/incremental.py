"""Incremental batch cost: our batch against a full recompute and Structured Streaming.

One command builds, per size, an upstream Delta table with change data feed (id,
customer_id, amount, ts and a 50-character payload), lets every contender load it once,
then makes, per change rate and repeat, one upstream MERGE commit (40% updates, 30%
deletes, 30% inserts of the table's rows) and has every contender process exactly that
commit, in an order rotated from repeat to repeat:

* ``ours_warm``: our batch in this process on a warm Spark session: a headless cycle of the
  code location (coordinator tick that observes and plans, the Dagster run that reads,
  transforms, merges and checkpoints, finalizer tick that advances and completes);
* ``ours_cold``: the same through ``watermark run`` in a fresh process (Python, Dagster and
  JVM start included);
* ``ours_connect``: ``watermark run`` in a fresh process on the home's Spark Connect engine
  (``watermark engine``, started once per size; its first batch is the first load): the
  run process starts no JVM, its pipelines run on the server;
* ``recompute_warm`` / ``recompute_cold``: read the snapshot, same projection, overwrite;
* ``streaming_warm`` / ``streaming_cold``: Structured Streaming of the change feed,
  ``availableNow``, checkpointed, ``foreachBatch`` MERGE of the latest change per key;
* ``floor_warm``: the floor, the same streaming query into a target created with our layout
  (deletion vectors, clustered on ``id``): a plain Delta MERGE of the same changes into the
  same kind of table, with nothing of ours around it.

Every contender has its own target and is up to date before each measured commit, so all
start from the same state. After each commit every target is compared with the recompute
(row count and a hash sum over every column); a difference stops the run with exit 1.
Prints medians and min-max of the paired repeats, the ratios, Delta's MERGE metrics, the
load average; writes JSON (``--out``) and a PNG plot (needs the ``bench`` extra).

    .venv/bin/python -m benchmarks.incremental                  # 0.5M, 2M, 8M rows x 0.1%, 1%, 10%
    .venv/bin/python -m benchmarks.incremental --sizes 500k --changes 0.1%,1% --repeats 3
    .venv/bin/python -m benchmarks.incremental --quick          # 50k rows, 1%, 1 repeat
    .venv/bin/python -m benchmarks.incremental --declared       # declared vs hand-written

``--declared`` runs :mod:`benchmarks.declared` instead (the demo's declared pipelines
against the same pipelines hand-written and a full recompute); the options after it are
that benchmark's (``--declared --help`` lists them).

The module is also the benchmark's code location for ``watermark run --defs
benchmarks.incremental:defs`` (the spec file is named by ``WATERMARK_BENCH_SPEC``).
"""

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from benchmarks.baselines import (
    TARGET_COLUMNS,
    build_session,
    create_streaming_target,
    project,
    recompute,
    streaming_catch_up,
)

REPO = Path(__file__).resolve().parents[1]
SPEC_ENV = "WATERMARK_BENCH_SPEC"
UPSTREAM = "events"
PIPELINE = "events_projected"
UPSTREAM_COLUMNS = ("id", "customer_id", "amount", "ts", "payload")

CONTENDERS = {
    "ours_warm": "our batch in-process, warm Spark: headless cycle = plan tick + Dagster run "
    "(read, transform, MERGE, checkpoint) + finalize tick",
    "ours_cold": "our batch as `watermark run` in a fresh process (Python, Dagster, JVM start)",
    "ours_connect": "our batch as `watermark run` in a fresh process (Python, Dagster, no JVM) "
    "on the home's Spark Connect engine `watermark engine` (warm server, started per size)",
    "ours_full_warm": "ours_warm's pipeline also given its full transform (the projection of "
    "the snapshot), so `auto` chooses among incremental, full and rewrite from sizes and "
    "measured runs",
    "recompute_warm": "full recompute, warm Spark: snapshot, same projection, overwrite",
    "recompute_cold": "full recompute in a fresh Python process with its own JVM",
    "streaming_warm": "Structured Streaming, warm Spark: change feed, availableNow, "
    "checkpointed, foreachBatch MERGE of the latest change per key",
    "streaming_cold": "the same streaming query in a fresh Python process with its own JVM",
    "floor_warm": "the floor: the same streaming query, warm Spark, into a target created with "
    "our layout (deletion vectors, clustered on id), so its MERGE does what ours does",
}
# (name, numerator, denominator): a ratio above 1 means the denominator is faster.
RATIOS = (
    ("recompute/ours warm", "recompute_warm", "ours_warm"),
    ("ours full/recompute warm", "ours_full_warm", "recompute_warm"),
    ("recompute/ours cold", "recompute_cold", "ours_cold"),
    ("recompute cold/ours connect", "recompute_cold", "ours_connect"),
    ("ours/streaming warm", "ours_warm", "streaming_warm"),
    ("ours/streaming cold", "ours_cold", "streaming_cold"),
    ("ours connect/streaming cold", "ours_connect", "streaming_cold"),
    ("ours/floor warm", "ours_warm", "floor_warm"),
    ("recompute/floor warm", "recompute_warm", "floor_warm"),
)
MERGE_METRICS = (
    "numTargetRowsCopied",
    "numTargetRowsUpdated",
    "numTargetRowsInserted",
    "numTargetRowsDeleted",
    "numTargetFilesAdded",
    "numTargetFilesRemoved",
    "numTargetDeletionVectorsAdded",
)
PLOT_COLORS = {"ours": "tab:blue", "recompute": "tab:red", "streaming": "tab:green"}
# --quick is a smoke run whose times mean nothing: short-lived JVM settings start faster.
QUICK_CONF = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.sql.shuffle.partitions": "2",
}
DEFAULT_SIZES = (500_000, 2_000_000, 8_000_000)
DEFAULT_CHANGES = (0.001, 0.01, 0.1)
EPOCH = 1_767_225_600  # 2026-01-01 UTC
YEAR = 365 * 86_400


class TargetMismatch(Exception):
    """A contender's target differs from the recompute: the benchmark's figures are void."""


class CycleError(Exception):
    """A contender did not process exactly the measured commit."""


# ---------------------------------------------------------------------------------------
# The code location: one upstream, one merge pipeline, through the public API.


def location(spec: dict[str, Any]) -> Any:
    """The benchmark's code location: upstream ``events``, pipeline ``events_projected``
    (a per-row projection of ``net_changes(["id"])``) merged into ``spec["target"]``; with
    ``spec["full"]`` the pipeline also has its full transform (the projection of the
    snapshot), so ``auto`` may compute a batch in full or rewrite the target."""
    from watermark_dagster import (
        DeltaUpstream,
        Registry,
        SparkSessionResource,
        WatermarkSettings,
        build_definitions,
        pipeline,
    )

    events = DeltaUpstream(name=UPSTREAM, path=spec["upstream"])

    def full(events):  # the target from scratch: the snapshot, projected
        return project(events)

    @pipeline(
        upstreams=[UPSTREAM],
        target=spec["target"],
        keys=["id"],
        name=PIPELINE,
        full_transform=full if spec.get("full") else None,
    )
    def events_projected(batch):  # BatchContext -> DataFrame
        """The latest change per id, projected."""
        return project(batch[UPSTREAM].net_changes(["id"]))

    return build_definitions(
        Registry(upstreams=[events], pipelines=[events_projected]),
        control_root=spec["control_root"],
        spark=SparkSessionResource(
            master=spec["spark"]["master"],
            app_name="bench-ours",
            conf=spec["spark"]["conf"],
            engine=spec.get("engine", "process"),
        ),
        settings=WatermarkSettings(min_batch_interval_seconds=0),
    )


def __getattr__(name: str) -> Any:  # `--defs benchmarks.incremental:defs`
    if name == "defs":
        return location(json.loads(Path(os.environ[SPEC_ENV]).read_text()))
    raise AttributeError(name)


# ---------------------------------------------------------------------------------------
# The upstream and its changes.


def _with_columns(ids: DataFrame, salt: int) -> DataFrame:
    """Rows for the ids in ``ids``; ``salt`` (the commit number) varies updated values."""
    h = F.xxhash64("id", F.lit(salt))
    return ids.select(
        "id",
        F.pmod(h, F.lit(100_000)).alias("customer_id"),
        (F.pmod(h, F.lit(10_000_000)) / 100.0).alias("amount"),
        F.timestamp_seconds(
            F.lit(EPOCH) + F.pmod(F.col("id") * 37 + salt * 86_400, F.lit(YEAR))
        ).alias("ts"),
        F.concat(  # 1 + 12 + 1 + 32 + 1 + 3 = 50 characters
            F.lit("p"),
            F.lpad(F.col("id").cast("string"), 12, "0"),
            F.lit("-"),
            F.md5(F.concat_ws(":", F.col("id").cast("string"), F.lit(str(salt)))),
            F.lit(f"-{salt % 1000:03d}"),
        ).alias("payload"),
    )


def build_upstream(spark: SparkSession, path: str, rows: int) -> int:
    """Create the upstream with change data feed and ``rows`` rows; returns its version."""
    from delta.tables import DeltaTable

    schema = _with_columns(spark.range(0), 0).schema
    (
        DeltaTable.create(spark)
        .location(path)
        .addColumns(schema)
        .property("delta.enableChangeDataFeed", "true")
        .execute()
    )
    partitions = max(2, rows // 500_000)
    _with_columns(spark.range(0, rows, numPartitions=partitions), 0).write.format("delta").mode(
        "append"
    ).save(path)
    return _delta_version(path)


@dataclass(frozen=True)
class Change:
    """One upstream MERGE commit."""

    version: int
    updated: int
    deleted: int
    inserted: int
    seconds: float

    @property
    def rows(self) -> int:
        return self.updated + self.deleted + self.inserted


PATTERNS = {
    "uniform": "updated and deleted ids drawn from the whole table (every file holds one)",
    "recent": "updated and deleted ids drawn from the newest 5% of ids (changes to recent "
    "rows, as in order or event tables)",
}
RECENT_SHARE = 0.05


def commit_change(
    spark: SparkSession,
    path: str,
    *,
    size: int,
    fraction: float,
    salt: int,
    next_id: int,
    pattern: str = "uniform",
) -> Change:
    """One MERGE commit changing ``fraction`` of ``size`` rows: 40% updates, 30% deletes
    (of existing ids, chosen by a seeded hash, from the whole table or, with ``pattern``
    ``"recent"``, from the newest :data:`RECENT_SHARE` of ids) and 30% inserts (new ids
    from ``next_id``)."""
    from delta.tables import DeltaTable

    started = time.perf_counter()
    changed = max(1, round(size * fraction))
    n_update, n_delete = round(changed * 0.4), round(changed * 0.3)
    n_insert = changed - n_update - n_delete
    current = spark.read.format("delta").load(path).select("id")
    if pattern == "recent":
        floor = max(0, next_id - max(round(next_id * RECENT_SHARE), round(changed * 2)))
        current = current.where(F.col("id") >= floor)
    total = current.count()
    wanted = n_update + n_delete
    picked = (
        current.sample(False, min(1.0, wanted * 1.5 / max(total, 1) + 0.001), seed=salt)
        .withColumn("_r", F.xxhash64("id", F.lit(salt)))
        .orderBy("_r")
        .limit(wanted)
        .withColumn("_n", F.row_number().over(Window.orderBy("_r")))
        .localCheckpoint()
    )
    updates = _with_columns(picked.where(F.col("_n") <= n_update), salt)
    deletes = _with_columns(picked.where(F.col("_n") > n_update), salt)
    inserts = _with_columns(spark.range(next_id, next_id + n_insert, numPartitions=2), salt)
    source = (
        updates.withColumn("_op", F.lit("U"))
        .unionByName(deletes.withColumn("_op", F.lit("D")))
        .unionByName(inserts.withColumn("_op", F.lit("I")))
    )
    values = {c: F.col(f"s.{c}") for c in UPSTREAM_COLUMNS}
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), F.col("t.id") == F.col("s.id"))
        .whenMatchedUpdate(condition=F.col("s._op") == "U", set=values)
        .whenMatchedDelete(condition=F.col("s._op") == "D")
        .whenNotMatchedInsert(condition=F.col("s._op") == "I", values=values)
        .execute()
    )
    picked.unpersist()
    version = _delta_version(path)
    metrics = _merge_metrics(path, version - 1)
    return Change(
        version=version,
        updated=metrics.get("numTargetRowsUpdated", 0),
        deleted=metrics.get("numTargetRowsDeleted", 0),
        inserted=metrics.get("numTargetRowsInserted", 0),
        seconds=time.perf_counter() - started,
    )


# ---------------------------------------------------------------------------------------
# Delta facts, read with delta-rs (no Spark job, nothing to distort the timings).


def _delta_version(path: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(path).version()


def _merge_metrics(path: str, after_version: int) -> dict[str, int]:
    """Delta's operation metrics summed over the MERGE commits made after ``after_version``
    (a contender may commit more than once per batch)."""
    from deltalake import DeltaTable

    table = DeltaTable(path)
    commits = table.history(max(1, table.version() - after_version))
    total: dict[str, int] = {"merge_commits": 0, "commits": 0}
    for commit in commits:
        if commit.get("version", -1) <= after_version:
            continue
        total["commits"] += 1
        if commit.get("operation") != "MERGE":
            continue
        total["merge_commits"] += 1
        for key, value in (commit.get("operationMetrics") or {}).items():
            try:
                total[key] = total.get(key, 0) + int(value)
            except (TypeError, ValueError):
                continue
    return total


# ---------------------------------------------------------------------------------------
# The contenders.


@dataclass
class Outcome:
    """One contender processing one commit."""

    seconds: float
    merge: dict[str, int] | None = None
    detail: dict[str, Any] | None = None


class Contenders:
    """Every contender of one size: its target, its state, and how it processes a commit.

    First loads (``setup``) are made in this process for every contender, cold ones
    included: they are not what is compared, and a cold contender then starts each
    measured commit from the same kind of state as its warm twin (control tables and
    Dagster instance, checkpoint, target).
    """

    def __init__(
        self,
        spark: SparkSession,
        root: Path,
        upstream: str,
        settings: dict[str, Any],
        names: Sequence[str],
    ) -> None:
        self.spark = spark
        self.root = root
        self.upstream = upstream
        self.settings = settings
        self.names = list(names)
        self.targets = {n: str(root / "targets" / n) for n in self.names}
        self._runners: dict[str, tuple[Any, Any]] = {}
        self._engines: dict[str, subprocess.Popen[bytes]] = {}

    def close(self) -> None:
        """Release the Dagster instances of the in-process runners; stop the engine."""
        for instance, _ in self._runners.values():
            instance.dispose()
        self._runners.clear()
        for engine in self._engines.values():
            engine.send_signal(signal.SIGTERM)
            try:
                engine.wait(timeout=120)
            except subprocess.TimeoutExpired:
                engine.kill()
                engine.wait()
        self._engines.clear()

    def setup(self, name: str, version: int) -> Outcome:
        """The first load of ``name``'s target, in this process; timed for the record."""
        started = time.perf_counter()
        if name == "ours_connect":
            # The engine is started once; its first batch (this first load) warms its JIT.
            self._start_engine(name)
            self._watermark_run(name, version)
            detail = None
        elif name.startswith("ours"):
            detail = self._headless(name, version)
            if name == "ours_cold":  # `watermark run` opens the instance itself from now on
                self._runners.pop(name)[0].dispose()
        elif name.startswith("recompute"):
            recompute(self.spark, self.upstream, self.targets[name], version)
            detail = None
        else:
            create_streaming_target(
                self.spark, self.upstream, self.targets[name], our_layout=name == "floor_warm"
            )
            detail = {"micro_batches": self._stream(name)}
        return Outcome(time.perf_counter() - started, detail=detail)

    def process(self, name: str, version: int) -> Outcome:
        """Have ``name`` bring its target up to ``version``; timed (cold ones from outside
        their process)."""
        before = _delta_version(self.targets[name])
        if name in ("ours_warm", "ours_full_warm"):
            started = time.perf_counter()
            detail = self._headless(name, version)
            outcome = Outcome(time.perf_counter() - started, detail=detail)
        elif name in ("ours_cold", "ours_connect"):
            outcome = self._watermark_run(name, version)
        elif name == "recompute_warm":
            started = time.perf_counter()
            recompute(self.spark, self.upstream, self.targets[name], version)
            outcome = Outcome(time.perf_counter() - started)
        elif name in ("streaming_warm", "floor_warm"):
            started = time.perf_counter()
            batches = self._stream(name)
            outcome = Outcome(time.perf_counter() - started, detail={"micro_batches": batches})
        else:
            kind = name.removesuffix("_cold")
            spec = {
                "spark": self.settings,
                "upstream": self.upstream,
                "target": self.targets[name],
                "version": version,
                "checkpoint": self._checkpoint(name),
            }
            argv = [sys.executable, "-m", "benchmarks.baselines", kind, json.dumps(spec)]
            outcome = Outcome(_timed_child(argv, _child_env({}), f"cold {kind}")[0])
        if not name.startswith("recompute"):
            outcome.merge = _merge_metrics(self.targets[name], before)
        return outcome

    # -- ours ------------------------------------------------------------------------------

    def _spec(self, name: str) -> dict[str, Any]:
        return {
            "spark": self.settings,
            "upstream": self.upstream,
            "target": self.targets[name],
            "control_root": str(self.root / "control" / name),
            "engine": "connect" if name == "ours_connect" else "process",
            "full": name == "ours_full_warm",
        }

    def _cli_env(self, name: str) -> dict[str, str]:
        """The environment of ``watermark`` commands on ``name``'s code location."""
        spec_file = self.root / f"{name}.json"
        spec_file.write_text(json.dumps(self._spec(name)))
        return _child_env(
            {
                SPEC_ENV: str(spec_file),
                "DAGSTER_HOME": str(self._dagster_home(name)),
                "WATERMARK_HOME": str(self.root / f"watermark_home_{name}"),
            }
        )

    def _start_engine(self, name: str) -> None:
        """The Connect engine (``watermark engine``) of ``name``'s code location; returns
        when it accepts runs.

        Raises:
            CycleError: the engine exited before it was ready.
        """
        from watermark_dagster.runtime.connect import engine_folder, live_engine

        env = self._cli_env(name)
        home = Path(env["WATERMARK_HOME"])
        log_path = self.root / f"{name}-engine.log"
        argv = [*_watermark_command(), "engine", "--defs", "benchmarks.incremental:defs"]
        with log_path.open("w") as log_file:
            engine = subprocess.Popen(
                argv, env=env, cwd=REPO, stdout=log_file, stderr=log_file, stdin=subprocess.DEVNULL
            )
        self._engines[name] = engine
        while live_engine(engine_folder(home)) is None:
            if engine.poll() is not None:
                raise CycleError(f"{name}'s engine exited: {log_path.read_text()[-3000:]}")
            time.sleep(0.2)

    def _dagster_home(self, name: str) -> Path:
        home = self.root / "dagster" / name
        if not home.exists():
            home.mkdir(parents=True)
            shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
        return home

    def _headless(self, name: str, version: int) -> dict[str, Any]:
        """One headless cycle of ``name``'s code location in this process."""
        if name not in self._runners:
            from dagster import DagsterInstance

            from watermark_dagster.dagster_defs.headless import HeadlessRunner

            instance = DagsterInstance.from_config(str(self._dagster_home(name)))
            runner = HeadlessRunner(location(self._spec(name)), instance, run_log_level="ERROR")
            self._runners[name] = (instance, runner)
        instance, runner = self._runners[name]
        # The sensors' console lines (batch planned, advanced) would drown the figures; they
        # are shown when the cycle did not do what was expected.
        console = io.StringIO()
        with contextlib.redirect_stdout(console), contextlib.redirect_stderr(console):
            report = runner.run_until_idle()
        problems = [f"{r.batch_id}: {r.error}" for r in report.failed_runs]
        if report.stuck:
            problems.append(report.stuck)
        if problems:
            problems.append(console.getvalue()[-3000:])
        self._check_ours(name, version, report.completed, problems)
        run_seconds = 0.0
        for run in report.runs:
            stats = instance.get_run_stats(run.run_id)
            if stats.start_time is not None and stats.end_time is not None:
                run_seconds += stats.end_time - stats.start_time
        detail: dict[str, Any] = {"dagster_run_seconds": round(run_seconds, 3)}
        if name == "ours_full_warm":  # what `auto` chose for this batch, and why
            from dagster import AssetKey

            event = instance.get_latest_materialization_event(AssetKey(PIPELINE))
            found = event.asset_materialization if event is not None else None
            metadata = found.metadata if found is not None else {}
            for key in ("strategy", "strategy_reason"):
                if key in metadata:
                    detail[key] = metadata[key].value
        return detail

    def _watermark_run(self, name: str, version: int) -> Outcome:
        """``watermark run`` in a fresh process on ``name``'s code location."""
        env = self._cli_env(name)
        argv = [*_watermark_command(), "run", "--defs", "benchmarks.incremental:defs", "--json"]
        seconds, out = _timed_child(argv, env, "watermark run")
        try:
            report = json.loads(out)
        except json.JSONDecodeError:
            raise CycleError(f"watermark run printed no JSON report:\n{out[-2000:]}") from None
        problems = [f"{r['batch_id']}: {r['error']}" for r in report["runs"] if not r["success"]]
        if report.get("stuck"):
            problems.append(report["stuck"])
        if name == "ours_connect":
            problems += self._off_engine(name, [r["run_id"] for r in report["runs"]])
        self._check_ours(name, version, report["completed"], problems)
        return Outcome(seconds)

    def _off_engine(self, name: str, run_ids: Sequence[str]) -> list[str]:
        """The runs among ``run_ids`` that did not run on ``name``'s engine (read after the
        timed process, from the runs' ``watermark/engine`` tag)."""
        from dagster import DagsterInstance

        from watermark_dagster.dagster_defs.assets import ENGINE_TAG

        prefix = "connect:"
        with DagsterInstance.from_config(str(self._dagster_home(name))) as instance:
            runs = {i: instance.get_run_by_id(i) for i in run_ids}
            tags = {i: run.tags.get(ENGINE_TAG) if run else None for i, run in runs.items()}
        return [
            f"run {i} ran on {tag!r}, not {name}'s engine"
            for i, tag in tags.items()
            if not str(tag).startswith(prefix)
        ]

    def _check_ours(
        self, name: str, version: int, completed: Sequence[str], problems: list[str]
    ) -> None:
        from watermark_dagster import WatermarkStore

        mark = WatermarkStore(self._spec(name)["control_root"]).committed().get(UPSTREAM)
        at = mark.committed_version if mark is not None else None
        if problems or len(completed) != 1 or at != version:
            raise CycleError(
                f"{name}: expected one completed batch ending at upstream version {version}; "
                f"completed {list(completed)}, committed watermark {at}, problems {problems}"
            )

    # -- streaming -------------------------------------------------------------------------

    def _checkpoint(self, name: str) -> str:
        return str(self.root / "checkpoints" / name)

    def _stream(self, name: str) -> int:
        return streaming_catch_up(
            self.spark, self.upstream, self.targets[name], self._checkpoint(name)
        )


def _watermark_command() -> list[str]:
    script = Path(sys.executable).parent / "watermark"
    return [str(script)] if script.exists() else [sys.executable, "-m", "watermark_dagster.cli"]


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def _timed_child(argv: list[str], env: dict[str, str], what: str) -> tuple[float, str]:
    """Run a fresh process and time it from outside; its stdout, or an error naming it."""
    started = time.perf_counter()
    proc = subprocess.run(
        argv, env=env, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise CycleError(
            f"{what} exited {proc.returncode}: {' '.join(argv[:4])} ...\n"
            f"{proc.stderr[-3000:]}{proc.stdout[-1000:]}"
        )
    return seconds, proc.stdout


# ---------------------------------------------------------------------------------------
# The correctness check.


def fingerprint(frame: DataFrame, columns: Sequence[str] = TARGET_COLUMNS) -> tuple[int, str]:
    """Row count and the sum of a 64-bit hash of ``columns`` (every target column by
    default): equal multisets of rows give equal fingerprints."""
    row = (
        frame.select(*columns)
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum(F.xxhash64(*columns).cast("decimal(38,0)")).alias("hash"),
        )
        .first()
    )
    assert row is not None
    return int(row["rows"]), str(row["hash"])


def check_targets(
    spark: SparkSession, upstream: str, version: int, targets: dict[str, str]
) -> dict[str, Any]:
    """Compare every target with the recompute of ``upstream`` at ``version``.

    Raises:
        TargetMismatch: a target differs; the message names it and shows rows on each side.
    """
    reference = project(spark.read.format("delta").option("versionAsOf", version).load(upstream))
    expected = fingerprint(reference)
    for name, path in targets.items():
        target = spark.read.format("delta").load(path)
        got = fingerprint(target)
        if got == expected:
            continue
        ref, tgt = reference.select(*TARGET_COLUMNS), target.select(*TARGET_COLUMNS)
        extra = [r.asDict() for r in tgt.exceptAll(ref).limit(3).collect()]
        missing = [r.asDict() for r in ref.exceptAll(tgt).limit(3).collect()]
        raise TargetMismatch(
            f"target of {name} ({path}) differs from the recompute at upstream version "
            f"{version}: {got[0]} rows against {expected[0]}; rows only in the target "
            f"{extra}; rows only in the recompute {missing}"
        )
    return {"version": version, "rows": expected[0], "equal": sorted(targets)}


# ---------------------------------------------------------------------------------------
# Running, summarizing, reporting.


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def summarize(repeats: list[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Medians and min-max per contender, paired ratios, and median MERGE metrics."""
    seconds = {n: [r["seconds"][n] for r in repeats] for n in names}
    ratios = {}
    for label, num, den in RATIOS:
        if num in names and den in names:
            ratios[label] = _spread([r["seconds"][num] / r["seconds"][den] for r in repeats])
    merge = {}
    for n in names:
        found = [r["merge"][n] for r in repeats if r["merge"].get(n)]
        if found:
            keys = sorted({k for m in found for k in m})
            merge[n] = {k: statistics.median([m.get(k, 0) for m in found]) for k in keys}
    details: dict[str, dict[str, dict[str, float]]] = {}
    for n in names:
        found = [r["detail"][n] for r in repeats if r.get("detail", {}).get(n)]
        for key in sorted({k for d in found for k in d}):
            values = [d[key] for d in found if isinstance(d.get(key), int | float)]
            if values:
                details.setdefault(n, {})[key] = _spread(values)
    return {
        "seconds": {n: _spread(v) for n, v in seconds.items()},
        "ratios": ratios,
        "merge_metrics_median": merge,
        "details": details,
    }


def _print_change_summary(out: Callable[[str], None], summary: dict[str, Any]) -> None:
    out(f"    {'contender':<16} {'median s':>9} {'min-max s':>16}")
    for name, s in summary["seconds"].items():
        out(f"    {name:<16} {s['median']:>9.2f} {s['min']:>7.2f}-{s['max']:<8.2f}")
    for label, s in summary["ratios"].items():
        out(f"    {label:<22} {s['median']:>6.2f}x  (min-max {s['min']:.2f}-{s['max']:.2f})")
    for name, m in summary["merge_metrics_median"].items():
        shown = ", ".join(
            f"{k.removeprefix('numTarget')}={m[k]:g}" for k in MERGE_METRICS if k in m
        )
        out(f"    MERGE {name}: {shown}")
    run = summary.get("details", {}).get("ours_warm", {}).get("dagster_run_seconds")
    if run and "ours_warm" in summary["seconds"]:
        out(
            f"    ours_warm: the Dagster run took {run['median']:.2f}s (median) of "
            f"{summary['seconds']['ours_warm']['median']:.2f}s; the rest is the sensor ticks"
        )


def run_size(
    spark: SparkSession,
    root: Path,
    rows: int,
    args: argparse.Namespace,
    settings: dict[str, Any],
    deadline: float,
    out: Callable[[str], None],
    result: dict[str, Any],
) -> None:
    """Everything for one upstream size, recorded into ``result`` as it goes (so a failure
    keeps what was measured); stops early, saying why, past ``deadline``."""
    result.update(rows=rows, loadavg_before=list(os.getloadavg()))
    out(f"\n== {rows:,} rows == load average {_load()}")
    upstream = str(root / "upstream")
    started = time.perf_counter()
    version = build_upstream(spark, upstream, rows)
    result["build_seconds"] = round(time.perf_counter() - started, 2)
    out(f"upstream built in {result['build_seconds']:.1f}s (version {version})")
    lab = Contenders(spark, root, upstream, settings, args.contenders)
    try:
        first = {}
        for name in lab.names:
            outcome = lab.setup(name, version)
            first[name] = round(outcome.seconds, 3)
            out(f"  first load {name:<16} {outcome.seconds:8.2f}s (in this process; not compared)")
        result["first_load_seconds"] = first
        result["first_check"] = check_targets(spark, upstream, version, lab.targets)
        result["changes"] = []
        next_id, salt, turn = rows, 0, 0
        for fraction in args.changes:
            if time.monotonic() > deadline:
                result["stopped"] = f"time budget reached before the {fraction:.2%} change"
                out(f"stopped: {result['stopped']}")
                break
            change_result: dict[str, Any] = {"fraction": fraction, "repeats": []}
            for repeat in range(args.repeats):
                salt += 1
                change = commit_change(
                    spark,
                    upstream,
                    size=rows,
                    fraction=fraction,
                    salt=salt,
                    next_id=next_id,
                    pattern=args.pattern,
                )
                next_id += change.inserted
                order = lab.names[turn % len(lab.names) :] + lab.names[: turn % len(lab.names)]
                turn += 1
                out(
                    f"  {fraction:.2%} repeat {repeat + 1}/{args.repeats}: upstream v"
                    f"{change.version} ({change.updated} updated, {change.deleted} deleted, "
                    f"{change.inserted} inserted, committed in {change.seconds:.1f}s)"
                )
                record: dict[str, Any] = {
                    "repeat": repeat + 1,
                    "upstream_version": change.version,
                    "upstream_change": {
                        "updated": change.updated,
                        "deleted": change.deleted,
                        "inserted": change.inserted,
                    },
                    "order": order,
                    "seconds": {},
                    "merge": {},
                    "detail": {},
                }
                for name in order:
                    outcome = lab.process(name, change.version)
                    record["seconds"][name] = round(outcome.seconds, 3)
                    record["merge"][name] = outcome.merge
                    if outcome.detail:
                        record["detail"][name] = outcome.detail
                    out(f"    {name:<16} {outcome.seconds:8.2f}s")
                record["check"] = check_targets(spark, upstream, change.version, lab.targets)
                change_result["repeats"].append(record)
                change_result["rows_changed"] = change.rows
            change_result["summary"] = summarize(change_result["repeats"], lab.names)
            out(f"  summary {rows:,} rows, {fraction:.2%} change ({args.repeats} repeats):")
            _print_change_summary(out, change_result["summary"])
            result["changes"].append(change_result)
    finally:
        lab.close()
        result["loadavg_after"] = list(os.getloadavg())
        result["seconds"] = round(time.perf_counter() - started, 1)
        out(f"== {rows:,} rows done in {result['seconds']:.0f}s; load average {_load()}")


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import importlib.metadata as md

    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        text = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next(
            line.split(":", 1)[1].strip() for line in text.splitlines() if "model name" in line
        )
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        info["memory_gib"] = round(int(mem) / 1024**2, 1)
    except (OSError, StopIteration, IndexError, ValueError):
        pass
    java = subprocess.run(["java", "-version"], capture_output=True, text=True)
    info["java"] = (java.stderr.splitlines() or ["?"])[0]
    for package in ("pyspark", "delta-spark", "deltalake", "dagster"):
        info[package] = md.version(package)
    git = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    info["commit"] = git.stdout.strip() or None
    return info


def spark_description(spark: SparkSession, settings: dict[str, Any]) -> dict[str, str]:
    """The settings that shape the figures, as the warm session has them (the JVM options
    as given: Spark appends its own module flags to them)."""
    conf = spark.sparkContext.getConf()
    found = {
        "spark.master": conf.get("spark.master", "?"),
        "spark.driver.memory": conf.get("spark.driver.memory", "(Spark default: 1g)"),
    }
    for key in (
        "spark.sql.shuffle.partitions",
        "spark.sql.adaptive.enabled",
        "spark.databricks.delta.snapshotPartitions",
    ):
        found[key] = str(spark.conf.get(key))
    found["spark.default.parallelism"] = conf.get("spark.default.parallelism", "(cores: 2)")
    found["spark.driver.extraJavaOptions"] = settings["conf"].get(
        "spark.driver.extraJavaOptions", "(JVM defaults)"
    )
    return found


def plot(result: dict[str, Any], path: Path) -> str:
    """Seconds per contender per size and change (median bars, min-max whiskers), log
    scale. Returns the PNG's path, or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is missing (pip install -e '.[bench]')"
    sizes = [s for s in result["sizes"] if s.get("changes")]
    if not sizes:
        return "no plot: no size finished a change"
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4.5), squeeze=False)
    names = result["contenders"]
    width = 0.8 / len(names)
    for ax, size in zip(axes[0], sizes, strict=True):
        changes = size["changes"]
        for i, name in enumerate(names):
            stats = [c["summary"]["seconds"][name] for c in changes]
            med = [s["median"] for s in stats]
            err = [
                [m - s["min"] for m, s in zip(med, stats, strict=True)],
                [s["max"] - m for m, s in zip(med, stats, strict=True)],
            ]
            xs = [j + i * width for j in range(len(changes))]
            family, _, temperature = name.partition("_")
            ax.bar(
                xs,
                med,
                width,
                yerr=err,
                capsize=2,
                label=name,
                color=PLOT_COLORS.get(family, "grey"),
                alpha=1.0 if temperature == "warm" else 0.55,
                hatch={"warm": "", "engine": ".."}.get(temperature, "//"),
                edgecolor="black",
                linewidth=0.4,
            )
        ax.set_xticks(
            [j + 0.4 - width / 2 for j in range(len(changes))],
            [f"{c['fraction']:.1%}" for c in changes],
        )
        ax.set_yscale("log")
        ax.set_xlabel("change per commit")
        ax.set_ylabel("seconds (median, min-max)")
        load = f"load {size['loadavg_before'][0]:.1f} to {size.get('loadavg_after', ['?'])[0]:.1f}"
        ax.set_title(f"{size['rows']:,} rows ({load})", fontsize=10)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    m = result["machine"]
    fig.suptitle(
        f"one batch per commit ({next(iter(result.get('pattern', {'uniform': ''})))} ids); "
        f"{m['cpus']} cores, {result['spark']['spark.master']}, commit {m.get('commit')}",
        fontsize=10,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return str(path)


# ---------------------------------------------------------------------------------------
# Command line.


def _rows(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    number = float(text[:-1] if scale > 1 else text)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"a size must be positive, got {text!r}")
    return int(number * scale)


def _fraction(text: str) -> float:
    text = text.strip()
    value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    if not 0 < value <= 0.5:
        raise argparse.ArgumentTypeError(
            f"a change must be above 0 and at most 50% of the table, got {text!r}"
        )
    return value


def _list(cast: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        return [cast(part) for part in text.split(",") if part.strip()]

    return parse


def _contenders(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown contender(s) {unknown}; known: {list(CONTENDERS)}"
        )
    return [n for n in CONTENDERS if n in names]  # fixed order, rotated per repeat


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=_list(_rows),
        default=list(DEFAULT_SIZES),
        help="upstream rows, comma-separated (500k,2M,8M)",
    )
    parser.add_argument(
        "--changes",
        type=_list(_fraction),
        default=list(DEFAULT_CHANGES),
        help="change per commit as fractions or percents (0.1%%,1%%,10%%)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="paired repeats per change")
    parser.add_argument(
        "--pattern",
        choices=sorted(PATTERNS),
        default="uniform",
        help="which ids a change updates and deletes: "
        + "; ".join(f"{k}: {v}".replace("%", "%%") for k, v in PATTERNS.items()),
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=180.0,
        help="stop before a size or change that would not fit (default 180)",
    )
    parser.add_argument(
        "--contenders",
        type=_contenders,
        default=list(CONTENDERS),
        help=f"comma-separated subset of {','.join(CONTENDERS)}",
    )
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory (4g)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/incremental.json")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="PNG path (default: docs/img/<--out name>.png, which the docs site shows)",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="working folder for the tables (default: a temporary folder)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the tables afterwards")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 50k rows, one 1%% change, 1 repeat"
    )
    parser.add_argument(
        "--replot", type=Path, default=None, help="only redraw the PNG of a results JSON"
    )
    args = parser.parse_args(argv)
    if args.replot:
        args.plot = args.plot or _plot_path(args.replot)
        return args
    if args.quick:
        args.sizes, args.changes, args.repeats = [50_000], [0.01], 1
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if not args.sizes or not args.changes or not args.contenders:
        parser.error("--sizes, --changes and --contenders each need at least one value")
    args.plot = args.plot or _plot_path(args.out)
    return args


def _plot_path(results: Path) -> Path:
    """Where the plot of a results JSON goes by default: the docs site's images."""
    return REPO / "docs" / "img" / results.with_suffix(".png").name


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if "--declared" in given:
        from benchmarks import declared

        given.remove("--declared")
        return declared.main(given)
    args = parse_args(argv)
    out = lambda line: print(line, flush=True)  # noqa: E731
    if args.replot:
        out(plot(json.loads(args.replot.read_text()), args.plot))
        return 0
    started_at, started = datetime.now(UTC), time.monotonic()
    deadline = started + args.budget_minutes * 60
    conf = {"spark.driver.memory": args.driver_memory, **(QUICK_CONF if args.quick else {})}
    settings = {"master": "local[2]", "conf": conf}
    root = args.root or Path(tempfile.mkdtemp(prefix="bench-incremental-"))
    root.mkdir(parents=True, exist_ok=True)

    import watermark_dagster  # noqa: F401 - the warm process is ours: build_session uses it

    spark = build_session(settings["master"], settings["conf"], "bench-incremental")
    spark.sparkContext.setLogLevel("ERROR")
    result: dict[str, Any] = {
        "benchmark": "incremental",
        "command": [Path(sys.executable).name, "-m", "benchmarks.incremental", *sys.argv[1:]],
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": machine(),
        "spark": spark_description(spark, settings),
        "contenders": args.contenders,
        "descriptions": {n: CONTENDERS[n] for n in args.contenders},
        "upstream": "Delta table with change data feed: id, customer_id, amount, ts, payload "
        "(50 characters); each change is one MERGE commit of 40% updates, 30% deletes, 30% "
        "inserts",
        "sizes_requested": args.sizes,
        "changes_requested": args.changes,
        "pattern": {args.pattern: PATTERNS[args.pattern]},
        "repeats": args.repeats,
        "sizes": [],
        "stopped": None,
        "correct": True,
    }
    m = result["machine"]
    out(
        f"machine: {m['cpus']} cores, {m.get('cpu', '?')}, {m.get('memory_gib', '?')} GiB, "
        f"{m['java']}, commit {m['commit']}"
    )
    out("spark: " + ", ".join(f"{k}={v}" for k, v in result["spark"].items()))
    out("cold contenders start their own process and JVM with the same settings")
    for name in args.contenders:
        out(f"  {name}: {CONTENDERS[name]}")
    code = 0
    previous: tuple[int, float] | None = None
    try:
        for rows in args.sizes:
            remaining = deadline - time.monotonic()
            if previous is not None:
                predicted = previous[1] * rows / previous[0]
                if predicted > remaining:
                    result["stopped"] = {
                        "rows": rows,
                        "reason": f"time budget: {rows:,} rows would take about "
                        f"{predicted / 60:.0f} min (scaled from {previous[0]:,} rows), "
                        f"{max(remaining, 0) / 60:.0f} min of --budget-minutes "
                        f"{args.budget_minutes:g} left",
                    }
                    break
            size_root = root / f"rows_{rows}"
            size_started = time.monotonic()
            size: dict[str, Any] = {}
            result["sizes"].append(size)
            try:
                run_size(spark, size_root, rows, args, settings, deadline, out, size)
            except TargetMismatch:
                raise
            except Exception as e:  # reported as where and why the run stopped
                result["stopped"] = {"rows": rows, "reason": f"{type(e).__name__}: {e}"}
                code = 1
                break
            finally:
                if not args.keep:
                    shutil.rmtree(size_root, ignore_errors=True)
            stopped_inside = result["sizes"][-1].get("stopped")
            if stopped_inside:
                result["stopped"] = {"rows": rows, "reason": stopped_inside}
                break
            previous = (rows, time.monotonic() - size_started)
    except TargetMismatch as e:
        result["correct"] = False
        result["stopped"] = {"reason": f"TargetMismatch: {e}"}
        code = 1
    finally:
        spark.stop()
        if not args.keep and args.root is None:
            shutil.rmtree(root, ignore_errors=True)
        result["seconds"] = round(time.monotonic() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result["plot"] = plot(result, args.plot)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if result["stopped"]:
        out(
            f"\nSTOPPED at {result['stopped'].get('rows', '?')} rows: {result['stopped']['reason']}"
        )
    if not result["correct"]:
        out("\nFAILED: a target differs from the recompute; the figures above are void.")
    out(f"\nresults: {args.out}; plot: {result['plot']}; total {result['seconds'] / 60:.1f} min")
    return code


if __name__ == "__main__":
    sys.exit(main())
