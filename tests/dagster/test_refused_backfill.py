"""A materialization by hand of a batch partition the pipeline already applied is refused,
and reads as a refusal, through Dagster's GraphQL API (what the UI and `dagster asset
materialize` launch).

The demo code location is served by a real code server (dagster_graphql's test context);
the run is launched by the ``launchPipelineExecution`` mutation on a SQLite instance whose
run launcher executes it synchronously in this process, so no webserver or daemon is
needed. The control tables and upstreams are written with delta-rs.
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from dagster_graphql.test.utils import (
    define_out_of_process_context,
    execute_dagster_graphql,
    infer_repository_selector,
)
from deltalake import DeltaTable

from tests.dagster.test_no_jvm import applied_home
from watermark_dagster import definitions
from watermark_dagster.demo import DemoPaths
from watermark_dagster.runtime import spark as runtime_spark
from watermark_dagster.store import WatermarkStore

# Runs start at once and execute in the launching process: no daemon, no run worker.
_SYNC_RUNS = """
run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
run_launcher:
  module: dagster._core.launcher.sync_in_memory_run_launcher
  class: SyncInMemoryRunLauncher
"""

LAUNCH = """
mutation Launch($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
  }
}
"""

EVENTS = """
query Events($runId: ID!) {
  runOrError(runId: $runId) { __typename ... on Run { status } }
  logsForRun(runId: $runId) {
    __typename
    ... on EventConnection {
      events {
        __typename
        ... on ExecutionStepFailureEvent {
          error { message className stack }
          failureMetadata {
            description
            metadataEntries { label ... on TextMetadataEntry { text } }
          }
        }
        ... on MaterializationEvent { partition }
      }
    }
  }
}
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo home of ``applied_home`` (b000002 applied by orders_enriched), with a Dagster
    instance that runs launched runs synchronously; the environment names both for the
    code server."""
    home = applied_home(tmp_path)
    dagster_home = home / "dagster"
    with open(dagster_home / "dagster.yaml", "a") as f:
        f.write(_SYNC_RUNS)
    monkeypatch.setenv("WATERMARK_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    monkeypatch.setenv("NO_COLOR", "1")
    return home


def _launch_by_hand(instance: DagsterInstance, asset: str, partition: str) -> Mapping[str, Any]:
    """Materialize one batch partition of ``asset`` as the UI does (no coordinator attempt
    tag); the run's status and events, read back through GraphQL."""
    with define_out_of_process_context(definitions.__file__, "defs", instance) as context:
        selector = {
            **infer_repository_selector(context),
            "pipelineName": "watermark_batch_job",
            "assetSelection": [{"path": [asset]}],
        }
        params = {
            "selector": selector,
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]},
        }
        launched = execute_dagster_graphql(context, LAUNCH, {"executionParams": params}).data
        answer = launched["launchPipelineExecution"]
        assert answer["__typename"] == "LaunchRunSuccess", answer
        run_id = answer["run"]["runId"]
        return execute_dagster_graphql(context, EVENTS, {"runId": run_id}).data


# The mutation runs in asyncio.run, and the synchronous launcher executes the run inside it.
@pytest.mark.filterwarnings("ignore:coroutine 'BaseEventLoop.shutdown_asyncgens':RuntimeWarning")
def test_a_refused_reapply_reads_as_a_refusal(home: Path) -> None:
    paths = DemoPaths(home)
    store = WatermarkStore(paths.control_root)
    target_version = DeltaTable(paths.target("orders_enriched")).version()
    checkpoints = len(store.checkpoints(batch_id="b000002"))
    # Under xdist another module of this worker may have started a JVM already: count the
    # sessions this refusal builds instead of asking whether one ever started.
    sessions = runtime_spark.sessions_started
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(os.environ["DAGSTER_HOME"]))
    try:
        instance.add_dynamic_partitions("watermark_batches", ["b000001", "b000002"])
        data = _launch_by_hand(instance, "orders_enriched", "b000002")
    finally:
        instance.dispose()

    assert data["runOrError"]["status"] == "FAILURE", data["runOrError"]
    events = data["logsForRun"]["events"]
    [failure] = [e for e in events if e["__typename"] == "ExecutionStepFailureEvent"]
    error = failure["error"]
    # The error is the refusal: its class says so and its message is the description.
    assert error["className"] == "ReapplyRefused", error
    description = failure["failureMetadata"]["description"]
    assert description.startswith("Not re-applied: 'orders_enriched' already applied batch")
    assert error["message"].strip().endswith(description), error["message"]
    # The one frame of ours is the refusal raised in the asset's body: decided before any
    # store write or Spark session, nothing below it.
    ours = [frame for frame in error["stack"] if "/watermark_dagster/" in frame]
    assert len(ours) == 1, ours
    assert "raise refuse_manual_reapply(decision)" in ours[0]
    # The metadata: the batch, its status, why, and the command to run instead.
    meta = {m["label"]: m.get("text") for m in failure["failureMetadata"]["metadataEntries"]}
    assert meta == {
        "batch_id": "b000002",
        "batch_status": "COMPLETED",
        "pipeline": "orders_enriched",
        "skip_kind": "already_applied",
        "fix": "watermark replay -t orders --from-version 1 --to-version 1 -p orders_enriched",
    }
    # Nothing retried, written, materialized or recorded, and no JVM started.
    assert [e["__typename"] for e in events].count("ExecutionStepUpForRetryEvent") == 0
    assert not [e for e in events if e["__typename"] == "MaterializationEvent"]
    assert DeltaTable(paths.target("orders_enriched")).version() == target_version
    assert len(store.checkpoints(batch_id="b000002")) == checkpoints
    assert runtime_spark.sessions_started == sessions  # refused before any Spark session
