"""What the sensors need to know about Dagster runs of a batch, and the tag and metadata
keys the adapters write and read (each defined here once).

Every query here is bounded by the open batch (one partition), never by history.
"""

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetKey,
    AssetSpec,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunsFilter,
)

# Private, and kept: Dagster 1.13 exports no constant for the "dagster/partition" run tag
# and no public run filter by partition; runs launched from the UI (re-executions,
# backfills) carry only this tag, not ours.
# RUN_FAILURE_REASON_TAG, private too: the tag Dagster 1.13 sets on a failed run with why
# it failed (a step failure, an exception, an interrupt, a lost worker). It tells a run
# that raised an error from one that died; the public RunFailureReason enum names its values.
from dagster._core.storage.tags import PARTITION_NAME_TAG, RUN_FAILURE_REASON_TAG

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.resuming import BatchRunFacts, RunDeath, TerminalFailure
from watermark_dagster.errors import ConfigurationError, TerminalError, WatermarkError

# A run is in flight until it reaches one of these. QUEUED and NOT_STARTED count as in
# flight: a run the daemon just submitted must not be submitted again.
FINISHED = frozenset(
    {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
)

WORKER_TAG = "watermark/worker"
# The run that WORKER_TAG describes: a re-execution from the UI copies its parent's tags,
# and must not be taken for a run whose worker is gone.
WORKER_RUN_TAG = "watermark/worker_run"
# Set on a run that died (killed, worker lost): how, when, and whether its RUN_DIED
# history row is written. It names its own run, as TERMINAL_TAG does.
DIED_TAG = "watermark/died"
# Dagster's failure reasons of a run that raised an error: it failed. Any other failed run
# (an interrupt, a lost or restarted run worker, a start timeout, a run marked failed from
# outside) died: it raised nothing.
ERROR_REASONS = frozenset({"STEP_FAILURE", "RUN_EXCEPTION", "JOB_INITIALIZATION_FAILURE"})
ATTEMPT_TAG = "watermark/attempt"
BATCH_TAG = "watermark/batch"
PLAN_ID_METADATA = "watermark/plan_id"
# Asset metadata naming the registry pipeline an asset runs (whatever its asset key).
PIPELINE_METADATA = "watermark/pipeline"
# Materialization metadata of a declared pipeline's full batch: the keys it corrected that
# its own changes did not touch (drift); `<this>_sample` holds up to two of them.
DRIFT_METADATA = "drift_keys"
# Failure metadata naming the class of our own error that failed a step (a WatermarkError).
ERROR_METADATA = "error"
# Set on a run whose pipeline raised a TerminalError: the coordinator does not resubmit it.
TERMINAL_TAG = "watermark/terminal_error"
# The Dagster concurrency pool of every pipeline asset. The shipped dagster.yaml counts pools
# per run (`concurrency: pools: granularity: run`), so a batch run, one JVM, holds one slot of
# it while in flight: the limit applies to this code location's batch runs, not to every run
# of the instance.
WATERMARK_POOL = "watermark_spark"


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


def error_failure_metadata(error: WatermarkError) -> dict[str, Any]:
    """The metadata of the ``Failure`` a pipeline asset raises for one of our errors: its
    fields (table, batch, versions, fix) and its class under :data:`ERROR_METADATA`."""
    return {**error.metadata(), ERROR_METADATA: type(error).__name__}


def _own_tag(run: DagsterRun, tag: str) -> dict[str, Any] | None:
    """The JSON value of ``tag`` on ``run`` when it names ``run`` itself; None when absent,
    unreadable, or copied from a parent run (a re-execution copies its parent's tags)."""
    raw = run.tags.get(tag)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("run_id") != run.run_id:
        return None
    return value


def _terminal_failure(run: DagsterRun) -> TerminalFailure | None:
    value = _own_tag(run, TERMINAL_TAG)
    if value is None:
        return None
    return TerminalFailure(value.get("pipeline"), value.get("error", ""), value.get("message", ""))


def _proc_start_time(pid: int) -> str | None:
    """Kernel start time of ``pid`` (distinguishes a reused pid); None where /proc is absent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def worker_identity(pid: int | None = None) -> str:
    """``host:pid:start`` of this process (or of ``pid``, a child of it), tagged on the
    run that executes a batch."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_proc_start_time(pid) or '-'}"


def worker_tags(run_id: str) -> dict[str, str]:
    """The tags that name this process as the worker of run ``run_id``."""
    return {WORKER_TAG: worker_identity(), WORKER_RUN_TAG: run_id}


def signal_text(signum: int) -> str:
    """``killed by SIGKILL (signal 9)``."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "an unknown signal"
    return f"killed by {name} (signal {signum})"


def died_tags(run_id: str, how: str, *, recorded: bool = False) -> dict[str, str]:
    """The tag that marks ``run_id`` as died, with how and when (see :data:`DIED_TAG`)."""
    value = {"run_id": run_id, "how": how, "at": time.time(), "recorded": recorded}
    return {DIED_TAG: json.dumps(value)}


def _death(run: DagsterRun) -> tuple[RunDeath, bool] | None:
    """The death recorded on ``run`` by :func:`died_tags`, and whether its history row is
    written; None when it carries none of its own."""
    value = _own_tag(run, DIED_TAG)
    if value is None:
        return None
    death = RunDeath(run.run_id, str(value.get("how") or "died"), float(value.get("at") or 0))
    return death, bool(value.get("recorded"))


def _raised_an_error(run: DagsterRun) -> bool:
    """Whether a failed run failed by an error it raised (not by dying)."""
    return run.tags.get(RUN_FAILURE_REASON_TAG) in ERROR_REASONS


def _failure_message(instance: DagsterInstance, run_id: str) -> str | None:
    """The message of the run's failure event (Dagster's run monitoring says there what
    it saw: a lost or restarted run worker, a start timeout)."""
    records = instance.get_records_for_run(
        run_id, of_type=DagsterEventType.RUN_FAILURE, ascending=False, limit=1
    ).records
    for record in records:
        message = (record.event_log_entry.dagster_event or record.event_log_entry).message
        if message:
            return " ".join(str(message).split())[:300]
    return None


def mark_died(instance: DagsterInstance, run: DagsterRun, how: str) -> RunDeath:
    """Mark the unfinished ``run`` failed as died (``how``), tagged so that the coordinator
    counts it as a death, not a failure."""
    tags = died_tags(run.run_id, how)
    instance.add_run_tags(run.run_id, tags)
    instance.report_run_failed(
        run,
        f"watermark: the run died ({how}); it raised no error. The coordinator requests its "
        "batch again after a backoff, without spending an attempt.",
    )
    return RunDeath(run.run_id, how, json.loads(tags[DIED_TAG])["at"])


def mark_deaths_recorded(instance: DagsterInstance, deaths: Iterable[RunDeath]) -> None:
    """Note on each run that its death's ``RUN_DIED`` history row is written."""
    for death in deaths:
        value = {"run_id": death.run_id, "how": death.how, "at": death.at, "recorded": True}
        instance.add_run_tags(death.run_id, {DIED_TAG: json.dumps(value)})


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
    """The Dagster runs of one batch partition: the facts the coordinator decides from,
    and the deaths whose ``RUN_DIED`` history row is not written yet (the coordinator
    writes it, then :func:`mark_deaths_recorded`)."""

    facts: BatchRunFacts
    unrecorded: tuple[RunDeath, ...] = ()


