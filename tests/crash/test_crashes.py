"""Crashes and races: real processes killed with SIGKILL at every named fault point, and
real processes and threads racing on the control tables.

Crash harness: a child process (a headless cycle, or the `watermark reset` command) runs
with ``WATERMARK_FAULTS`` naming one point and dies there (return code -9). The system then
recovers only by its normal means (the next sensor ticks, or the same command again), and
the lake is checked: every target equals a recompute from its upstreams at their committed
versions, every committed watermark is its upstream's latest version, each planned range
belongs to exactly one batch, and every watermark change has its history row.

Children only start a JVM when a pipeline runs in them: for points in the finalizer or
the command line, the pipelines ran in this process first (the session's ``spark``).
Lakes are built once per module and copied per case.

This file is also the children's entry point: ``python -m tests.crash.test_crashes ACTION ...``.
"""

import ast
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter, build_sensor_context
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable as RsDeltaTable
from deltalake import QueryBuilder, write_deltalake
from pyspark.sql import SparkSession

from tests.conftest import REPO, SPARK_TEST_CONF
from tests.support.cli import SCRIPT
from tests.support.console import watermark_main as console_main
from tests.support.lakes import (
    appended,
    defs_from,
    location_defs,
    location_path,
    registry_from,
    write_spec,
)
from watermark_dagster.cli.app import main as watermark_main
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.faults import ENV as FAULTS_ENV
from watermark_dagster.core.faults import FAULT_POINTS
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.core.records import (
    Batch,
    BatchKind,
    BatchStatus,
    CheckpointStatus,
    WatermarkHow,
)
from watermark_dagster.dagster_defs.definitions import build_definitions
from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
from watermark_dagster.dagster_defs.names import BATCHES_PARTITIONS_NAME
from watermark_dagster.dagster_defs.resources import SparkSessionResource
from watermark_dagster.dagster_defs.runs import WORKER_TAG
from watermark_dagster.dagster_defs.sensors import COORDINATOR, FINALIZER
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.errors import BatchStateError, WatermarkError
from watermark_dagster.observe.log import latest_local_version
from watermark_dagster.operations import manual
from watermark_dagster.operations.recompute import recompute_pipeline
from watermark_dagster.store import WatermarkStore
from watermark_dagster.write.targets import write_target

WAIT_SECONDS = 300  # a stuck child fails the test instead of hanging it
RACE_WAIT_SECONDS = 120  # racers are light processes: ready well within this

# ------------------------------------------------------------------ lakes


@dataclass
class Lake:
    """One copy of a small lake: upstreams, targets, control tables and a Dagster home."""

    root: Path
    settings: dict[str, Any] = field(default_factory=dict)
    """Spec keys over the defaults below (``max_attempts``, ``max_deaths``, ...)."""

    @property
    def spec(self) -> dict[str, Any]:
        """The code location (tests.support.lakes spec): two upstreams, a merge and an append
        target.

        ``orders`` has a change feed (updates and deletes reach ``orders_copy`` by merge);
        ``log`` only grows (read APPEND_ONLY, appended to ``log_copy`` with Delta
        transaction ids). Three attempts per batch (a killed run spends none).
        """
        r = self.root
        return {
            **self.settings,
            "control_root": str(r / "control"),
            "max_attempts": self.settings.get("max_attempts", 3),
            "upstreams": [
                {"name": "orders", "path": str(r / "orders")},
                {"name": "log", "path": str(r / "log")},
            ],
            "pipelines": [
                {
                    "name": "orders_copy",
                    "upstreams": ["orders"],
                    "target": str(r / "orders_copy"),
                    "transform": "copy",
                },
                {
                    "name": "log_copy",
                    "upstreams": ["log"],
                    "target": str(r / "log_copy"),
                    "transform": "appended",
                    "write": "append",
                    "keys": [],
                },
            ],
        }

    @property
    def spec_file(self) -> Path:
        return write_spec(self.root / "spec.json", self.spec)

    @property
    def dagster_home(self) -> Path:
        return self.root / "dagster_home"

    @property
    def store(self) -> WatermarkStore:
        return WatermarkStore(self.spec["control_root"])

    def instance(self) -> DagsterInstance:
        return DagsterInstance.from_ref(InstanceRef.from_dir(str(self.dagster_home)))

    def latest(self) -> dict[str, int | None]:
        return {u["name"]: latest_local_version(u["path"]) for u in self.spec["upstreams"]}

    def env(self, **extra: str) -> dict[str, str]:
        """Environment of a child process working on this lake."""
        return {
            **os.environ,
            "PYTHONPATH": location_path(self.spec_file),
            "DAGSTER_HOME": str(self.dagster_home),
            "WATERMARK_HOME": str(self.root),
            **extra,
        }


def _new_lake(root: Path) -> Lake:
    root.mkdir(parents=True)
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    return Lake(root)


def _cycle(lake: Lake, instance: DagsterInstance) -> CycleReport:
    """The normal way forward: sensor ticks and runs until idle, in this process."""
    return HeadlessRunner(defs_from(lake.spec), instance).run_until_idle()


def _rows(ids: Sequence[int], factor: int = 1) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "value": pa.array([factor * i for i in ids], pa.int64()),
        }
    )


def _seed(lake: Lake) -> None:
    """Version 0 of both upstreams (written with delta-rs, which also writes the change
    feed of updates and deletes)."""
    cdf = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(str(lake.root / "orders"), _rows(range(6), 10), configuration=cdf)
    write_deltalake(str(lake.root / "log"), _rows(range(5)))


def _change(lake: Lake) -> None:
    """Batch 2's input: an update, a delete and an insert in orders (v1..v3), two appends
    to log (v1..v2)."""
    orders = str(lake.root / "orders")
    RsDeltaTable(orders).update(predicate="id < 2", updates={"value": "value + 100"})
    RsDeltaTable(orders).delete("id = 3")
    write_deltalake(orders, _rows([6, 7], 10), mode="append")
    write_deltalake(str(lake.root / "log"), _rows([5, 6]), mode="append")
    write_deltalake(str(lake.root / "log"), _rows([7]), mode="append")


# Lake states the cases start from, each a copy of the previous one plus one step:
#   fresh:   both upstreams at version 0, nothing run (batch 1 is the targets' first load)
#   changed: batch 1 (first loads) completed; new commits in both upstreams
#   planned: + batch 2 planned by a coordinator tick (no run)
#   ran:     + batch 2's pipelines ran and materialized (not finalized: its runs leave
#            finalizing to the finalizer sensor, whose crashes the cases test)
TEMPLATES = ("fresh", "changed", "planned", "ran")


@pytest.fixture(scope="module")
def templates(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Lake]:
    base = tmp_path_factory.mktemp("crash_templates")
    made: dict[str, Lake] = {}
    fresh = _new_lake(base / "fresh")
    _seed(fresh)
    made["fresh"] = fresh
    lake = _copy(fresh, base / "changed")
    instance = lake.instance()
    try:
        first = _cycle(lake, instance)
        assert first.completed == ["b000001"], first
        assert not first.failed_runs, first
    finally:
        instance.dispose()
    _change(lake)
    made["changed"] = lake
    for name in TEMPLATES[2:]:
        lake = _copy(made[TEMPLATES[TEMPLATES.index(name) - 1]], base / name)
        instance = lake.instance()
        try:
            spec = {**lake.spec, "finalize": "sensor"} if name == "ran" else lake.spec
            runner = HeadlessRunner(defs_from(spec), instance)
            requested = runner.tick(COORDINATOR)
            if name == "ran":
                report = CycleReport()
                runner.execute_requests(requested, report)
                assert [r.success for r in report.runs] == [True], report
        finally:
            instance.dispose()
        made[name] = lake
    return made


