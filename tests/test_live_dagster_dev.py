"""End to end: ``dagster dev`` on a loopback port drives the demo batches by itself.

Nothing is triggered by hand: the coordinator and finalizer sensors (RUNNING by default)
plan a batch, launch its run and finalize it. The test watches from outside, through the
control tables (delta-rs, no JVM) and Dagster's GraphQL API, then commits more upstream data
and checks that the next batch(es) pick up exactly where the first one stopped and that the
targets equal a full recompute.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from watermark_dagster.demo import (
    DemoPaths,
    apply_round,
    full_customer_payments,
    full_orders_enriched,
    seed,
)
from watermark_dagster.observe.delta_log import latest_local_version
from watermark_dagster.store import Batch, BatchStatus, WatermarkStore

pytestmark = [pytest.mark.live, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[1]
DAGSTER = Path(sys.executable).with_name("dagster")
if not DAGSTER.exists():  # run by another interpreter: fall back to the repository's venv
    DAGSTER = REPO / ".venv" / "bin" / "dagster"

LOCATION = "watermark_dagster"
REPOSITORY = "__repository__"
JOB = "watermark_batch_job"
SENSORS = ("watermark_coordinator", "watermark_finalizer")
UPSTREAMS = ("customers", "orders", "payments")
PIPELINES = {
    "orders_enriched": ("orders", "customers"),
    "customer_payments": ("customers", "payments"),
}
TARGET_KEYS = {"orders_enriched": "order_id", "customer_payments": "customer_id"}
FRAMEWORK_COLUMNS = ("_wm_seq", "_wm_batch_id")
CONTROL_TABLES = ("batches", "committed_watermarks", "pipeline_checkpoints", "history")

STARTUP_TIMEOUT = 120
BATCH_TIMEOUT = 240
POLL_SECONDS = 2.0
LOG_TAIL_LINES = 120


# ------------------------------------------------------------------------ process handling


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(ppid, state, start time) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0], fields[19]


def _alive(pid: int, start: str) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (zombies are dead)."""
    stat = _proc_stat(pid)
    return stat is not None and stat[2] == start and stat[1] not in ("Z", "X")


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live descendant of ``root``."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _proc_stat(int(entry))
        if stat is None:
            continue
        children.setdefault(stat[0], []).append(int(entry))
        starts[int(entry)] = stat[2]
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = starts[child]
                todo.append(child)
    return found


class DagsterDev:
    """``dagster dev`` in its own process group, its output in a log file.

    Every descendant ever seen is remembered (pid and start time), so one that left the
    process group or was re-parented is still stopped, by its own pid, at the end.
    """

    def __init__(self, *, cwd: Path, env: dict[str, str], port: int, log_path: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/graphql"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        root_stat = _proc_stat(self.proc.pid)
        self.known: dict[int, str] = {self.proc.pid: root_stat[2] if root_stat else "?"}
        self.http = requests.Session()
        self.http.trust_env = False  # never go through a proxy: loopback only
        self.leftovers: list[str] = []

    # -- bookkeeping

    def track(self) -> None:
        """Remember the current descendants (called while polling)."""
        if self.proc.poll() is None:
            self.known.update(_descendants(self.proc.pid))

    def alive(self) -> list[tuple[int, str]]:
        return [(pid, start) for pid, start in self.known.items() if _alive(pid, start)]

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log_text().splitlines()[-lines:]
        return f"\n---- last {len(text)} lines of {self.log_path} ----\n" + "\n".join(text)

    def explain(self, message: str) -> str:
        return message + self.log_tail()

    # -- GraphQL

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.http.post(
            self.url, json={"query": query, "variables": variables or {}}, timeout=60
        )
        assert response.status_code == 200, self.explain(
            f"GraphQL HTTP {response.status_code}: {response.text[:2000]}"
        )
        body = response.json()
        assert not body.get("errors"), self.explain(f"GraphQL errors: {body['errors']}")
        return body["data"]

    # -- waiting

    def wait_for(
        self, what: str, condition: Callable[[], Any], timeout: float, poll: float = POLL_SECONDS
    ) -> Any:
        """Poll ``condition`` until it returns something truthy; fail with the log tail."""
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while time.monotonic() < deadline:
            self.track()
            if self.proc.poll() is not None:
                pytest.fail(
                    self.explain(
                        f"dagster dev exited with code {self.proc.returncode} while waiting for {what}"
                    )
                )
            try:
                result = condition()
            except (requests.RequestException, OSError) as e:
                last_error, result = e, None
            if result:
                return result
            time.sleep(poll)
        pytest.fail(
            self.explain(
                f"timed out after {timeout:.0f}s waiting for {what}"
                + (f" (last error: {last_error!r})" if last_error else "")
            )
        )

    # -- shutdown

    def stop(self) -> None:
        """SIGTERM the process group, wait, SIGKILL what is left; record survivors."""
        self.track()
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and (self.proc.poll() is None or self.alive()):
            time.sleep(0.5)
        for pid, start in self.alive():  # gone astray or stuck: by pid, only if still ours
            try:
                if _alive(pid, start):
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.2)
        self.leftovers = [_cmdline(pid) for pid, _ in self.alive()]
        self.http.close()
        self._log.close()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f"{pid}: " + f.read().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return f"{pid}: ?"


