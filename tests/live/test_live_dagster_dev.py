"""End to end: ``watermark dev`` (``dagster dev`` on a loopback port, beside the home's
Spark Connect engine) drives the demo batches by itself.

Nothing is triggered by hand: the coordinator and finalizer sensors (RUNNING by default)
plan a batch, launch its run and finalize it. The test watches from outside, through the
control tables (delta-rs, no JVM) and Dagster's GraphQL API, then commits more upstream data
and checks that the next batch(es) pick up exactly where the first one stopped and that the
targets equal a full recompute.
"""

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable as RsDeltaTable

from tests.support.dagster_dev import (
    SENSOR_INTERVAL_SECONDS,
    STARTUP_TIMEOUT,
    WATERMARK,
    DagsterDev,
    dev_env,
)
from tests.support.ports import free_port
from watermark_dagster.core.records import Batch, BatchKind, BatchStatus
from watermark_dagster.demo import (
    DemoPaths,
    apply_round,
    full_customer_payments,
    full_orders_enriched,
    seed,
)
from watermark_dagster.demo.data import UPSTREAMS as SCHEMAS
from watermark_dagster.observe.log import latest_local_version
from watermark_dagster.store import WatermarkStore
from watermark_dagster.write.commits import label_prefix

pytestmark = [pytest.mark.live, pytest.mark.spark, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]

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

# Bounds on waiting, not expectations: the suite runs in two worker processes on two
# cores (README), so the other worker's Spark work may share the machine (STARTUP_TIMEOUT
# and the sensors' interval: tests/support/dagster_dev.py).
FIRST_BATCH_TIMEOUT = 480
CATCH_UP_TIMEOUT = 600


# ------------------------------------------------------------------------ control tables


def _store(paths: DemoPaths) -> WatermarkStore | None:
    """The store, once the sensors created the control tables (the test never creates them)."""
    root = Path(paths.control_root)
    if all(latest_local_version(str(root / t)) is not None for t in CONTROL_TABLES):
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
            (b.batch_id, rng)
            for b in batches
            if upstream in b.inputs and (rng := b.inputs[upstream].range) is not None
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

SENSOR_QUERY = """
query Sensor($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { id sensorState { status ticks(limit: 1) { status } } }
    ... on PythonError { message }
  }
}
"""

STOP_SENSOR = """
mutation Stop($id: String) {
  stopSensor(id: $id) {
    __typename
    ... on StopSensorMutationResult { instigationState { status } }
    ... on PythonError { message }
  }
}
"""

START_SENSOR = """
mutation Start($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status } }
    ... on PythonError { message }
  }
}
"""


def _coordinator(dev: DagsterDev) -> dict[str, Any]:
    selector = {
        "repositoryLocationName": LOCATION,
        "repositoryName": REPOSITORY,
        "sensorName": "watermark_coordinator",
    }
    found = dev.graphql(SENSOR_QUERY, {"selector": selector})["sensorOrError"]
    assert found["__typename"] == "Sensor", dev.explain(f"sensorOrError: {found}")
    return {"selector": selector, **found}


def _no_tick_running(dev: DagsterDev) -> bool:
    ticks = _coordinator(dev)["sensorState"]["ticks"]
    return not ticks or ticks[0]["status"] != "STARTED"


@contextlib.contextmanager
def _coordinator_stopped(dev: DagsterDev) -> Iterator[None]:
    """The coordinator sensor stopped (as from the UI's toggle) while the block commits, so
    that no tick plans a batch of half the commits; started again afterwards."""
    sensor = _coordinator(dev)
    stopped = dev.graphql(STOP_SENSOR, {"id": sensor["id"]})["stopSensor"]
    assert stopped["__typename"] == "StopSensorMutationResult", dev.explain(f"{stopped}")
    # A tick the daemon began before the stop ends first (one interval lets it register).
    time.sleep(SENSOR_INTERVAL_SECONDS)
    dev.wait_for("the coordinator's last tick to end", lambda: _no_tick_running(dev), 120)
    try:
        yield
    finally:
        started = dev.graphql(START_SENSOR, {"selector": sensor["selector"]})["startSensor"]
        assert started["__typename"] == "Sensor", dev.explain(f"startSensor: {started}")
        assert started["sensorState"]["status"] == "RUNNING", started


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
    ... on Runs { results { runId jobName status startTime endTime tags { key value } } }
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
          ... on BoolMetadataEntry { boolValue }
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