def owns_run(run: DagsterRun, pipeline_keys: AbstractSet[AssetKey] | None) -> bool:
    """Whether ``run`` belongs to the code location whose pipeline assets are
    ``pipeline_keys``: any run when that is None (one location per instance), else a run
    that materializes one of them. Batch ids (``b000001``, ...) repeat across the control
    roots of several locations in one instance; their runs tell them apart only by assets.
    """
    if pipeline_keys is None:
        return True
    return bool(run.asset_selection) and not run.asset_selection.isdisjoint(pipeline_keys)


def batch_runs(
    instance: DagsterInstance,
    batch_id: str,
    *,
    pipeline_keys: AbstractSet[AssetKey] | None = None,
) -> BatchRuns:
    """Classify the runs of a batch partition into in flight, succeeded, failed (an error
    was raised, or an operator canceled it) and died (nothing was raised: the process was
    killed, the run worker lost). A started run whose worker process is gone is marked
    died here; a death first seen here (marked by Dagster's run monitoring) is tagged with
    its failure message, once.

    ``facts.terminal`` is set when the newest finished run failed with a terminal error.
    ``pipeline_keys``, when given, keeps only the runs of those assets (:func:`owns_run`).
    """
    runs = instance.get_runs(RunsFilter(tags={PARTITION_NAME_TAG: batch_id}))  # newest first
    runs = [r for r in runs if owns_run(r, pipeline_keys)]
    in_flight: list[str] = []
    deaths: list[RunDeath] = []
    unrecorded: list[RunDeath] = []
    failed = 0
    last_attempt = 0
    newest_finished = next((r for r in runs if r.status in FINISHED), None)
    terminal = None
    if newest_finished is not None and newest_finished.status is DagsterRunStatus.FAILURE:
        terminal = _terminal_failure(newest_finished)
    last_died: bool | None = None
    for run in runs:
        last_attempt = max(last_attempt, int(run.tags.get(ATTEMPT_TAG, "0") or 0))
        death: RunDeath | None = None
        recorded = False
        if run.status not in FINISHED:
            identity = run.tags.get(WORKER_TAG)
            if (
                run.status is DagsterRunStatus.STARTED
                and identity
                and run.tags.get(WORKER_RUN_TAG, run.run_id) == run.run_id
                and worker_alive(identity) is False
            ):
                death = mark_died(
                    instance,
                    run,
                    f"its worker process {identity} is gone (no exit status was seen: "
                    "killed, or its host lost)",
                )
            else:
                in_flight.append(run.run_id)
                continue
        elif run.status is DagsterRunStatus.FAILURE and (
            (found := _death(run)) is not None or not _raised_an_error(run)
        ):
            if found is not None:
                death, recorded = found
            else:
                # Marked failed by Dagster's run monitoring (or from outside): tag it once.
                reason = run.tags.get(RUN_FAILURE_REASON_TAG)
                how = _failure_message(instance, run.run_id) or (
                    f"failed by Dagster ({reason})" if reason else "marked failed from outside"
                )
                tags = died_tags(run.run_id, how)
                instance.add_run_tags(run.run_id, tags)
                death = RunDeath(run.run_id, how, json.loads(tags[DIED_TAG])["at"])
        elif run.status is not DagsterRunStatus.SUCCESS:
            # A failed run; a canceled run counts as one too, so an operator's cancel is
            # not undone by endless resubmission.
            failed += 1
        if last_died is None:
            last_died = death is not None  # the newest run that ended
        if death is not None:
            deaths.append(death)
            if not recorded:
                unrecorded.append(death)
    facts = BatchRunFacts(
        tuple(in_flight),
        failed,
        last_attempt,
        terminal,
        deaths=tuple(deaths),
        last_died=bool(last_died),
    )
    return BatchRuns(facts, tuple(unrecorded))