def _copy(lake: Lake, root: Path) -> Lake:
    """A copy of a lake under ``root`` (Delta logs hold relative paths; the spec is rebuilt)."""
    shutil.copytree(lake.root, root)
    return Lake(root)


# ------------------------------------------------------------------ checks


def _target_rows(path: str, columns: Sequence[str]) -> Counter:
    """The target's rows (read with delta-rs's query engine, which applies deletion
    vectors), counted."""
    rows = QueryBuilder().register("t", RsDeltaTable(path)).execute("SELECT * FROM t").read_all()
    table = pa.table(rows)
    extra = {c for c in table.column_names if not c.startswith("_wm_")} - set(columns)
    assert not extra, f"{path} has columns the recompute lacks: {sorted(extra)}"
    return Counter(tuple(r.values()) for r in table.select(list(columns)).to_pylist())


def _assert_targets_exact(spark: SparkSession, lake: Lake) -> None:
    """Every target equals its pipeline recomputed from the upstreams at their committed
    versions (rows counted, so a row applied twice is caught); the committed versions are
    the upstreams' latest."""
    committed = lake.store.committed_versions()
    assert committed == lake.latest()
    registry = registry_from(lake.spec)
    versions = {u: v for u, v in committed.items() if v is not None}
    for name, pipeline in registry.pipelines.items():
        expected = recompute_pipeline(spark, registry, name, versions)
        want = Counter(tuple(r) for r in expected.collect())
        assert _target_rows(pipeline.target, expected.columns) == want, name


def _ranges(batch: Batch) -> dict[str, str]:
    return {u: f"{i.mode.value} {i.range}" for u, i in batch.inputs.items()}


def _watermark_changes(store: WatermarkStore) -> list[tuple[str, str | None, str]]:
    """Every change ever committed to ``committed_watermarks``, from its Delta log:
    ``(event, batch_id, upstream)`` with the history event that must record it."""
    uri = store.uri("committed_watermarks")
    last = RsDeltaTable(uri).version()
    seen: dict[str, Any] = {}
    changes = []
    event = {"AUTO": "WATERMARK_ADVANCED", "MANUAL_SET": "WATERMARK_SET"}
    event |= {"RESET": "WATERMARK_RESET", "START_FROM": "WATERMARK_STARTED"}
    for version in range(1, last + 1):
        rows = RsDeltaTable(uri, version=version).to_pyarrow_table().to_pylist()
        for row in rows:
            if seen.get(row["upstream"]) != row["updated_at"]:
                seen[row["upstream"]] = row["updated_at"]
                changes.append((event[row["how"]], row["batch_id"], row["upstream"]))
    return changes


AUDITED = frozenset(
    {
        "BATCH_PLANNED",
        "BATCH_COMPLETED",
        "BATCH_ABANDONED",
        "BATCH_FAILED",
        "WATERMARK_ADVANCED",
        "WATERMARK_SET",
        "WATERMARK_RESET",
        "WATERMARK_STARTED",
    }
)


def _history_gaps(lake: Lake, *, pipelines_ran: bool = True) -> tuple[Counter, Counter]:
    """``(missing, extra)`` history rows, against what the control tables say happened:
    each batch planned once and completed or abandoned once, each watermark change (from
    the Delta log of ``committed_watermarks``) recorded once, and (when pipelines ran) each
    pipeline of a completed batch recorded as succeeded."""
    store = lake.store
    rows = store.history()
    # A replay batch's plan row names its upstream; its other rows none.
    replays = {b.batch_id for b in store.batches() if b.kind is BatchKind.REPLAY}
    have = Counter(
        (h["event"], h["batch_id"], None if h["batch_id"] in replays else h["upstream"])
        for h in rows
        if h["event"] in AUDITED
    )
    want: Counter = Counter(_watermark_changes(store))
    for batch in store.batches():
        want[("BATCH_PLANNED", batch.batch_id, None)] += 1
        if batch.status is not BatchStatus.PLANNED:
            want[(f"BATCH_{batch.status.value}", batch.batch_id, None)] += 1
    missing = want - have
    if pipelines_ran:
        succeeded = {
            (h["batch_id"], h["pipeline"]) for h in rows if h["event"] == "PIPELINE_SUCCEEDED"
        }
        for batch in store.batches():
            if batch.status is BatchStatus.COMPLETED:
                for p in batch.pipelines:
                    if (batch.batch_id, p) not in succeeded:
                        missing[("PIPELINE_SUCCEEDED", batch.batch_id, p)] += 1
    return missing, have - want


# ------------------------------------------------------------------ the crash harness


@dataclass(frozen=True)
class Scenario:
    """How a point is reached and what the lake looks like once recovered.

    Attributes:
        template: the lake state the case starts from (see TEMPLATES).
        child: ``cycle`` (a headless cycle: plan, run, finalize) or ``reset`` (the
            `watermark reset -t orders --force --yes` command, re-run to recover).
        at_kill: checks the state the kill left, to show the process died at the point.
    """

    template: str
    child: str
    at_kill: Callable[[Lake, DagsterInstance], None]


def _planned_without_partition(lake: Lake, instance: DagsterInstance) -> None:
    batch = lake.store.open_batch()
    assert batch is not None
    assert batch.batch_id == "b000002"
    assert not instance.has_dynamic_partition(BATCHES_PARTITIONS_NAME, "b000002")


def _created_without_rows(lake: Lake, instance: DagsterInstance) -> None:
    # The first load created the empty clustered target, in a commit of its own, and died.
    assert lake.store.open_batch() is not None
    created = RsDeltaTable(str(lake.root / "orders_copy"))
    assert created.version() == 0
    assert not created.file_uris()
    [commit] = created.history(1)
    assert str(commit["userMetadata"]).startswith("watermark-preparing ")


def _run_started_without_checkpoint(lake: Lake, instance: DagsterInstance) -> None:
    assert lake.store.open_batch() is not None
    assert not lake.store.checkpoints(batch_id="b000002")
    [run] = instance.get_runs(RunsFilter(tags={"dagster/partition": "b000002"}))
    assert run.status is DagsterRunStatus.STARTED  # killed: nobody marked it


def _one_checkpoint(status: CheckpointStatus) -> Callable[[Lake, DagsterInstance], None]:
    def check(lake: Lake, instance: DagsterInstance) -> None:
        [checkpoint] = lake.store.checkpoints(batch_id="b000002")
        assert checkpoint.status is status
        assert lake.store.committed_versions() == {"orders": 0, "log": 0}

    return check


def _advanced_unrecorded(lake: Lake, instance: DagsterInstance) -> None:
    # The finalizer moves every ready upstream in one commit: both moved, no history row
    # yet, the batch's rows unmarked.
    assert lake.store.committed_versions() == lake.latest()
    history = lake.store.history(batch_id="b000002")
    assert not [h for h in history if h["event"] == "WATERMARK_ADVANCED"]
    batch = lake.store.open_batch()
    assert batch is not None
    assert batch.advanced == frozenset()


def _one_advanced_unrecorded(lake: Lake, instance: DagsterInstance) -> None:
    # The run of batch 2 finalized after its first pipeline: that pipeline's upstream
    # moved, with no history row yet; the other waits for its pipeline.
    latest = lake.latest()
    moved = {u for u, v in lake.store.committed_versions().items() if v == latest[u]}
    assert len(moved) == 1, lake.store.committed_versions()
    assert not [
        h for h in lake.store.history(batch_id="b000002") if h["event"] == "WATERMARK_ADVANCED"
    ]
    batch = lake.store.open_batch()
    assert batch is not None
    assert batch.advanced == frozenset()