# ------------------------------------------------------------------------ control tables


def _store(paths: DemoPaths) -> WatermarkStore | None:
    """The store, once the sensors created the control tables (the test never creates them)."""
    root = Path(paths.control_root)
    if all((root / t / "_delta_log").is_dir() for t in CONTROL_TABLES):
        return WatermarkStore(paths.control_root)
    return None


def _latest_versions(paths: DemoPaths) -> dict[str, int]:
    versions = {u: latest_local_version(paths.upstream(u)) for u in UPSTREAMS}
    assert all(v is not None for v in versions.values()), versions
    return versions  # type: ignore[return-value]


def _all_caught_up(paths: DemoPaths, expected: dict[str, int], min_batches: int):
    """The batches once every upstream's watermark is at ``expected`` and nothing is open."""
    store = _store(paths)
    if store is None:
        return None
    if store.committed_versions() != expected or store.open_batch() is not None:
        return None
    batches = sorted(store.batches(), key=lambda b: b.seq)
    completed = [b for b in batches if b.status is BatchStatus.COMPLETED]
    if len(completed) < min_batches:
        return None
    return batches


def _assert_contiguous(batches: list[Batch], latest: dict[str, int]) -> None:
    """Per upstream, the ranges of all batches tile [0, latest] with no gap nor overlap."""
    for upstream in UPSTREAMS:
        ranges = [
            (b.batch_id, b.inputs[upstream].range)
            for b in batches
            if upstream in b.inputs and b.inputs[upstream].range is not None
        ]
        assert ranges, f"{upstream}: no batch read it"
        next_start = 0
        for batch_id, rng in ranges:
            assert rng.start == next_start, (
                f"{upstream}: batch {batch_id} reads {rng}, expected to start at {next_start} "
                f"(all ranges: {[(b, str(r)) for b, r in ranges]})"
            )
            next_start = rng.end + 1
        assert next_start - 1 == latest[upstream], (
            f"{upstream}: the batches end at {next_start - 1}, latest version is {latest[upstream]}"
        )


# ------------------------------------------------------------------------ GraphQL checks

SENSORS_QUERY = """
query Sensors($selector: RepositorySelector!) {
  sensorsOrError(repositorySelector: $selector) {
    __typename
    ... on Sensors { results { name minIntervalSeconds sensorState { status } } }
    ... on PythonError { message }
  }
}
"""

RUNS_QUERY = """
query Runs($filter: RunsFilter) {
  runsOrError(filter: $filter) {
    __typename
    ... on Runs { results { runId jobName status tags { key value } } }
    ... on PythonError { message }
  }
}
"""

MATERIALIZATIONS_QUERY = """
query Materializations($key: AssetKeyInput!, $partitions: [String!]) {
  assetOrError(assetKey: $key) {
    __typename
    ... on Asset {
      assetMaterializations(partitions: $partitions) {
        partition
        runId
        stepKey
        metadataEntries {
          __typename
          label
          ... on IntMetadataEntry { intValue intRepr }
          ... on TextMetadataEntry { text }
          ... on MarkdownMetadataEntry { mdStr }
        }
      }
    }
  }
}
"""

LOGS_QUERY = """
query Logs($runId: ID!, $cursor: String) {
  logsForRun(runId: $runId, afterCursor: $cursor) {
    __typename
    ... on EventConnection {
      cursor
      hasMore
      events {
        __typename
        ... on MessageEvent { message eventType stepKey }
        ... on LogsCapturedEvent { pid stepKeys }
      }
    }
    ... on PythonError { message }
  }
}
"""