def pipeline_keys_of(specs: Iterable[AssetSpec]) -> dict[str, AssetKey]:
    """Pipeline name -> asset key, from the asset specs' :data:`PIPELINE_METADATA`."""
    found = {}
    for spec in specs:
        name = (spec.metadata or {}).get(PIPELINE_METADATA)
        if name is not None:
            found[str(getattr(name, "value", name))] = spec.key
    return found


def check_consumers(
    registry: Registry, specs: Iterable[AssetSpec], upstream_keys: Mapping[str, AssetKey]
) -> None:
    """Check that the asset graph agrees with :meth:`Registry.consumers`: the pipeline
    assets depending on each upstream's asset are exactly the pipelines that read it.

    The finalizer advances an upstream once its registry consumers succeeded; the graph
    the UI shows (and backfills follow) must say the same.

    Raises:
        ConfigurationError: an upstream's dependents differ; names it and both lists.
    """
    specs = list(specs)
    names = {key: name for name, key in pipeline_keys_of(specs).items()}
    in_graph: dict[str, set[str]] = {u: set() for u in upstream_keys}
    by_key = {key: u for u, key in upstream_keys.items()}
    for spec in specs:
        if spec.key not in names:
            continue
        for dep in spec.deps:
            upstream = by_key.get(dep.asset_key)
            if upstream is not None:
                in_graph[upstream].add(names[spec.key])
    for upstream in sorted(upstream_keys):
        expected = registry.consumers(upstream)
        if tuple(sorted(in_graph[upstream])) != expected:
            raise ConfigurationError(
                f"Upstream '{upstream}': the asset graph has pipeline assets "
                f"{sorted(in_graph[upstream])} depending on it, but the registry's pipelines "
                f"reading it are {list(expected)}.",
                upstream=upstream,
                fix="build the pipeline assets from the registry (build_definitions) and give "
                "each upstream and pipeline its own asset key in the translator.",
            )


