"""What the sensors need to know about Dagster runs and materializations of a batch.

Every query here is bounded by the open batch (one partition), never by history.
"""

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.storage.tags import PARTITION_NAME_TAG

from watermark_dagster.core.planning import TerminalFailure
from watermark_dagster.core.records import Batch
from watermark_dagster.errors import TerminalError

# A run is in flight until it reaches one of these. QUEUED and NOT_STARTED count as in
# flight: a run the daemon just submitted must not be submitted again.
FINISHED = frozenset(
    {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
)

WORKER_TAG = "watermark/worker"
ATTEMPT_TAG = "watermark/attempt"
BATCH_TAG = "watermark/batch"
PLAN_ID_METADATA = "watermark/plan_id"
# Set on a run whose pipeline raised a TerminalError: the coordinator does not resubmit it.
TERMINAL_TAG = "watermark/terminal_error"


def terminal_error_tags(run_id: str, pipeline: str, error: TerminalError) -> dict[str, str]:
    """The run tag that marks ``run_id`` as failed by ``error`` (retrying cannot help).

    It names its own run: a re-execution from the UI copies its parent's tags, and must
    not inherit the verdict.
    """
    value = {
        "run_id": run_id,
        "pipeline": pipeline,
        "error": type(error).__name__,
        "message": str(error)[:2000],
    }
    return {TERMINAL_TAG: json.dumps(value)}


def _terminal_failure(run: object) -> TerminalFailure | None:
    raw = run.tags.get(TERMINAL_TAG)  # type: ignore[attr-defined]
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if value.get("run_id") != run.run_id:  # type: ignore[attr-defined]
        return None
    return TerminalFailure(value.get("pipeline"), value.get("error", ""), value.get("message", ""))


def _proc_start_time(pid: int) -> str | None:
    """Kernel start time of ``pid`` (distinguishes a reused pid); None where /proc is absent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def worker_identity() -> str:
    """``host:pid:start`` of this process, tagged on the run that executes a batch."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_proc_start_time(pid) or '-'}"


def worker_alive(identity: str) -> bool | None:
    """Whether the process named by ``identity`` still runs; None when it cannot be told
    from here (another host)."""
    try:
        host, pid_text, start = identity.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start != "-":
        return _proc_start_time(pid) == start
    return True


@dataclass(frozen=True)
class BatchRuns:
    """The Dagster runs of one batch partition, sorted into what the coordinator needs."""

    in_flight: tuple[str, ...]
    dead: tuple[str, ...]
    failed: int
    last_attempt: int
    terminal: TerminalFailure | None = None


def batch_runs(instance: DagsterInstance, batch_id: str) -> BatchRuns:
    """Classify the runs of a batch partition; runs whose worker died are marked failed.

    ``terminal`` is set when the newest finished run failed with a terminal error.
    """
    runs = instance.get_runs(RunsFilter(tags={PARTITION_NAME_TAG: batch_id}))  # newest first
    in_flight: list[str] = []
    dead: list[str] = []
    failed = 0
    last_attempt = 0
    newest_finished = next((r for r in runs if r.status in FINISHED), None)
    terminal = None
    if newest_finished is not None and newest_finished.status is DagsterRunStatus.FAILURE:
        terminal = _terminal_failure(newest_finished)
    for run in runs:
        last_attempt = max(last_attempt, int(run.tags.get(ATTEMPT_TAG, "0") or 0))
        if run.status not in FINISHED:
            identity = run.tags.get(WORKER_TAG)
            if (
                run.status is DagsterRunStatus.STARTED
                and identity
                and worker_alive(identity) is False
            ):
                instance.report_run_failed(
                    run,
                    f"watermark: the run's worker process ({identity}) is gone; marking the run "
                    f"failed so batch {batch_id} can be resumed.",
                )
                dead.append(run.run_id)
                failed += 1
            else:
                in_flight.append(run.run_id)
        else:
            # A canceled run counts as a failed attempt, so an operator's cancel is not
            # undone by endless resubmission.
            failed += run.status is not DagsterRunStatus.SUCCESS
    return BatchRuns(tuple(in_flight), tuple(dead), failed, last_attempt, terminal)


def succeeded_pipelines(
    instance: DagsterInstance, batch: Batch, keys: Mapping[str, AssetKey]
) -> set[str]:
    """Pipelines of ``batch`` with a materialization of its partition for *this* plan.

    The plan id check keeps a materialization left over from an older control root that
    reused the same batch id from counting.
    """
    done = set()
    for name in batch.pipelines:
        key = keys.get(name)
        if key is None:
            continue
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, asset_partitions=[batch.batch_id]), limit=20
        ).records
        for record in records:
            materialization = record.asset_materialization
            if materialization is None:
                continue
            plan_id = materialization.metadata.get(PLAN_ID_METADATA)
            if plan_id is not None and getattr(plan_id, "value", plan_id) == batch.plan_id:
                done.add(name)
                break
    return done


def unfinished_pipelines(
    instance: DagsterInstance, batch: Batch, keys: Mapping[str, AssetKey]
) -> list[str]:
    """The pipelines of ``batch`` (among ``keys``) still to materialize for it: what the
    coordinator resubmits and ``watermark run --retry`` runs again."""
    done = succeeded_pipelines(instance, batch, keys)
    return [p for p in batch.pipelines if p not in done and p in keys]


def consumers_from_graph(
    asset_graph: object,
    upstream_keys: Mapping[str, AssetKey],
    pipeline_names: Mapping[AssetKey, str],
) -> dict[str, set[str]]:
    """upstream -> pipelines that read it, from the code location's asset graph."""
    consumers: dict[str, set[str]] = {}
    for upstream, key in upstream_keys.items():
        node = asset_graph.get(key)  # type: ignore[attr-defined]
        consumers[upstream] = {
            pipeline_names[child] for child in node.child_keys if child in pipeline_names
        }
    return consumers