def _sensors(dev: DagsterDev, *, loading: bool = False) -> dict[str, dict[str, Any]] | None:
    """Name -> status and interval; with ``loading``, None until the location is loaded."""
    variables = {"selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}}
    if loading:
        data = dev.try_graphql(SENSORS_QUERY, variables)
        if data is None or data["sensorsOrError"]["__typename"] != "Sensors":
            return None
    else:
        data = dev.graphql(SENSORS_QUERY, variables)
    answer = data["sensorsOrError"]
    assert answer["__typename"] == "Sensors", dev.explain(f"sensorsOrError: {answer}")
    return {
        s["name"]: {"status": s["sensorState"]["status"], "interval": s["minIntervalSeconds"]}
        for s in answer["results"]
    }


def _assert_sensors_running(dev: DagsterDev, sensors: dict[str, dict[str, Any]] | None) -> None:
    """Both sensors RUNNING (their default status), ticking at the configured interval."""
    expected = {s: {"status": "RUNNING", "interval": SENSOR_INTERVAL_SECONDS} for s in SENSORS}
    got = {s: (sensors or {}).get(s) for s in SENSORS}
    assert got == expected, dev.explain(f"sensors: {sensors}")


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
        elif kind == "BoolMetadataEntry":
            values[entry["label"]] = bool(entry["boolValue"])
        else:
            values[entry["label"]] = kind
    return values


STALE_QUERY = """
query Stale($key: AssetKeyInput!, $partitions: [String!]) {
  assetNodeOrError(assetKey: $key) {
    __typename
    ... on AssetNode {
      staleStatusByPartition(partitions: $partitions)
      assetPartitionStatuses {
        __typename
        ... on DefaultPartitionStatuses {
          materializedPartitions unmaterializedPartitions failedPartitions
        }
      }
    }
  }
}
"""

BACKFILL_MUTATION = """
mutation Backfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""


def _partition_states(dev: DagsterDev, asset: str, partitions: list[str]) -> dict[str, Any]:
    """Sync status of ``partitions`` (FRESH, STALE, MISSING) and the asset's partition
    statuses (materialized, unmaterialized, failed)."""
    data = dev.graphql(STALE_QUERY, {"key": {"path": [asset]}, "partitions": partitions})
    node = data["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", node
    return {
        "stale": dict(zip(partitions, node["staleStatusByPartition"], strict=True)),
        **node["assetPartitionStatuses"],
    }


FRESHNESS_QUERY = """
query Freshness($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    __typename
    ... on AssetNode { freshnessStatusInfo { freshnessStatus } }
  }
}
"""


def _freshness(dev: DagsterDev, asset: str) -> str | None:
    """The asset's freshness status as the UI shows it (HEALTHY, WARNING, DEGRADED, UNKNOWN)."""
    node = dev.graphql(FRESHNESS_QUERY, {"key": {"path": [asset]}})["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", node
    info = node["freshnessStatusInfo"]
    return info["freshnessStatus"] if info else None


BACKFILL_QUERY = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { status }
    ... on PythonError { message }
  }
}
"""

CHECKS_QUERY = """
query Checks($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    __typename
    ... on AssetNode {
      assetChecksOrError {
        __typename
        ... on AssetChecks { checks { name executionForLatestMaterialization { status } } }
      }
    }
  }
}
"""

# Bound on waiting for a backfill's runs (two at a time in the pool), not an expectation.
BACKFILL_TIMEOUT = 420


def _backfill(
    dev: DagsterDev, partitions: dict[str, list[str]]
) -> tuple[str, str, list[dict[str, Any]]]:
    """Launch ONE UI asset backfill of the given partitions of each asset
    (``partitionsByAssets``, as the UI's partition picker per asset sends it); its id, its
    final status and its runs, once the daemon ended it."""
    params = {
        "partitionsByAssets": [
            {
                "assetKey": {"path": [asset]},
                "partitions": {"ranges": [{"start": p, "end": p} for p in keys]},
            }
            for asset, keys in partitions.items()
        ]
    }
    answer = dev.graphql(BACKFILL_MUTATION, {"params": params})["launchPartitionBackfill"]
    assert answer["__typename"] == "LaunchBackfillSuccess", answer
    backfill_id = answer["backfillId"]
    tag = {"key": "dagster/backfill", "value": backfill_id}

    def finished() -> tuple[str, list[dict[str, Any]]] | None:
        found = dev.graphql(BACKFILL_QUERY, {"id": backfill_id})["partitionBackfillOrError"]
        assert found["__typename"] == "PartitionBackfill", found
        if found["status"] in ("REQUESTED", "CANCELING", "FAILING"):
            return None
        runs = dev.graphql(RUNS_QUERY, {"filter": {"tags": [tag]}})["runsOrError"]["results"]
        done = {"SUCCESS", "FAILURE", "CANCELED"}
        return (found["status"], runs) if all(r["status"] in done for r in runs) else None

    status, runs = dev.wait_for(f"backfill {backfill_id} to end", finished, BACKFILL_TIMEOUT)
    return backfill_id, status, runs


def _overlapping(runs: list[dict[str, Any]]) -> int:
    """How many pairs of ``runs`` were in flight at the same time (reported, not asserted:
    the pool allows it, the daemon decides)."""
    spans = [(r["startTime"], r["endTime"]) for r in runs if r["startTime"] and r["endTime"]]
    return sum(
        1 for i, a in enumerate(spans) for b in spans[i + 1 :] if a[0] < b[1] and b[0] < a[1]
    )


def _checks_for_latest(dev: DagsterDev, asset: str) -> dict[str, str | None]:
    """Each check of ``asset`` -> the status of its execution for the asset's latest
    materialization, None where the UI shows "Not evaluated"."""
    node = dev.graphql(CHECKS_QUERY, {"key": {"path": [asset]}})["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", node
    checks = node["assetChecksOrError"]
    assert checks["__typename"] == "AssetChecks", checks
    return {
        c["name"]: (c["executionForLatestMaterialization"] or {}).get("status")
        for c in checks["checks"]
    }


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


def _check_batch_in_dagster(dev: DagsterDev, instance: Any, batch: Batch) -> dict[str, int]:
    """Runs of the batch partition succeeded in one process each, and every pipeline's
    materialization shows the batch's ranges. Returns run id -> pid of its process."""
    partition = batch.batch_id
    runs = _runs_of_partition(dev, partition)
    assert runs, dev.explain(f"no Dagster run for partition {partition}")
    assert all(r["jobName"] == JOB for r in runs), runs
    assert all(r["status"] == "SUCCESS" for r in runs), dev.explain(
        f"runs of partition {partition}: {[(r['runId'], r['status']) for r in runs]}"
    )

    pids = {r["runId"]: _check_one_process(dev, instance, r) for r in runs}
    if len(runs) == 1:  # the one run of the batch executed every pipeline of the batch
        steps = {
            e["stepKey"]
            for e in _run_events(dev, runs[0]["runId"])
            if e.get("eventType") == "STEP_SUCCESS"
        }
        assert steps == set(batch.pipelines), (steps, batch.pipelines)

    run_ids = set(pids)
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
            # Dagster's standard table metadata: the Columns tab and the row count.
            assert meta["dagster/column_schema"] == "TableSchemaMetadataEntry", meta
            assert isinstance(meta["dagster/row_count"], int), meta
            # A first batch loads snapshots (nothing committed yet); later ones read CDF.
            assert meta["full_load"] is (pipeline in batch.full_load), meta
            for upstream in PIPELINES[pipeline]:
                planned = batch.inputs[upstream]
                if pipeline in batch.full_load:
                    assert meta[f"{upstream}/read_mode"] == "SNAPSHOT", meta
                    # Numbers only (plotted): a snapshot covers every version up to its end.
                    assert meta[f"{upstream}/start_version"] == 0, meta
                    assert meta[f"{upstream}/end_version"] == planned.snapshot_version, meta
                    row = f"| {upstream} | SNAPSHOT | @{planned.snapshot_version} |"
                    assert row in meta["ranges"], (row, meta["ranges"])
                    continue
                if planned.range is None:
                    assert meta[f"{upstream}/read_mode"] == "NOOP", meta
                    assert f"{upstream}/start_version" not in meta, meta
                    assert meta[f"{upstream}/end_version"] == planned.snapshot_version, meta
                    continue
                # A rewrite (auto's choice for these small targets, whose change feeds no
                # pipeline reads) reads the snapshot at the range's end instead of the range.
                mode = "SNAPSHOT" if meta.get("strategy") == "rewrite" else "CDF"
                assert meta[f"{upstream}/read_mode"] == mode, meta
                assert meta[f"{upstream}/start_version"] == planned.range.start, (upstream, meta)
                assert meta[f"{upstream}/end_version"] == planned.range.end, (upstream, meta)
                assert isinstance(meta[f"{upstream}/rows_read"], int), meta
                row = f"| {upstream} | {mode} | [{planned.range.start}, {planned.range.end}] |"
                assert row in meta["ranges"], (row, meta["ranges"])
    return pids


def _check_one_process(dev: DagsterDev, instance: Any, run: dict[str, Any]) -> int:
    """Every step of the run ran in the run's one process (in-process executor); its pid."""
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
    assert started, started
    assert started <= requested, started
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
    return pid


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


def _with_change_feed(spark: Any, target: str) -> int:
    """Turn the target's change data feed on (one metadata commit); its version then."""
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    return RsDeltaTable(target).version()


def _assert_replays_applied_once(
    spark: Any,
    target: str,
    pipeline: str,
    since: dict[str, int],
    replays: dict[str, dict[str, Any]],
) -> None:
    """Every commit to ``target`` after ``since[pipeline]`` is the one data commit of one
    of ``replays`` (replay batch id -> its materialization's metadata), and that commit's
    change feed carries each changed row once: as many inserts, updates and deletes as the
    materialization reports, no key twice."""
    start = since[pipeline]
    commits = [c for c in RsDeltaTable(target).history() if c["version"] > start]
    owners: dict[str, list[int]] = {}
    for commit in commits:
        label = str(commit.get("userMetadata") or "")
        mine = [r for r in replays if label.startswith(label_prefix(pipeline, r))]
        assert len(mine) == 1, (pipeline, commit, sorted(replays))
        owners.setdefault(mine[0], []).append(commit["version"])
    for replay, meta in replays.items():
        versions = owners.get(replay, [])
        assert len(versions) == (1 if meta["committed"] else 0), (pipeline, replay, versions, meta)
        if versions:
            assert meta["target_version"] == versions[0], (pipeline, replay, meta)
    if not commits:
        return
    key = TARGET_KEYS[pipeline]
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start + 1)
        .load(target)
        .select(key, "_change_type", "_commit_version")
        .collect()
    )
    seen: dict[tuple[Any, str, int], int] = {}
    for row in feed:
        at = (row[key], row["_change_type"], row["_commit_version"])
        seen[at] = seen.get(at, 0) + 1
    twice = {at: n for at, n in seen.items() if n > 1}
    assert not twice, f"{pipeline}: rows changed more than once by one commit: {twice}"
    for replay, meta in replays.items():
        if not meta["committed"]:
            continue
        kinds: dict[str, int] = {}
        for _, kind, version in seen:
            if version == meta["target_version"]:
                kinds[kind] = kinds.get(kind, 0) + 1
        assert kinds.get("update_preimage", 0) == kinds.get("update_postimage", 0), kinds
        figures = (meta["rows_inserted"], meta["rows_updated"], meta["rows_deleted"])
        assert figures == (
            kinds.get("insert", 0),
            kinds.get("update_postimage", 0),
            kinds.get("delete", 0),
        ), (pipeline, replay, figures, kinds)