@dataclass(frozen=True)
class StoppedRuns:
    """What :func:`stop_batch_runs` did: the runs that were in flight and have ended, and
    those still in flight when the wait ran out (run id, status, worker)."""

    stopped: tuple[str, ...] = ()
    running: tuple[tuple[str, str, str], ...] = ()

    def describe_running(self) -> str:
        """``run 1a2b3c4d (STARTED, worker host:123:456)``, comma-separated."""
        return ", ".join(
            f"run {run_id} ({status}, worker {worker})" for run_id, status, worker in self.running
        )


def _local_worker_pid(run: DagsterRun) -> int | None:
    """The pid of ``run``'s worker when it runs on this host and is alive (and is not this
    process), else None."""
    identity = run.tags.get(WORKER_TAG)
    if not identity or run.tags.get(WORKER_RUN_TAG, run.run_id) != run.run_id:
        return None
    if worker_alive(identity) is not True or identity == worker_identity():
        return None
    return int(identity.rsplit(":", 2)[1])


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def stop_batch_runs(
    instance: DagsterInstance,
    batch_id: str,
    *,
    pipeline_keys: AbstractSet[AssetKey] | None = None,
    wait_seconds: float = 60.0,
    poll_seconds: float = 0.5,
    kill_after_seconds: float = 10.0,
    why: str = "a forced watermark change abandons its batch",
) -> StoppedRuns:
    """Stop the in-flight runs of batch ``batch_id`` and wait up to ``wait_seconds`` for
    each to end, as a forced change must before it abandons the batch.

    Each run is canceled through the instance's run coordinator (a queued run is dropped,
    a launched one terminated by its launcher). A run executed in a process the launcher
    cannot reach (``watermark run``, ``watermark replay``) is sent SIGTERM when its worker
    runs on this host, and SIGKILL ``kill_after_seconds`` later if it still runs. A run
    whose worker process is gone is marked canceled. Runs on another host that no
    launcher can stop stay in flight: they are returned in ``running`` once the wait runs
    out, and the caller refuses to go on.
    """

    def in_flight_now() -> tuple[str, ...]:
        return batch_runs(instance, batch_id, pipeline_keys=pipeline_keys).facts.in_flight

    def request_stop(run_id: str) -> None:
        run = instance.get_run_by_id(run_id)
        if run is None or run.status in FINISHED:
            return
        instance.report_engine_event(f"watermark: stopping this run: {why}.", run)
        canceled = False
        try:
            canceled = bool(instance.run_coordinator.cancel_run(run_id))
        except Exception:  # a launcher that cannot terminate says so by raising, too
            canceled = False
        pid = _local_worker_pid(run)
        if not canceled and pid is not None:
            _signal(pid, signal.SIGTERM)

    seen: list[str] = []
    found = in_flight_now()
    if not found:
        return StoppedRuns()
    started = time.monotonic()
    killed = False
    while True:
        for run_id in found:
            if run_id not in seen:
                seen.append(run_id)
                request_stop(run_id)
        running: list[tuple[str, str, str]] = []
        for run_id in seen:
            run = instance.get_run_by_id(run_id)
            if run is None or run.status in FINISHED:
                continue
            identity = run.tags.get(WORKER_TAG, "")
            own = run.tags.get(WORKER_RUN_TAG, run.run_id) == run.run_id
            if (
                own
                and identity
                and (worker_alive(identity) is False or identity == worker_identity())
            ):
                # Its process is gone (or is this one, busy with this command): it cannot
                # commit any more.
                instance.report_run_canceled(run, f"watermark: stopped: {why}.")
                continue
            if run.status in (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED):
                instance.report_run_canceled(run, f"watermark: dropped before it started: {why}.")
                continue
            running.append((run_id, run.status.value, identity or "unknown"))
        if not running:
            return StoppedRuns(stopped=tuple(seen))
        waited = time.monotonic() - started
        if waited >= wait_seconds:
            ended = tuple(r for r in seen if r not in {x[0] for x in running})
            return StoppedRuns(stopped=ended, running=tuple(running))
        if not killed and waited >= kill_after_seconds:
            killed = True
            for run_id, _status, _worker in running:
                run = instance.get_run_by_id(run_id)
                pid = None if run is None else _local_worker_pid(run)
                if pid is not None:
                    _signal(pid, signal.SIGKILL)
        time.sleep(poll_seconds)
        # Asked again each time: a coordinator may resubmit the batch while its runs stop.
        found = in_flight_now()