def _all_advanced_still_open(lake: Lake, instance: DagsterInstance) -> None:
    assert lake.store.committed_versions() == lake.latest()
    batch = lake.store.open_batch()
    assert batch is not None
    assert batch.advanced == {"orders", "log"}


def _replay_recorded_not_run(lake: Lake, instance: DagsterInstance) -> None:
    [replay] = [b for b in lake.store.open_batches() if b.kind is BatchKind.REPLAY]
    assert replay.batch_id == "b000002"
    assert not lake.store.checkpoints(batch_id=replay.batch_id)


def _fenced_not_abandoned(lake: Lake, instance: DagsterInstance) -> None:
    assert lake.store.get_batch("b000002").status is BatchStatus.PLANNED
    assert lake.store.committed_versions()["orders"] == 0
    fenced = {h["pipeline"] for h in lake.store.history() if h["event"] == "TARGET_FENCED"}
    assert fenced == {"orders_copy", "log_copy"}


def _abandoned_not_reset(lake: Lake, instance: DagsterInstance) -> None:
    assert lake.store.get_batch("b000002").status is BatchStatus.ABANDONED
    assert lake.store.committed_versions()["orders"] == 0


def _reset_unrecorded(lake: Lake, instance: DagsterInstance) -> None:
    assert lake.store.get_batch("b000002").status is BatchStatus.ABANDONED
    assert lake.store.committed_versions()["orders"] is None
    # Killed before its history row: the row waits in the watermark row (pending).
    assert not [h for h in lake.store.history() if h["event"] == "WATERMARK_RESET"]
    assert lake.store.committed()["orders"].pending_history is not None


SCENARIOS: dict[str, Scenario] = {
    "after_plan_commit": Scenario(
        "changed",
        "cycle",
        _planned_without_partition,
    ),
    "after_run_start": Scenario("changed", "cycle", _run_started_without_checkpoint),
    "after_target_create": Scenario("fresh", "cycle", _created_without_rows),
    "after_target_commit": Scenario("changed", "cycle", _one_checkpoint(CheckpointStatus.RUNNING)),
    "after_checkpoint": Scenario("changed", "cycle", _one_checkpoint(CheckpointStatus.SUCCESS)),
    "after_watermark_commit": Scenario(
        "ran",
        "cycle",
        _advanced_unrecorded,
    ),
    "before_batch_complete": Scenario("ran", "cycle", _all_advanced_still_open),
    "after_replay_start": Scenario("changed", "replay", _replay_recorded_not_run),
    "after_fence": Scenario("planned", "reset", _fenced_not_abandoned),
    "after_abandon": Scenario("planned", "reset", _abandoned_not_reset),
    "after_manual_watermark_commit": Scenario("planned", "reset", _reset_unrecorded),
}

# The finalizer's points reached in a run's last step (settings.finalize "run"): the run
# is killed while it finalizes its own batch; the finalizer sensor (or the next run)
# finishes it. Case name -> (the point armed, the case).
IN_RUN: dict[str, tuple[str, Scenario]] = {
    "after_watermark_commit:in-run": (
        "after_watermark_commit",
        Scenario("changed", "cycle", _one_advanced_unrecorded),
    ),
    "before_batch_complete:in-run": (
        "before_batch_complete",
        Scenario("changed", "cycle", _all_advanced_still_open),
    ),
}
CASES: dict[str, tuple[str, Scenario]] = {
    **{point: (point, scenario) for point, scenario in SCENARIOS.items()},
    **IN_RUN,
}

# Points whose crash case lives with what they guard (the scenarios here run copy pipelines,
# which never reach them): the module must kill a process there.
TESTED_ELSEWHERE = {
    "after_state_commit": "tests/spark/test_maintain.py",
    "after_warehouse_stage": "tests/spark/test_warehouse.py",
    "before_warehouse_commit": "tests/spark/test_warehouse.py",
}

RESET = ["reset", "-t", "orders", "--force", "--yes", "--reason", "crash test"]
REPLAY = ["replay", "-t", "orders", "--from-version", "0", "--to-version", "0", "--yes"]


def _run_child(lake: Lake, point: str | None, child: str) -> subprocess.CompletedProcess:
    env = lake.env(**({FAULTS_ENV: point} if point else {}))
    if child == "cycle":
        argv = [sys.executable, "-m", "tests.crash.test_crashes", "cycle", str(lake.spec_file)]
    else:
        command = RESET if child == "reset" else REPLAY
        argv = [str(SCRIPT), *command, "--defs", location_defs(lake.spec_file)]
    return subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=WAIT_SECONDS
    )


def test_every_fault_point_is_listed_and_has_a_crash_case() -> None:
    """A fault point added to the code must be listed in FAULT_POINTS (which parametrizes
    the crash test) and have a scenario, or this fails."""
    called: set[str] = set()
    for path in (REPO / "watermark_dagster").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "fault_point":
                [arg] = node.args
                name = arg.value if isinstance(arg, ast.Constant) else None
                assert isinstance(name, str), f"{path}: fault_point needs a literal name"
                called.add(name)
    assert called == set(FAULT_POINTS)
    assert set(SCENARIOS) | set(TESTED_ELSEWHERE) == set(FAULT_POINTS)
    for point, module in TESTED_ELSEWHERE.items():
        assert f'"{point}"' in (REPO / module).read_text(), (point, module)


@pytest.mark.spark
@pytest.mark.parametrize("case", list(CASES))
def test_a_process_killed_at_a_fault_point_recovers_exactly(
    case: str, spark: SparkSession, templates: dict[str, Lake], tmp_path: Path
) -> None:
    """Kill a real process at the case's point (SIGKILL, return code -9), recover by the
    normal means only, and check targets, watermarks, batches and history."""
    point, scenario = CASES[case]
    lake = _copy(templates[scenario.template], tmp_path / "lake")
    instance = lake.instance()
    try:
        killed = _run_child(lake, point, scenario.child)
        # A supervised command (replay) exits 128 + 9 when its worker child is killed.
        died = 128 + signal.SIGKILL if scenario.child == "replay" else -signal.SIGKILL
        assert killed.returncode == died, killed.stdout[-2000:] + killed.stderr[-3000:]
        if scenario.child == "replay":
            assert "the same `watermark replay` run again resumes" in killed.stderr
        scenario.at_kill(lake, instance)
        planned = lake.store.open_batch() or lake.store.get_batch("b000002")

        if scenario.child == "reset":
            again = _run_child(lake, None, "reset")  # the operator runs the command again
            assert again.returncode == 0, again.stdout + again.stderr
            assert lake.store.committed_versions().get("orders") is None
        if scenario.child == "replay":
            again = _run_child(lake, None, "replay")  # the operator runs the command again
            assert again.returncode == 0, again.stdout + again.stderr
            assert "replay batch b000002" in again.stdout, again.stdout  # resumed
        report = _cycle(lake, instance)
        assert not report.failed_runs, report
        assert not report.stuck, report

        batches = sorted(lake.store.batches(), key=lambda b: b.seq)
        assert lake.store.open_batch() is None
        if scenario.template == "fresh":
            # The first loads, resumed and completed once.
            assert [(b.batch_id, b.status) for b in batches] == [("b000001", BatchStatus.COMPLETED)]
        elif scenario.child == "replay":
            # The replay resumed and ended once; the scheduled batch after it as usual.
            assert [(b.batch_id, b.kind, b.status) for b in batches] == [
                ("b000001", BatchKind.SCHEDULED, BatchStatus.COMPLETED),
                ("b000002", BatchKind.REPLAY, BatchStatus.COMPLETED),
                ("b000003", BatchKind.SCHEDULED, BatchStatus.COMPLETED),
            ]
            assert _ranges(batches[2]) == {"orders": "CDF [1, 3]", "log": "APPEND_ONLY [1, 2]"}
        elif scenario.child == "cycle":
            # Resumed, never re-planned: the same plan, completed once.
            assert [(b.batch_id, b.status) for b in batches] == [
                ("b000001", BatchStatus.COMPLETED),
                ("b000002", BatchStatus.COMPLETED),
            ]
            assert batches[1].plan_id == planned.plan_id
            assert _ranges(batches[1]) == {"orders": "CDF [1, 3]", "log": "APPEND_ONLY [1, 2]"}
        else:
            # The open batch abandoned, orders reloaded from a snapshot by the next batch.
            assert [(b.batch_id, b.status) for b in batches] == [
                ("b000001", BatchStatus.COMPLETED),
                ("b000002", BatchStatus.ABANDONED),
                ("b000003", BatchStatus.COMPLETED),
            ]
            assert _ranges(batches[2]) == {"orders": "SNAPSHOT [0, 3]", "log": "APPEND_ONLY [1, 2]"}
            assert batches[2].full_load == ("orders_copy",)
            resets = [h for h in lake.store.history() if h["event"] == "WATERMARK_RESET"]
            assert [(h["old_value"], h["new_value"]) for h in resets] == [("0", None)]
        _assert_targets_exact(spark, lake)
        # One data commit per batch in each target: a retry after a committed write (a
        # MERGE, or an append Delta's transaction id skips) never commits it again.
        for target in ("orders_copy", "log_copy"):
            history = RsDeltaTable(str(lake.root / target)).history()
            labels = [str(c.get("userMetadata") or "") for c in history]
            writes = Counter(m.split(" seq=")[0] for m in labels if m.startswith("watermark "))
            assert set(writes.values()) == {1}, (target, writes)

        missing, extra = _history_gaps(lake)
        assert not extra, f"history rows recorded twice: {extra}"
        assert not missing, f"history rows lost: {missing}"
    finally:
        instance.dispose()