def _sensor_states(dev: DagsterDev) -> dict[str, str] | None:
    data = dev.graphql(
        SENSORS_QUERY,
        {"selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}},
    )["sensorsOrError"]
    if data["__typename"] != "Sensors":
        return None  # the code location is still loading
    return {s["name"]: s["sensorState"]["status"] for s in data["results"]}


def _runs_of_partition(dev: DagsterDev, partition: str) -> list[dict[str, Any]]:
    data = dev.graphql(
        RUNS_QUERY, {"filter": {"tags": [{"key": "dagster/partition", "value": partition}]}}
    )["runsOrError"]
    assert data["__typename"] == "Runs", data
    return data["results"]


def _materializations(dev: DagsterDev, asset: str, partition: str) -> list[dict[str, Any]]:
    data = dev.graphql(
        MATERIALIZATIONS_QUERY, {"key": {"path": [asset]}, "partitions": [partition]}
    )["assetOrError"]
    assert data["__typename"] == "Asset", data
    return data["assetMaterializations"]


def _metadata(materialization: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for entry in materialization["metadataEntries"]:
        kind = entry["__typename"]
        if kind == "IntMetadataEntry":
            values[entry["label"]] = int(entry["intRepr"])
        elif kind == "TextMetadataEntry":
            values[entry["label"]] = entry["text"]
        elif kind == "MarkdownMetadataEntry":
            values[entry["label"]] = entry["mdStr"]
        else:
            values[entry["label"]] = kind
    return values


def _run_events(dev: DagsterDev, run_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    cursor = None
    while True:
        data = dev.graphql(LOGS_QUERY, {"runId": run_id, "cursor": cursor})["logsForRun"]
        assert data["__typename"] == "EventConnection", data
        events.extend(data["events"])
        cursor = data["cursor"]
        if not data["hasMore"]:
            return events


def _check_batch_in_dagster(dev: DagsterDev, instance: Any, batch: Batch) -> list[str]:
    """Runs of the batch partition succeeded in one process each, and every pipeline's
    materialization shows the batch's ranges. Returns the successful run ids."""
    partition = batch.batch_id
    runs = _runs_of_partition(dev, partition)
    assert runs, dev.explain(f"no Dagster run for partition {partition}")
    assert all(r["jobName"] == JOB for r in runs), runs
    assert all(r["status"] == "SUCCESS" for r in runs), dev.explain(
        f"runs of partition {partition}: {[(r['runId'], r['status']) for r in runs]}"
    )

    for run in runs:
        _check_one_process(dev, instance, run)

    run_ids = {r["runId"] for r in runs}
    for pipeline in batch.pipelines:
        mats = _materializations(dev, pipeline, partition)
        assert mats, dev.explain(f"no materialization of {pipeline} for {partition}")
        # The newest one is first; every one of them must belong to this batch's plan.
        for mat in mats:
            assert mat["partition"] == partition
            assert mat["runId"] in run_ids, (mat["runId"], run_ids)
            meta = _metadata(mat)
            assert meta["batch_id"] == partition, meta
            assert meta["watermark/plan_id"] == batch.plan_id, meta
            assert isinstance(meta["rows_written"], int), meta
            for upstream in PIPELINES[pipeline]:
                planned = batch.inputs[upstream]
                if planned.range is None:
                    assert meta[f"{upstream}/read_mode"] == "NOOP", meta
                    assert meta[f"{upstream}/start_version"] == "none", meta
                    assert meta[f"{upstream}/end_version"] == planned.snapshot_version, meta
                    continue
                assert meta[f"{upstream}/read_mode"] == "CDF", meta
                assert meta[f"{upstream}/start_version"] == planned.range.start, (upstream, meta)
                assert meta[f"{upstream}/end_version"] == planned.range.end, (upstream, meta)
                assert isinstance(meta[f"{upstream}/rows_read"], int), meta
                row = f"| {upstream} | CDF | [{planned.range.start}, {planned.range.end}] |"
                assert row in meta["ranges"], (row, meta["ranges"])
    return sorted(run_ids)


def _check_one_process(dev: DagsterDev, instance: Any, run: dict[str, Any]) -> None:
    """One JVM per run, not per asset: every step of the run ran in the run's one process."""
    run_id = run["runId"]
    events = _run_events(dev, run_id)
    engine = [
        e
        for e in events
        if e.get("eventType") == "ENGINE_EVENT" and "Executing steps" in (e.get("message") or "")
    ]
    assert len(engine) == 1, [e.get("message") for e in engine]
    found = re.fullmatch(r"Executing steps in process \(pid: (\d+)\)", engine[0]["message"])
    assert found, f"run {run_id} did not use the in-process executor: {engine[0]['message']!r}"
    pid = int(found.group(1))

    started = {e["stepKey"] for e in events if e.get("eventType") == "STEP_START"}
    succeeded = {e["stepKey"] for e in events if e.get("eventType") == "STEP_SUCCESS"}
    requested = set(PIPELINES)  # at most both pipelines; each run's steps must all succeed
    assert started and started <= requested, started
    assert succeeded == started, (started, succeeded)
    captured = {e["pid"] for e in events if e["__typename"] == "LogsCapturedEvent"}
    assert captured <= {pid}, (captured, pid)

    # The same from the instance's event log: every event the run process wrote (events
    # written before launch, like ASSET_MATERIALIZATION_PLANNED, carry no pid) has its pid,
    # and so does every step event.
    events_with_pid = [
        (record.step_key, record.dagster_event.event_type_value, record.dagster_event.pid)
        for record in instance.all_logs(run_id)
        if record.dagster_event is not None and record.dagster_event.pid is not None
    ]
    assert {p for _, _, p in events_with_pid} == {pid}, events_with_pid
    step_starts = {(k, p) for k, t, p in events_with_pid if t == "STEP_START"}
    assert step_starts == {(k, pid) for k in started}, (step_starts, pid)
    worker = {t["key"]: t["value"] for t in run["tags"]}.get("watermark/worker", "")
    assert worker.split(":")[1:2] == [str(pid)], (worker, pid)


# ------------------------------------------------------------------------ targets


def _rows(df: Any, columns: list[str]) -> list[tuple]:
    return sorted((tuple(r) for r in df.select(*columns).collect()), key=repr)


def _assert_targets_match_full_recompute(
    spark: Any, paths: DemoPaths, versions: dict[str, int]
) -> None:
    def snapshot(upstream: str) -> Any:
        return (
            spark.read.format("delta")
            .option("versionAsOf", versions[upstream])
            .load(paths.upstream(upstream))
        )

    expected = {
        "orders_enriched": full_orders_enriched(snapshot("orders"), snapshot("customers")),
        "customer_payments": full_customer_payments(snapshot("customers"), snapshot("payments")),
    }
    for name, reference in expected.items():
        target = spark.read.format("delta").load(paths.target(name))
        assert set(FRAMEWORK_COLUMNS) <= set(target.columns), target.columns
        target = target.drop(*FRAMEWORK_COLUMNS)
        assert sorted(target.columns) == sorted(reference.columns), (
            name,
            target.columns,
            reference.columns,
        )
        columns = reference.columns
        got, want = _rows(target, columns), _rows(reference, columns)
        assert got == want, (
            f"{name} differs from the full recompute:\n"
            f"  only in target:    {sorted(set(got) - set(want), key=repr)}\n"
            f"  only in reference: {sorted(set(want) - set(got), key=repr)}"
        )
        assert len({r[columns.index(TARGET_KEYS[name])] for r in got}) == len(got), name


# ------------------------------------------------------------------------ dagster dev log

_FRAME = re.compile(r'File "[^"]*watermark_dagster[^"]*", line \d+')
_WARNING = re.compile(r"DeprecationWarning")


def _watermark_problems(log: str) -> list[str]:
    """Tracebacks through watermark_dagster code and its DeprecationWarnings."""
    problems = []
    for number, line in enumerate(log.splitlines(), 1):
        if "watermark_dagster" not in line:
            continue
        if _FRAME.search(line) or "Traceback" in line or _WARNING.search(line):
            problems.append(f"{number}: {line}")
    return problems


# ------------------------------------------------------------------------ the test


@pytest.fixture
def instance_reader(dagster_home: Path) -> Iterator[Callable[[], Any]]:
    """A read-only handle on the instance ``dagster dev`` uses (opened on first use)."""
    opened: list[Any] = []

    def get() -> Any:
        if not opened:
            from dagster import DagsterInstance
            from dagster._core.instance.ref import InstanceRef

            opened.append(DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home))))
        return opened[0]

    yield get
    for instance in opened:
        instance.dispose()