# ------------------------------------------------------------------------ dagster dev log

_FRAME = re.compile(r'File "[^"]*watermark_dagster[^"]*", line \d+')
_WARNING = re.compile(r"DeprecationWarning")


def _watermark_problems(log: str, expected_raises: tuple[str, ...] = ()) -> list[str]:
    """Tracebacks through watermark_dagster code and its DeprecationWarnings, except the
    frames that raise one of ``expected_raises`` (a failure the test provoked on purpose)."""
    problems = []
    lines = log.splitlines()
    for number, line in enumerate(lines, 1):
        if "watermark_dagster" not in line:
            continue
        following = lines[number] if number < len(lines) else ""
        if _FRAME.search(line) and any(r in following for r in expected_raises):
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


def test_watermark_dev_runs_batches_by_itself_on_its_engine(
    spark: Any,
    tmp_path: Path,
    dagster_home: Path,
    watermark_home: Path,
    instance_reader: Callable[[], Any],
) -> None:
    """``watermark dev`` (no flag): batches planned, run and finalized by the sensors alone;
    every run, the UI backfill's too, a client of the engine that ``watermark dev`` started
    (tagged with its URL), the engine's server the only Spark driver, and stopping
    ``watermark dev`` stops the engine and its server."""
    began = time.monotonic()
    paths = DemoPaths(watermark_home)
    assert seed(spark, paths)
    seeded = _latest_versions(paths)
    assert seeded == {u: 0 for u in UPSTREAMS}, seeded
    assert (dagster_home / "dagster.yaml").is_file()

    # `watermark dev` (no flag), as a user starts it: the home's Spark Connect engine
    # beside `dagster dev`, every run its client.
    port = free_port()
    dev = DagsterDev(
        cwd=REPO,
        env=dev_env(dagster_home, watermark_home),
        port=port,
        log_path=tmp_path / "watermark_dev.log",
        command=[str(WATERMARK), "dev", "--host", "127.0.0.1", "--port", str(port)],
    )
    timings: dict[str, float] = {}
    try:
        ready = dev.wait_for(
            "the engine's ready line",
            lambda: re.search(r"engine ready at (sc://\S+) \(pid (\d+);", dev.log_text()),
            STARTUP_TIMEOUT,
        )
        url, engine_pid = ready.group(1), int(ready.group(2))
        assert "WATERMARK_ENGINE=connect" in dev.log_text(), dev.explain("no engine setting")
        record = json.loads((watermark_home / "engine" / "connect.json").read_text())
        assert (record["url"], record["pid"]) == (url, engine_pid), record
        # ---- the webserver answers and the code location loaded, sensors on by default
        sensors = dev.wait_for(
            "the code location to load", lambda: _sensors(dev, loading=True), STARTUP_TIMEOUT
        )
        timings["webserver up"] = time.monotonic() - began
        _assert_sensors_running(dev, sensors)

        # ---- first batch: planned, run and finalized with no manual trigger
        batches = dev.wait_for(
            "the first batch to complete with watermarks at the seeded versions",
            lambda: _all_caught_up(paths, seeded, 1),
            FIRST_BATCH_TIMEOUT,
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

        _assert_sensors_running(dev, _sensors(dev))
        instance = instance_reader()
        run_pids = _check_batch_in_dagster(dev, instance, first)
        assert len(run_pids) == 1, run_pids

        # ---- new upstream data: the next batch(es) start right after the first one
        with _coordinator_stopped(dev):
            commits = apply_round(spark, paths, 1)
        assert commits > 0
        timings["new data committed"] = time.monotonic() - began
        latest = _latest_versions(paths)
        assert all(latest[u] > seeded[u] for u in UPSTREAMS), (seeded, latest)
        batches = dev.wait_for(
            f"batches to catch up with the new versions {latest}",
            lambda: _all_caught_up(paths, latest, 2),
            CATCH_UP_TIMEOUT,
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
            run_pids.update(_check_batch_in_dagster(dev, instance, batch))
        _assert_sensors_running(dev, _sensors(dev))

        _assert_targets_match_full_recompute(spark, paths, latest)
        timings["targets checked"] = time.monotonic() - began

        # ---- a batch only orders_enriched needs: customer_payments is shown done with
        # nothing to do (not missing), with no run of its own
        spark.createDataFrame([(10_000, 1, 100, "new")], SCHEMAS["orders"]).write.format(
            "delta"
        ).mode("append").save(paths.upstream("orders"))
        latest = _latest_versions(paths)
        batches = dev.wait_for(
            "the orders-only batch to complete",
            lambda: _all_caught_up(paths, latest, len(batches) + 1),
            CATCH_UP_TIMEOUT,
        )
        only = batches[-1]
        assert only.pipelines == ("orders_enriched",), only
        run_pids.update(_check_batch_in_dagster(dev, instance, only))
        [nothing] = dev.wait_for(
            "customer_payments' nothing-to-do materialization",
            lambda: _materializations(dev, "customer_payments", only.batch_id),
            60,
        )
        # Recorded by the finalizer, not by a run.
        assert nothing["runId"] not in {r["runId"] for r in _runs_of_partition(dev, only.batch_id)}
        assert _metadata(nothing)["skip_kind"] == "not_in_batch", _metadata(nothing)
        states = _partition_states(dev, "customer_payments", [only.batch_id])
        assert only.batch_id in states["materializedPartitions"], states
        assert only.batch_id not in states["unmaterializedPartitions"], states
        timings["orders-only batch"] = time.monotonic() - began

        # ---- completed batches stay in sync after upstreams moved on
        ids = [b.batch_id for b in batches]
        for pipeline in PIPELINES:
            states = _partition_states(dev, pipeline, ids)
            assert set(states["stale"].values()) == {"FRESH"}, (pipeline, states)
            assert states["unmaterializedPartitions"] == [], (pipeline, states)

        # ---- freshness is evaluated by Dagster's daemon and shown: both pipelines fresh
        dev.wait_for(
            "both pipelines' freshness evaluated HEALTHY",
            lambda: all(_freshness(dev, p) == "HEALTHY" for p in PIPELINES),
            120,
        )
        timings["freshness healthy"] = time.monotonic() - began

        # ---- ONE UI backfill of old partitions of both pipelines (three of orders_enriched,
        # two of customer_payments), the pool letting two runs go at once: each partition is
        # replayed as a REPLAY batch at its position, runs writing the same target race and
        # settle (serialized or retried), every replay lands once, nothing newer regresses,
        # no watermark moves and no partition is left missing or failed.
        store = _store(paths)
        assert store is not None
        committed = store.committed_versions()
        ran = {p: [b for b in batches if p in b.pipelines] for p in PIPELINES}
        chosen = {"orders_enriched": ran["orders_enriched"][:3]}
        chosen["customer_payments"] = ran["customer_payments"][:2]
        assert [len(v) for v in chosen.values()] == [3, 2], ran
        # The targets get a change data feed (as one another pipeline reads would have), so
        # the test can read what each replay's commit changed.
        since = {p: _with_change_feed(spark, paths.target(p)) for p in PIPELINES}
        backfill_id, status, runs = _backfill(
            dev, {p: [b.batch_id for b in bs] for p, bs in chosen.items()}
        )
        timings["backfill of 5 partitions"] = time.monotonic() - began
        overlaps = _overlapping(runs)
        print(f"\nbackfill {backfill_id}: {len(runs)} runs, {overlaps} pair(s) ran at once")
        assert status == "COMPLETED_SUCCESS", dev.explain(f"backfill {backfill_id}: {status}")
        assert all(r["status"] == "SUCCESS" for r in runs), dev.explain(
            f"backfill runs: {[(r['runId'], r['status']) for r in runs]}"
        )
        backfill_runs = {r["runId"] for r in runs}
        for run in runs:
            # A replay is a batch run like the others: one process (its steps are the
            # pipelines and, as for any UI backfill, the pipelines' checks), one JVM
            # (checked at the end).
            [engine] = [
                e["message"]
                for e in _run_events(dev, run["runId"])
                if e.get("eventType") == "ENGINE_EVENT"
                and "Executing steps" in (e["message"] or "")
            ]
            found = re.fullmatch(r"Executing steps in process \(pid: (\d+)\)", engine)
            assert found, engine
            run_pids[run["runId"]] = int(found.group(1))
        conflicts = 0
        for pipeline, replayed in chosen.items():
            replays: dict[str, dict[str, Any]] = {}
            for batch in replayed:
                [latest_mat, *_] = _materializations(dev, pipeline, batch.batch_id)
                assert latest_mat["runId"] in backfill_runs, (pipeline, batch.batch_id, latest_mat)
                meta = _metadata(latest_mat)
                replay = store.get_batch(meta["replay_batch_id"])
                assert replay.kind is BatchKind.REPLAY, replay
                assert replay.status is BatchStatus.COMPLETED, replay
                assert replay.pipelines == (pipeline,), replay
                assert replay.order_seq == batch.seq, (replay, batch)
                assert (meta["batch_id"], meta["replay_of"]) == (batch.batch_id,) * 2, meta
                for upstream in PIPELINES[pipeline]:
                    if batch.inputs[upstream].range is not None:
                        assert replay.inputs[upstream].range == batch.inputs[upstream].range
                        end = batch.inputs[upstream].range.end  # type: ignore[union-attr]
                        assert meta[f"{upstream}/end_version"] == end, meta
                replays[replay.batch_id] = meta
                conflicts += meta["write_conflicts"]
            _assert_replays_applied_once(spark, paths.target(pipeline), pipeline, since, replays)
        print(f"write conflicts retried by the backfill's replays: {conflicts}")
        assert store.committed_versions() == committed
        assert store.open_batch() is None
        _assert_targets_match_full_recompute(spark, paths, latest)
        ids = [b.batch_id for b in store.batches() if b.kind is not BatchKind.REPLAY]
        for pipeline in PIPELINES:
            states = _partition_states(dev, pipeline, ids)
            assert states["unmaterializedPartitions"] == [], (pipeline, states)
            assert states["failedPartitions"] == [], (pipeline, states)
        # The checks are evaluated for each pipeline's newest materialization: by the
        # backfill's runs, or, where runs of a pipeline ended in another order than they
        # started (Dagster then takes the last started run's execution for the newest), by
        # the coordinator's next tick.
        dev.wait_for(
            "each pipeline's check evaluated for its newest materialization",
            lambda: all(
                _checks_for_latest(dev, p).get("watermark_stuck_batch") == "SUCCEEDED"
                for p in PIPELINES
            ),
            60,
        )
        # Each replay run evaluated the pipeline's watermark_drift check for its own
        # materialization: none found drift (runs that ended out of order may leave the
        # newest materialization's shown "Not evaluated": the coordinator re-reports only
        # the stuck-batch check).
        for p in PIPELINES:
            assert _checks_for_latest(dev, p).get("watermark_drift") != "FAILED", p
        timings["backfill replayed"] = time.monotonic() - began

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
    assert not dev.leftovers, "processes left alive after stopping watermark dev:\n" + "\n".join(
        dev.leftovers
    )
    # Stopping `watermark dev` stopped its engine too.
    assert not (watermark_home / "engine" / "connect.json").exists()
    assert (watermark_home / "logs" / "spark-connect.log").is_file()
    # The engine's server is the only Spark driver: every run (and the UI backfill's) was
    # its client, and nothing else (webserver, daemon, code server, sensors) started Spark.
    jvms, chains = dev.jvms_by_run(set(run_pids.values()))
    print(f"Spark driver JVMs by run process: {jvms}; runs: {run_pids}\n{chains}")
    assert set(jvms) == {None}, f"JVMs by run process {jvms}, runs {run_pids}:\n{chains}"
    assert len(jvms[None]) == 1, f"{jvms}:\n{chains}"
    assert f"<- {engine_pid} " in chains, chains
    tags = {r.run_id: r.tags.get("watermark/engine") for r in instance_reader().get_runs()}
    batch_runs = {run: tags[run] for run in run_pids}
    assert batch_runs == {run: f"connect:{url}" for run in run_pids}, batch_runs