# ------------------------------------------------------------------ deaths


def _watermark(lake: Lake, *argv: str, faults: str | None = None) -> subprocess.CompletedProcess:
    """``watermark ARGV`` on the lake's code location: as a process (its supervised child
    dies at ``faults``) when ``faults`` is given, else in this process (a command that
    starts no JVM, :mod:`tests.support.console`)."""
    env = lake.env(**({FAULTS_ENV: faults} if faults else {}))
    if not faults:
        return console_main([*argv, "--defs", location_defs(lake.spec_file)], env)
    return subprocess.run(
        [str(SCRIPT), *argv, "--defs", location_defs(lake.spec_file)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS,
    )


def _deaths_in_history(lake: Lake, batch_id: str) -> list[str]:
    rows = sorted(lake.store.history(batch_id=batch_id), key=lambda h: h["at"])
    return [json.loads(h["detail"])["how"] for h in rows if h["event"] == "RUN_DIED"]


@pytest.mark.spark
def test_runs_killed_more_often_than_max_attempts_are_crashes_not_failures(
    spark: SparkSession, templates: dict[str, Lake], tmp_path: Path
) -> None:
    """Every `watermark run` process killed (SIGKILL) as its run starts, max_attempts=1 and
    max_deaths=3. Batch 2: two kills leave it open and not stuck, and the next plain run
    completes it. Batch 3: three kills stop it, stuck, with a reason that names the deaths
    and the fix on every surface; `watermark run --retry` completes it and goes on to batch
    4. Each death is in history once, with its signal; the targets equal a recompute."""
    copied = _copy(templates["changed"], tmp_path / "lake")
    # A backoff of 3 s after the first death, 6 s after the second: the batch is run again
    # once it has passed.
    lake = Lake(copied.root, {"max_attempts": 1, "max_deaths": 3, "death_backoff_seconds": 3})
    instance = lake.instance()
    kill = "after_run_start@orders_copy"
    try:
        for death in range(2):
            killed = _watermark(lake, "run", faults=kill)
            assert killed.returncode == 128 + signal.SIGKILL, killed.stderr[-3000:]
            assert "its process was killed by SIGKILL (signal 9)" in killed.stderr
            if not death:
                listed = json.loads(_watermark(lake, "list", "--json").stdout)
                assert {r["upstream"]: r["state"] for r in listed} == {"orders": "ok", "log": "ok"}
        # Two deaths, max_attempts=1: not stuck. The next plain run waits out the backoff
        # after the second death (it began moments ago), then completes the batch.
        lines: list[str] = []
        report = HeadlessRunner(defs_from(lake.spec), instance, log=lines.append).run_until_idle()
        assert (report.completed, report.failed_runs, report.stuck) == (["b000002"], [], None)
        [waited] = [line for line in lines if "(backoff): waiting" in line]
        assert "killed by SIGKILL (signal 9) (death 2 of at most 3)" in waited
        assert _deaths_in_history(lake, "b000002") == ["killed by SIGKILL (signal 9)"] * 2
        _assert_targets_exact(spark, lake)

        # Batch 3 always dies (no backoff from here on: it was shown above).
        lake.settings["death_backoff_seconds"] = 0
        write_deltalake(str(lake.root / "orders"), _rows([8, 9], 10), mode="append")
        for _ in range(3):
            killed = _watermark(lake, "run", faults=kill)
            assert killed.returncode == 128 + signal.SIGKILL, killed.stderr[-3000:]
        refused = _watermark(lake, "run")  # no run, no JVM: the batch is stuck
        assert refused.returncode == 1, refused.stdout + refused.stderr[-3000:]
        assert "its runs died 3 times (max_deaths=3)" in refused.stdout + refused.stderr
        rows = json.loads(_watermark(lake, "list", "--json").stdout)
        [orders] = [r for r in rows if r["upstream"] == "orders"]
        assert orders["state"] == "stuck"
        assert "its runs died 3 times" in orders["stuck"]["reason"]
        assert "killed by SIGKILL (signal 9)" in orders["stuck"]["reason"]
        assert "spark.driver.memory" in orders["fix"]
        shown = json.loads(_watermark(lake, "batch", "b000003", "--json").stdout)
        assert shown["status"] == "STUCK"
        assert len(shown["stuck"]["deaths"]) == 3
        assert _deaths_in_history(lake, "b000003") == ["killed by SIGKILL (signal 9)"] * 3

        # The operator gave the driver more memory; commits keep arriving meanwhile.
        write_deltalake(str(lake.root / "log"), _rows([8]), mode="append")
        retried = HeadlessRunner(defs_from(lake.spec), instance).run_until_idle(retry=True)
        assert (retried.completed, retried.failed_runs, retried.stuck) == (
            ["b000003", "b000004"],
            [],
            None,
        )
        _assert_targets_exact(spark, lake)
        missing, extra = _history_gaps(lake)
        assert not missing, missing
        assert not extra, extra
    finally:
        instance.dispose()


# ------------------------------------------------------------------ races


def _small_lake(root: Path) -> Lake:
    """A lake with delta-rs upstreams and no Spark: pipelines never run in the race tests;
    their checkpoints are recorded through the store as a run would."""
    lake = _new_lake(root)
    for upstream in lake.spec["upstreams"]:
        for ids in ([0, 1], [2], [3]):  # versions 0..2
            _commit(upstream["path"], ids)
    for pipeline in lake.spec["pipelines"]:  # targets exist: no first-load bootstrap
        _commit(pipeline["target"], [0])
    return lake


def _commit(path: str, ids: list[int]) -> None:
    write_deltalake(path, _rows(ids), mode="append")


def _plan_and_succeed(lake: Lake, instance: DagsterInstance, ids: list[int] | None) -> Batch:
    """A new commit of ``ids`` in every upstream; a coordinator tick plans a batch; each of
    its pipelines records a SUCCESS checkpoint for it through the store, as its run does
    after the target commit (the checkpoint is what the finalizer counts; no Spark here)."""
    for upstream in lake.spec["upstreams"]:
        if ids is not None:
            _commit(upstream["path"], ids)
    HeadlessRunner(defs_from(lake.spec), instance).tick(COORDINATOR)
    batch = lake.store.open_batch()
    assert batch is not None
    for pipeline in batch.pipelines:
        attempt = lake.store.begin_checkpoint(pipeline, batch.batch_id, run_id=None)
        lake.store.finish_checkpoint(
            pipeline, batch.batch_id, attempt, CheckpointStatus.SUCCESS, rows_read=0
        )
    return batch


def _auto_moves(store: WatermarkStore) -> list[tuple[str, int | None, int | None]]:
    """``(upstream, old, new)`` of every automatic watermark move, from the Delta log."""
    uri = store.uri("committed_watermarks")
    before: dict[str, Any] = {}
    moves = []
    for version in range(1, RsDeltaTable(uri).version() + 1):
        for row in RsDeltaTable(uri, version=version).to_pyarrow_table().to_pylist():
            old = before.get(row["upstream"], ("-", None))
            if old[0] != row["updated_at"] and row["how"] == "AUTO":
                moves.append((row["upstream"], old[1], row["committed_version"]))
            before[row["upstream"]] = (row["updated_at"], row["committed_version"])
    return moves


def _ticks_at_once(defs: Any, instance: DagsterInstance, sensor: str, n: int) -> list:
    """Evaluate ``n`` ticks of a real sensor in threads released together; their errors."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def tick() -> None:
        try:
            barrier.wait()
            with build_sensor_context(
                instance_ref=instance.get_ref(),
                definitions=defs,
                sensor_name=sensor,
                resources=dict(defs.resources or {}),
            ) as context:
                defs.resolve_sensor_def(sensor).evaluate_tick(context)
        except BaseException as e:  # surfaced by the caller
            errors.append(e)

    threads = [threading.Thread(target=tick) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_two_finalizer_ticks_at_once_advance_each_watermark_once(tmp_path: Path) -> None:
    lake = _small_lake(tmp_path / "lake")
    defs = defs_from(lake.spec)
    instance = lake.instance()
    store = lake.store
    try:
        for round_ in range(3):
            batch = _plan_and_succeed(lake, instance, [10 + round_] if round_ else None)
            errors = _ticks_at_once(defs, instance, FINALIZER, 2)
            assert not errors, errors
            assert store.get_batch(batch.batch_id).status is BatchStatus.COMPLETED
            rows = store.history(batch_id=batch.batch_id)
            advanced = Counter(h["upstream"] for h in rows if h["event"] == "WATERMARK_ADVANCED")
            assert advanced == {u: 1 for u in batch.ranged_upstreams}
            assert [h["event"] for h in rows].count("BATCH_COMPLETED") == 1
        # Each upstream moved once per batch, each move from where the last one ended.
        assert store.committed_versions() == lake.latest() == {"orders": 4, "log": 4}
        for upstream in ("orders", "log"):
            moves = [(old, new) for u, old, new in _auto_moves(store) if u == upstream]
            assert moves == [(None, 2), (2, 3), (3, 4)]
        missing, extra = _history_gaps(lake, pipelines_ran=False)
        assert not missing, (missing, extra)
        assert not extra, (missing, extra)
    finally:
        instance.dispose()


@contextlib.contextmanager
def _children(argvs: Sequence[Sequence[str]], env: dict[str, str], logs: Path) -> Iterator[None]:
    """Run ``python -m tests.crash.test_crashes ARGV`` children for the block: killed if the block
    fails (they would wait for rounds that never come), else awaited and checked."""
    logs.mkdir(exist_ok=True)
    procs = []
    for n, argv in enumerate(argvs):
        with open(logs / f"child-{n}.log", "w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.crash.test_crashes", *argv],
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        yield
    except BaseException:
        for proc in procs:
            proc.kill()
            proc.wait()
        raise
    for n, proc in enumerate(procs):
        code = proc.wait(timeout=WAIT_SECONDS)
        assert code == 0, (logs / f"child-{n}.log").read_text()[-3000:]


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + RACE_WAIT_SECONDS
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.002)


def _release(sync: Path, round_: int, racers: Sequence[str]) -> list[dict[str, Any]]:
    """Start a round once every racer is ready; return their results."""
    for name in racers:
        _wait_for(sync / f"ready-{round_}-{name}")
    (sync / f"go-{round_}").touch()
    results = []
    for name in racers:
        path = sync / f"result-{round_}-{name}"
        _wait_for(path)
        results.append(json.loads(path.read_text()))
    return results


def _racer(sync: Path, name: str, rounds: int, act: Callable[[int], dict[str, Any]]) -> None:
    """A child's side of :func:`_release`: wait for each round's start, act, report."""
    for round_ in range(rounds):
        (sync / f"ready-{round_}-{name}").touch()
        _wait_for(sync / f"go-{round_}")
        result = act(round_)
        tmp = sync / f".result-{round_}-{name}"
        tmp.write_text(json.dumps(result))
        tmp.rename(sync / f"result-{round_}-{name}")


# `watermark set`/`reset` racing the finalizer, one command per round: moves back (re-read
# a version), a reset, a move forward to the latest version.
MANUAL_ROUNDS = [
    ["set", "-t", "orders", "--version", "1"],
    ["reset", "-t", "log"],
    ["set", "-t", "orders", "--version", "latest"],
]


def test_a_finalizer_racing_watermark_set_and_reset(tmp_path: Path) -> None:
    """A finalizer process and a `watermark set/reset --force` process released together,
    once per command of MANUAL_ROUNDS, on a batch whose pipelines all succeeded.

    Allowed: the batch completes (every upstream advanced) and the command then moves the
    watermark from its end; or the command abandons the batch, after the upstreams whose
    pipelines all succeeded were advanced. Always: the batch ends once, no automatic move
    backwards, the manual value stands, no history row lost or doubled.
    """
    lake = _small_lake(tmp_path / "lake")
    sync = tmp_path / "sync"
    sync.mkdir()
    instance = lake.instance()
    rounds = len(MANUAL_ROUNDS)
    first = _plan_and_succeed(lake, instance, None)  # batch 1: versions 0..2
    HeadlessRunner(defs_from(lake.spec), instance).tick(FINALIZER)
    assert lake.store.get_batch(first.batch_id).status is BatchStatus.COMPLETED
    args = [
        [
            *command,
            "--force",
            "--yes",
            "--reason",
            "race",
            "--defs",
            location_defs(lake.spec_file),
            "--json",
        ]
        for command in MANUAL_ROUNDS
    ]
    racers = [
        ["race-finalizer", str(lake.spec_file), str(sync), str(rounds)],
        ["race-cli", str(sync), json.dumps(args)],
    ]
    try:
        with _children(racers, lake.env(), tmp_path / "logs"):
            both = _race_rounds(lake, instance, sync)
    finally:
        instance.dispose()
    assert not both, "a batch ended twice: " + "; ".join(both)


def _race_rounds(lake: Lake, instance: DagsterInstance, sync: Path) -> list[str]:
    """Each round: a batch ready to finalize, then the finalizer and one manual command
    released at the same moment; then the outcome must be one of the allowed ones.

    Returns:
        the rounds where a batch was both abandoned by the command and advanced (or
        completed) by the finalizer: the known race, reported by the caller.
    """
    store = lake.store
    both: list[str] = []
    raced: set[str] = set()  # batches of the known race: their end rows are reported there
    for round_, command in enumerate(MANUAL_ROUNDS):
        batch = _plan_and_succeed(lake, instance, [100 + round_])
        upstream = command[2]
        finalizer, cli = _release(sync, round_, ["finalizer", "cli"])
        # The finalizer finished, or refused loudly because the watermark moved under it.
        assert finalizer["ok"] or finalizer["error_type"] in {
            "WatermarkGapError",
            "WatermarkRegressionError",
            "BatchStateError",
        }, finalizer
        # The command applied its change, or refused because the batch moved while it
        # was being confirmed (nothing written then).
        assert cli["code"] == 0 or "moved while" in cli["error"], cli
        assert store.open_batch() is None
        done = store.get_batch(batch.batch_id)
        events = store.history(batch_id=batch.batch_id)
        advanced = {h["upstream"] for h in events if h["event"] == "WATERMARK_ADVANCED"}
        ends = [h["event"] for h in events if h["event"] in ("BATCH_COMPLETED", "BATCH_ABANDONED")]
        applied = cli["code"] == 0 and json.loads(cli["output"])["applied"]
        standing = store.committed_versions()[upstream]
        if len(ends) > 1:
            raced.add(batch.batch_id)
            both.append(
                f"round {round_} `watermark {' '.join(command)} --force`: {batch.batch_id} "
                f"ended {done.status.value} after {ends}, finalizer advanced {sorted(advanced)} "
                f"({'ok' if finalizer['ok'] else finalizer['error_type']}); {upstream} now "
                f"{standing}, the command set {json.loads(cli['output'])['new']}"
            )
            continue
        # Completed before the command (which then moved the watermark from the batch's
        # end), or abandoned by the command: upstreams whose pipelines all succeeded may
        # have been advanced first (by the finalizer, or by the command itself, so their
        # applied changes are not read again), the rest not.
        assert ends == [f"BATCH_{done.status.value}"], (ends, done)
        if done.status is BatchStatus.COMPLETED:
            assert advanced == set(batch.ranged_upstreams), (done, events)
        else:
            assert done.status is BatchStatus.ABANDONED, (done, cli)
            assert applied, (done, cli)
        if applied:  # the audited move stands: nothing advanced the upstream past it
            assert standing == json.loads(cli["output"])["new"]
    # No regression but the audited manual moves: every automatic move goes forward.
    for _, old, new in _auto_moves(store):
        assert new is not None
        assert old is None or new > old
    missing, extra = _history_gaps(lake, pipelines_ran=False)
    extra = Counter({k: n for k, n in extra.items() if k[1] not in raced})
    assert not missing, (missing, extra)
    assert not extra, (missing, extra)
    return both


def _second_batch(store: WatermarkStore) -> Batch:
    """Batch 1 (versions 0..2) completed; batch 2 (versions 3..4) open."""
    pipelines = {"orders_copy": ["orders"], "log_copy": ["log"]}
    batch = None
    for latest in (2, 4):
        at = [UpstreamPosition("orders", latest, None), UpstreamPosition("log", latest, None)]
        batch, created = store.create_batch(at, pipelines, actor="coordinator")
        assert created
        assert batch is not None
        if latest == 2:
            for upstream in batch.ranged_upstreams:
                store.advance(batch, upstream, actor="finalizer")
            store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="finalizer")
    assert batch is not None
    return batch


def test_an_abandoned_batch_advances_nothing_afterwards(tmp_path: Path) -> None:
    """The interleaving the process race hits, step by step: the finalizer reads the open
    batch, `watermark set -t orders --version 1 --force` abandons it and moves orders, then
    the finalizer goes on with the batch it read."""
    store = WatermarkStore(tmp_path)
    batch = _second_batch(store)  # what the finalizer read
    store.set_watermark("orders", 1, how=WatermarkHow.MANUAL_SET, actor="operator", force=True)
    with contextlib.suppress(WatermarkError):  # refusing loudly is fine
        for upstream in batch.ranged_upstreams:
            store.advance(batch, upstream, actor="finalizer")
        store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="finalizer")
    assert store.get_batch(batch.batch_id).status is BatchStatus.ABANDONED
    assert store.committed_versions() == {"orders": 1, "log": 2}


@pytest.mark.parametrize(
    ("first", "then"),
    [
        (BatchStatus.COMPLETED, BatchStatus.ABANDONED),
        (BatchStatus.ABANDONED, BatchStatus.COMPLETED),
    ],
    ids=["completed-then-abandoned", "abandoned-then-completed"],
)
def test_a_batch_ends_once(tmp_path: Path, first: BatchStatus, then: BatchStatus) -> None:
    store = WatermarkStore(tmp_path)
    batch = _second_batch(store)
    for upstream in batch.ranged_upstreams:
        store.advance(batch, upstream, actor="finalizer")
    store.set_batch_status(batch.batch_id, first, actor="one")
    with contextlib.suppress(WatermarkError):
        store.set_batch_status(batch.batch_id, then, actor="other")
    assert store.get_batch(batch.batch_id).status is first
    ends = [h["event"] for h in store.history(batch_id=batch.batch_id)]
    assert ends.count("BATCH_COMPLETED") + ends.count("BATCH_ABANDONED") == 1, ends


@pytest.mark.spark
def test_force_abandoning_a_batch_that_ran_applies_each_change_once(
    spark: SparkSession, templates: dict[str, Lake], tmp_path: Path
) -> None:
    """Batch 2's pipelines succeeded (log_copy appended log's versions 1..2) but it is not
    finalized yet when `watermark reset -t orders --force` abandons it."""
    lake = _copy(templates["ran"], tmp_path / "lake")
    instance = lake.instance()
    try:
        reset = _run_child(lake, None, "reset")
        assert reset.returncode == 0, reset.stdout + reset.stderr
        report = _cycle(lake, instance)
        assert report.completed == ["b000003"], report
        assert not report.failed_runs, report
        _assert_targets_exact(spark, lake)  # log_copy holds log's rows 5..7 twice
    finally:
        instance.dispose()


@pytest.mark.spark
def test_a_forced_change_does_not_take_a_created_empty_target_for_the_first_load(
    spark: SparkSession, templates: dict[str, Lake], tmp_path: Path
) -> None:
    """A first load is killed after it created the empty target (a preparatory commit
    labelled with the batch) and before its rows. An operator sets the other upstream's
    watermark with --force, which abandons the batch: the creation is no evidence of the load, so
    ``orders_copy`` is not recorded as succeeded, ``orders`` does not advance, and the next
    batch loads orders into it (before, the snapshot never reached the target)."""
    lake = _copy(templates["fresh"], tmp_path / "lake")
    instance = lake.instance()
    try:
        killed = _run_child(lake, "after_target_create@orders_copy", "cycle")
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
        # log_copy loaded log's version 0 before the kill: say so, forcing past the batch.
        reset = _watermark(lake, "set", "-t", "log", "--version", "0", "--force", "--yes")
        assert reset.returncode == 0, reset.stdout + reset.stderr
        assert "orders_copy: its target already holds the batch" not in reset.stdout
        assert not [h for h in lake.store.history() if h["event"] == "PIPELINE_RECOVERED"]
        assert lake.store.committed_versions().get("orders") is None
        report = _cycle(lake, instance)
        assert not report.failed_runs, report
        assert lake.store.get_batch(report.completed[-1]).inputs["orders"].mode.value == (
            "SNAPSHOT"
        )
        _assert_targets_exact(spark, lake)  # orders_copy was left empty
    finally:
        instance.dispose()


@pytest.mark.spark
def test_a_run_whose_batch_a_forced_change_abandons_meanwhile_writes_nothing(
    spark: SparkSession, templates: dict[str, Lake], tmp_path: Path
) -> None:
    """While ``log_copy``'s run reads its range, its batch is abandoned (a forced change
    that could not stop the run: without fencing). The run re-reads its batch before it
    writes and stops: before, it appended and recorded success, and the next batch
    appended the same rows again."""
    lake = _copy(templates["changed"], tmp_path / "lake")
    instance = lake.instance()
    forced: list[str] = []
    append = appended("log")

    def abandon_then_append(batch: Any) -> Any:
        if not forced:
            store = lake.store
            registry = registry_from(lake.spec)
            preview = manual.preview_change(store, registry, "orders", None, force=True)
            done = manual.apply_change(store, registry, preview, reason="test", force=True)
            forced.extend(done.change.abandoned)
        return append(batch)

    registry = registry_from(lake.spec)
    pipelines = [
        replace(p, transform=abandon_then_append) if p.name == "log_copy" else p
        for p in registry.pipelines.values()
    ]
    defs = build_definitions(
        Registry(upstreams=list(registry.upstreams.values()), pipelines=pipelines),
        control_root=lake.spec["control_root"],
        spark=SparkSessionResource(master="local[2]", conf=SPARK_TEST_CONF),
        settings=WatermarkSettings(min_batch_interval_seconds=0, death_backoff_seconds=0),
    )
    try:
        report = HeadlessRunner(defs, instance).run_until_idle()
        assert forced == ["b000002"]
        assert lake.store.get_batch("b000002").status is BatchStatus.ABANDONED
        assert lake.store.open_batch() is None
        assert "b000003" in report.completed, report
        _assert_targets_exact(spark, lake)  # log_copy held log's rows 5..7 twice
        errors = " ".join(r.error or "" for r in report.failed_runs)
        assert "b000002 was abandoned by a forced change while pipeline 'log_copy'" in errors
    finally:
        instance.dispose()


def _held_cycle(lake: Lake, release: Path) -> subprocess.Popen:
    """A cycle child whose ``log_copy`` run holds (in flight) until ``release`` exists."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.crash.test_crashes", "cycle", str(lake.spec_file)],
        cwd=REPO,
        env=lake.env(**{HOLD_ENV: f"log_copy:{release}"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = Path(str(release) + ".started")
    deadline = time.monotonic() + WAIT_SECONDS
    while not started.exists():
        assert child.poll() is None, child.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the held run never started"
        time.sleep(0.2)
    return child


@pytest.mark.spark
def test_a_forced_change_stops_the_batch_run_in_flight_or_refuses(
    spark: SparkSession, templates: dict[str, Lake], tmp_path: Path
) -> None:
    """``log_copy``'s run of batch 2 is in flight in another process when an operator runs
    `watermark reset -t orders --force`. While the run cannot be stopped (its worker on
    another host, as far as this one can tell), the command waits ``--wait`` seconds and
    refuses, naming the run, and changes nothing. Then the command stops the run through
    Dagster (SIGTERM to its local worker, the run's step process), waits for it to end,
    fences the targets and abandons the batch; the cycle goes on with batch 3, which
    applies every change once. Before, `--force` abandoned the batch under the running
    run."""
    lake = _copy(templates["changed"], tmp_path / "lake")
    instance = lake.instance()
    release = tmp_path / "release"
    child = _held_cycle(lake, release)
    try:
        [run] = [
            r
            for r in instance.get_runs(RunsFilter(tags={"dagster/partition": "b000002"}))
            if r.status is DagsterRunStatus.STARTED
        ]
        worker = run.tags[WORKER_TAG]
        instance.add_run_tags(run.run_id, {WORKER_TAG: "elsewhere:1:-"})
        refused = _watermark(lake, *RESET, "--wait", "1")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"run {run.run_id}" in refused.stderr, refused.stderr
        assert "--wait SECONDS" in refused.stderr, refused.stderr
        assert lake.store.get_batch("b000002").status is BatchStatus.PLANNED
        assert lake.store.committed_versions()["orders"] == 0
        assert child.poll() is None  # still held

        instance.add_run_tags(run.run_id, {WORKER_TAG: worker})
        reset = subprocess.run(
            [str(SCRIPT), *RESET, "--wait", "60", "--defs", location_defs(lake.spec_file)],
            cwd=REPO,
            env=lake.env(),
            capture_output=True,
            text=True,
            timeout=WAIT_SECONDS,
        )
        assert reset.returncode == 0, reset.stdout + reset.stderr
        assert re.search(r"stopped first: \d run\(s\)", reset.stdout), reset.stdout
        assert "fenced: log_copy" in reset.stdout, reset.stdout
        stopped = instance.get_run_by_id(run.run_id)
        assert stopped is not None
        assert stopped.status in (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE)
        assert lake.store.get_batch("b000002").status is BatchStatus.ABANDONED
        fences = [h for h in lake.store.history() if h["event"] == "TARGET_FENCED"]
        assert "log_copy" in {h["pipeline"] for h in fences}, fences

        # The child's cycle stops with its interrupted run, cleanly, saying why; the next
        # cycle here completes what is left.
        out, _ = child.communicate(timeout=WAIT_SECONDS)
        assert child.returncode == 0, out[-3000:]
        last = json.loads(out.strip().splitlines()[-1])
        assert "was stopped from outside" in (last["stopped"] or ""), out[-3000:]
        report = _cycle(lake, instance)
        assert not report.failed_runs, report
        assert lake.store.get_batch("b000003").status is BatchStatus.COMPLETED
        assert lake.store.open_batch() is None
        _assert_targets_exact(spark, lake)
    finally:
        release.touch()
        if child.poll() is None:
            child.kill()
        child.wait()
        instance.dispose()


@pytest.mark.spark
def test_a_write_that_slipped_past_its_check_lands_nothing_after_a_forced_change(
    spark: SparkSession, templates: dict[str, Lake], tmp_path: Path
) -> None:
    """The zombie a check cannot stop: batch 2 is abandoned by `watermark reset --force`
    (its targets fenced) and then a run of it, which passed its own check before the
    abandon, commits to each target: an append (Delta transaction) and a merge (Delta's
    idempotent MERGE). Delta skips both and the write fails naming the fence; the targets
    are as the fence left them, and the next batch applies every change once. Before, the
    append landed and the next batch appended the same rows again."""
    lake = _copy(templates["planned"], tmp_path / "lake")
    instance = lake.instance()
    try:
        batch = lake.store.get_batch("b000002")
        reset = _watermark(lake, *RESET)
        assert reset.returncode == 0, reset.stdout + reset.stderr
        fenced = {h["pipeline"] for h in lake.store.history() if h["event"] == "TARGET_FENCED"}
        assert fenced == {"orders_copy", "log_copy"}
        registry = registry_from(lake.spec)
        late = spark.createDataFrame([(100, 1000, 0)], "id long, value long, bucket long")
        for name in ("orders_copy", "log_copy"):
            pipeline = registry.pipelines[name]
            before = RsDeltaTable(pipeline.target).version()
            output = late.drop("bucket") if name == "orders_copy" else late
            with pytest.raises(BatchStateError, match="fenced against it"):
                write_target(
                    spark,
                    output,
                    pipeline,
                    batch_id=batch.batch_id,
                    write_seq=batch.write_seq,
                    full_load=False,
                    root=lake.store.root_id(),
                )
            assert RsDeltaTable(pipeline.target).version() == before, name
        report = _cycle(lake, instance)
        assert report.completed == ["b000003"], report
        assert not report.failed_runs, report
        _assert_targets_exact(spark, lake)
    finally:
        instance.dispose()


@pytest.mark.spark
@pytest.mark.parametrize(
    ("pipeline", "reads", "forced"),
    [("log_copy", "log", "orders"), ("orders_copy", "orders", "log")],
    ids=["append", "merge"],
)
def test_a_forced_change_advances_what_a_killed_run_already_wrote(
    pipeline: str,
    reads: str,
    forced: str,
    spark: SparkSession,
    templates: dict[str, Lake],
    tmp_path: Path,
) -> None:
    """A run is killed right after ``pipeline``'s target commit, before its checkpoint.
    An operator then resets the other upstream with --force, which abandons the batch. The
    target's own record (the append's Delta transaction, the merge's labelled commit)
    shows the batch was applied: the pipeline is recorded as succeeded and ``reads``
    advances before the batch is abandoned, so the next batch does not read that range
    again (an append target would hold it twice, I4)."""
    lake = _copy(templates["changed"], tmp_path / "lake")
    instance = lake.instance()
    try:
        killed = _run_child(lake, f"after_target_commit@{pipeline}", "cycle")
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-3000:]
        states = {c.pipeline: c.status for c in lake.store.checkpoints(batch_id="b000002")}
        assert states[pipeline] is CheckpointStatus.RUNNING
        # The run finalized after each pipeline that succeeded before the kill: its
        # upstream advanced (the other pipeline's, when it ran first), the killed one's not.
        latest = lake.latest()
        assert lake.store.committed_versions() == {
            u: latest[u] if states.get(f"{u}_copy") is CheckpointStatus.SUCCESS else 0
            for u in ("orders", "log")
        }

        reset = _watermark(lake, "reset", "-t", forced, "--force", "--yes")
        assert reset.returncode == 0, reset.stdout + reset.stderr
        assert f"{pipeline}: its target already holds the batch" in reset.stdout, reset.stdout
        assert lake.store.get_batch("b000002").status is BatchStatus.ABANDONED
        assert lake.store.committed_versions()[reads] == lake.latest()[reads]
        [recovered] = [h for h in lake.store.history() if h["event"] == "PIPELINE_RECOVERED"]
        assert recovered["pipeline"] == pipeline
        assert recovered["batch_id"] == "b000002"

        report = _cycle(lake, instance)
        assert report.completed == ["b000003"], report
        assert not report.failed_runs, report
        again = lake.store.get_batch("b000003").inputs.get(reads)
        latest = lake.latest()[reads]
        assert again is None or again.range is None or again.range.start > latest, again
        _assert_targets_exact(spark, lake)  # log_copy would hold log's rows 5..7 twice
    finally:
        instance.dispose()


def test_pipelines_of_one_batch_checkpointing_at_once_from_processes(tmp_path: Path) -> None:
    """Four worker processes record attempts of two pipelines of one batch at the same
    moment, two attempts of each (a resubmitted run racing its twin): every attempt gets its
    own number and its row; no row and no history row is lost."""
    root = tmp_path / "control"
    WatermarkStore(root).ensure_tables()
    sync = tmp_path / "sync"
    sync.mkdir()
    racers = ["p0-a", "p0-b", "p1-a", "p1-b"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with _children([["checkpoint", str(root), str(sync), r] for r in racers], env, tmp_path):
        results = _release(sync, 0, racers)
    store = WatermarkStore(root)
    rows = store.checkpoints(batch_id="b000001")
    assert sorted((c.pipeline, c.attempt) for c in rows) == [
        ("p0", 1),
        ("p0", 2),
        ("p1", 1),
        ("p1", 2),
    ]
    assert sorted(r["attempt"] for r in results) == [1, 1, 2, 2]
    assert all(c.status is CheckpointStatus.SUCCESS and c.rows_written == 1 for c in rows)
    recorded = [(h["pipeline"], h["detail"]) for h in store.history()]
    assert len(recorded) == 4
    assert {p for p, _ in recorded} == {"p0", "p1"}


# ------------------------------------------------------------------ children


HOLD_ENV = "WATERMARK_TEST_HOLD"  # PIPELINE:FILE: its batch 2 waits while FILE is absent


def _held(registry: Registry) -> Registry:
    """The registry with one pipeline's transform held (``HOLD_ENV``): in batch b000002,
    every attempt writes ``FILE.started`` and waits for ``FILE``, a run in flight for as
    long as a test needs."""
    held = os.environ.get(HOLD_ENV)
    if not held:
        return registry
    name, release = held.split(":", 1)
    inner = registry.pipelines[name].transform
    assert inner is not None

    def transform(batch: Any) -> Any:
        if batch.batch_id != "b000002":
            return inner(batch)
        Path(release + ".started").write_text(str(os.getpid()))
        deadline = time.monotonic() + WAIT_SECONDS
        while not Path(release).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        return inner(batch)

    pipelines = [
        replace(p, transform=transform) if p.name == name else p
        for p in registry.pipelines.values()
    ]
    return Registry(upstreams=list(registry.upstreams.values()), pipelines=pipelines)


def _child_cycle(spec_file: str) -> None:
    """A headless cycle on the lake of ``spec_file``, with a one-core Spark session that
    starts only if a run executes here."""
    spec = json.loads(Path(spec_file).read_text())
    defs = build_definitions(
        _held(registry_from(spec)),
        control_root=spec["control_root"],
        spark=SparkSessionResource(master="local[1]", conf=SPARK_TEST_CONF),
        settings=WatermarkSettings(
            min_batch_interval_seconds=0,
            max_attempts=spec.get("max_attempts", 1),
            death_backoff_seconds=0,
        ),
    )
    report = HeadlessRunner(defs, DagsterInstance.get()).run_until_idle()
    print(json.dumps({"stopped": report.stopped, "completed": report.completed}))


def _child_race_finalizer(spec_file: str, sync: str, rounds: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    runner = HeadlessRunner(defs_from(spec), DagsterInstance.get())

    def act(_round: int) -> dict[str, Any]:
        try:
            runner.tick(FINALIZER)
        except Exception as e:  # reported to the parent, which decides what is allowed
            return {"ok": False, "error_type": type(e).__name__, "error": str(e)}
        return {"ok": True}

    _racer(Path(sync), "finalizer", int(rounds), act)


def _child_race_cli(sync: str, commands: str) -> None:
    argvs = json.loads(commands)
    # Verbose: a command that may start Spark writes its problems to sys.stderr, which the
    # round captures, rather than to a stream on the terminal it kept aside.
    os.environ["WATERMARK_VERBOSE"] = "1"

    def act(round_: int) -> dict[str, Any]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = watermark_main(argvs[round_])
            except Exception as e:  # reported to the parent, which fails the round
                code, err = None, io.StringIO(repr(e))
        return {"code": code, "output": out.getvalue(), "error": err.getvalue()}

    _racer(Path(sync), "cli", len(argvs), act)


def _child_checkpoint(root: str, sync: str, name: str) -> None:
    store = WatermarkStore(root)
    store.ensure_tables()
    pipeline = name.split("-")[0]

    def act(_round: int) -> dict[str, Any]:
        attempt = store.begin_checkpoint(pipeline, "b000001", run_id=name)
        store.finish_checkpoint(
            pipeline,
            "b000001",
            attempt,
            CheckpointStatus.SUCCESS,
            rows_read=1,
            rows_written=1,
            actor=name,
            detail={"attempt": attempt},  # its history row, in the same commit (run_pipeline)
        )
        return {"attempt": attempt}

    _racer(Path(sync), name, 1, act)


CHILDREN: dict[str, Callable[..., None]] = {
    "cycle": _child_cycle,
    "race-finalizer": _child_race_finalizer,
    "race-cli": _child_race_cli,
    "checkpoint": _child_checkpoint,
}


def _main(argv: list[str]) -> None:
    CHILDREN[argv[0]](*argv[1:])


if __name__ == "__main__":
    _main(sys.argv[1:])
    # deltalake 1.6 can abort at interpreter teardown ("terminate called without an active
    # exception", exit 134) after the work is done: leave without the teardown, as the
    # console script does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