def test_dagster_dev_runs_batches_by_itself(
    spark: Any,
    tmp_path: Path,
    dagster_home: Path,
    watermark_home: Path,
    instance_reader: Callable[[], Any],
) -> None:
    began = time.monotonic()
    paths = DemoPaths(watermark_home)
    assert seed(spark, paths)
    seeded = _latest_versions(paths)
    assert seeded == {u: 0 for u in UPSTREAMS}, seeded
    assert (dagster_home / "dagster.yaml").is_file()

    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(dagster_home),
        WATERMARK_HOME=str(watermark_home),
        WATERMARK_SENSOR_INTERVAL_SECONDS="5",
        WATERMARK_MIN_BATCH_INTERVAL_SECONDS="0",
        WATERMARK_SPARK_MASTER="local[1]",
        WATERMARK_SPARK_CONF=json.dumps(
            {
                "spark.sql.shuffle.partitions": "2",
                "spark.default.parallelism": "1",
                "spark.databricks.delta.snapshotPartitions": "1",
            }
        ),
        # Show DeprecationWarnings (hidden by default outside __main__) so the log check
        # below can see the ones raised from watermark_dagster's code.
        PYTHONWARNINGS="default::DeprecationWarning",
        PYSPARK_PYTHON=env.get("PYSPARK_PYTHON") or sys.executable,
        PYTHONUNBUFFERED="1",
    )
    env.pop("WATERMARK_SPARK_REMOTE", None)

    dev = DagsterDev(cwd=REPO, env=env, port=_free_port(), log_path=tmp_path / "dagster_dev.log")
    timings: dict[str, float] = {}
    try:
        # ---- the webserver answers and the code location loaded, sensors on by default
        states = dev.wait_for(
            "the code location to load", lambda: _sensor_states(dev), STARTUP_TIMEOUT
        )
        timings["webserver up"] = time.monotonic() - began
        assert {s: states.get(s) for s in SENSORS} == {s: "RUNNING" for s in SENSORS}, states

        # ---- first batch: planned, run and finalized with no manual trigger
        batches = dev.wait_for(
            "the first batch to complete with watermarks at the seeded versions",
            lambda: _all_caught_up(paths, seeded, 1),
            BATCH_TIMEOUT,
        )
        timings["first batch"] = time.monotonic() - began
        assert len(batches) == 1, batches
        first = batches[0]
        assert first.batch_id == "b000001", first
        assert first.status is BatchStatus.COMPLETED
        assert set(first.pipelines) == set(PIPELINES), first.pipelines
        assert {u: (i.range.start, i.range.end) for u, i in first.inputs.items() if i.range} == {
            u: (0, 0) for u in UPSTREAMS
        }, first.inputs
        _assert_contiguous(batches, seeded)

        states = _sensor_states(dev)
        assert {s: states.get(s) for s in SENSORS} == {s: "RUNNING" for s in SENSORS}, states
        instance = instance_reader()
        first_runs = _check_batch_in_dagster(dev, instance, first)
        assert len(first_runs) == 1, first_runs

        # ---- new upstream data: the next batch(es) start right after the first one
        commits = apply_round(spark, paths, 1)
        assert commits > 0
        latest = _latest_versions(paths)
        assert all(latest[u] > seeded[u] for u in UPSTREAMS), (seeded, latest)
        batches = dev.wait_for(
            f"batches to catch up with the new versions {latest}",
            lambda: _all_caught_up(paths, latest, 2),
            BATCH_TIMEOUT,
        )
        timings["caught up after new data"] = time.monotonic() - began
        assert batches[0].batch_id == first.batch_id
        assert all(b.status is BatchStatus.COMPLETED for b in batches), batches
        assert [b.batch_id for b in batches] == [f"b{i:06d}" for i in range(1, len(batches) + 1)]
        second = batches[1]
        for upstream, planned in second.inputs.items():
            if planned.range is not None:
                assert planned.range.start == first.inputs[upstream].range.end + 1, (
                    upstream,
                    second.inputs,
                    first.inputs,
                )
        assert any(i.range is not None for i in second.inputs.values()), second.inputs
        _assert_contiguous(batches, latest)

        for batch in batches[1:]:
            _check_batch_in_dagster(dev, instance, batch)
        states = _sensor_states(dev)
        assert {s: states.get(s) for s in SENSORS} == {s: "RUNNING" for s in SENSORS}, states

        _assert_targets_match_full_recompute(spark, paths, latest)
        timings["targets checked"] = time.monotonic() - began

        problems = _watermark_problems(dev.log_text())
        assert not problems, dev.explain(
            "dagster dev log shows tracebacks or DeprecationWarnings from watermark_dagster:\n"
            + "\n".join(problems[:40])
        )
    finally:
        dev.stop()
        timings["stopped"] = time.monotonic() - began
        print(
            f"\nlive dagster dev timings (s since start): "
            f"{ {k: round(v, 1) for k, v in timings.items()} }; log: {dev.log_path}"
        )

    assert dev.proc.returncode is not None
    assert not dev.leftovers, "processes left alive after stopping dagster dev:\n" + "\n".join(
        dev.leftovers
    )
    # The run workers and their JVMs were seen and are gone too.
    assert len(dev.known) > 1, dev.known
