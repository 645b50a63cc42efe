"""The ``watermark_stuck_batch`` check: whether the open batch is stuck on a pipeline.

It fails (severity ERROR) while the open batch is stuck with that pipeline unfinished: the
coordinator stopped resubmitting it after a terminal error, ``max_attempts`` failed runs or
``max_deaths`` runs that died. It sits on the pipelines, not on the upstreams, because the
pipeline is where the failed runs and their error are; the upstreams the batch holds back
show it through their lag check. The coordinator reports it from every tick
(:class:`~watermark_dagster.dagster_defs.health_reporter.HealthReporter`), a replay run
after it materialized (:func:`stuck_evaluations`), and it can be run from the UI
(:func:`~watermark_dagster.dagster_defs.checks.build_health_checks`).
"""

from collections.abc import Collection, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    MetadataValue,
    RunsFilter,
)

from watermark_dagster.core.resuming import ResumeAction, ResumeStep, RetryPolicy, resume_step
from watermark_dagster.dagster_defs.check_family import check_evaluation
from watermark_dagster.dagster_defs.names import LocationNames
from watermark_dagster.dagster_defs.runs import BATCH_TAG, batch_runs, owns_run
from watermark_dagster.operations.coordinate import unfinished

if TYPE_CHECKING:
    from watermark_dagster.store import WatermarkStore

STUCK_CHECK = "watermark_stuck_batch"
# The longest run error a stuck-batch check quotes.
ERROR_CHARS = 500
UNSTICK_FIX = (
    "fix the cause shown by the batch's failed runs, then run `watermark run --retry` (or "
    "re-execute the batch partition from the UI); `watermark batch {batch}` shows the batch."
)


def last_failure(
    instance: DagsterInstance,
    batch_id: str,
    *,
    pipeline_keys: AbstractSet[AssetKey] | None = None,
) -> str | None:
    """The error of the newest failed run the coordinator launched for ``batch_id``: its
    first step failure's message (else the run failure's), None when there is none.
    ``pipeline_keys``, when given, keeps only runs of those assets (see
    :func:`~watermark_dagster.dagster_defs.runs.batch_runs`)."""
    runs = instance.get_runs(
        RunsFilter(tags={BATCH_TAG: batch_id}, statuses=[DagsterRunStatus.FAILURE]),
        limit=1 if pipeline_keys is None else None,
    )
    runs = [r for r in runs if owns_run(r, pipeline_keys)][:1]
    if not runs:
        return None
    for kind in (DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE):
        for entry in instance.all_logs(runs[0].run_id, of_type=kind):
            event = entry.dagster_event
            if event is None:
                continue
            error = event.step_failure_data.error if event.is_step_failure else None
            while error is not None and error.cause is not None:
                error = error.cause  # the user code's own error, not Dagster's wrapper
            text = error.message.strip() if error is not None else (event.message or "")
            if text:
                return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."
    return None


def stuck_result(
    pipeline: str, step: ResumeStep | None, error: str | None = None, *, after: str | None = None
) -> tuple[bool, str, str, dict[str, Any]]:
    """``(passed, outcome, description, metadata)`` of one pipeline's stuck-batch check,
    from the coordinator's decision for the open batch (None: no batch is open; ``after``
    the last batch it saw, ended since) and the error of its newest failed run (see
    :func:`last_failure`)."""
    if step is None:
        if after is None:
            return (
                True,
                "ok",
                f"No batch is open; '{pipeline}' is not held.",
                {"pipeline": pipeline},
            )
        # The outcome names the batch that ended: a passing result is reported again after
        # each batch, so it is newer than the batch's materializations, which the UI needs
        # to show it for the latest one (not "Not evaluated").
        return (
            True,
            f"ok:after:{after}",
            f"No batch is open (batch {after} ended); '{pipeline}' is not held.",
            {"pipeline": pipeline, "last_batch_id": after},
        )
    meta: dict[str, Any] = {"pipeline": pipeline, "batch_id": step.batch_id}
    if step.action is not ResumeAction.STUCK or pipeline not in step.pipelines:
        return True, "ok", f"Batch {step.batch_id} is not stuck on '{pipeline}'.", meta
    meta["failed_runs"] = MetadataValue.int(step.facts.failed)
    meta["unfinished"] = ", ".join(step.pipelines)
    if step.facts.terminal is not None:
        meta["error"] = step.facts.terminal.error
    elif error:
        meta["error"] = error
    meta["fix"] = UNSTICK_FIX.format(batch=step.batch_id)
    description = f"Pipeline '{pipeline}' holds batch {step.batch_id}: {step.reason}"
    if step.facts.terminal is None and error:
        description += f" Last error: {error}"
    return False, f"stuck:{step.stuck_key}", description, meta


# The statuses of a check execution that has ended (by value: the enum is not exported).
_ENDED = ("SUCCEEDED", "FAILED")


def evaluated_before_latest(
    instance: DagsterInstance, pipeline_keys: Mapping[str, AssetKey]
) -> set[str]:
    """The pipelines whose newest ``watermark_stuck_batch`` execution has ended and belongs
    to another materialization than the pipeline's latest, so the UI shows the check "Not
    evaluated" (two queries, whatever the history).

    Dagster takes a check's newest execution to be the one its run planned last. Runs of
    one pipeline in flight at once (a backfill of several partitions, the pool letting two
    go) can end in another order than they started: the run that started last then holds
    the newest execution while another one holds the newest materialization. An execution
    still planned (its run is evaluating it) is left to its run."""
    checks = {AssetCheckKey(key, STUCK_CHECK): name for name, key in pipeline_keys.items()}
    executions = instance.event_log_storage.get_latest_asset_check_execution_by_key(list(checks))
    latest = {
        record.asset_entry.asset_key: record.asset_entry.last_materialization_record
        for record in instance.get_asset_records(list(pipeline_keys.values()))
    }
    behind: set[str] = set()
    for check, name in checks.items():
        materialized, execution = latest.get(check.asset_key), executions.get(check)
        if materialized is None or execution is None or execution.status.value not in _ENDED:
            # Nothing to show it for, never evaluated (the first tick reports it), or
            # still planned.
            continue
        if execution.run_id and execution.run_id == materialized.run_id:
            continue  # evaluated in the run that materialized
        evaluation = execution.evaluation
        target = evaluation.target_materialization_data if evaluation is not None else None
        if target is not None and target.storage_id == materialized.storage_id:
            continue
        if target is None and materialized.timestamp < execution.create_timestamp:
            continue
        behind.add(name)
    return behind


def runs_scope(
    pipeline_keys: Mapping[str, AssetKey], names: LocationNames
) -> frozenset[AssetKey] | None:
    """The pipelines whose runs a location counts as its own: all runs of a batch when it
    is unprefixed, else only its pipelines' (batch ids repeat across locations)."""
    return frozenset(pipeline_keys.values()) if names.prefix else None


def stuck_state(
    instance: DagsterInstance,
    store: "WatermarkStore",
    pipelines: Collection[str],
    policy: RetryPolicy,
    *,
    scope: AbstractSet[AssetKey] | None = None,
) -> tuple[ResumeStep | None, str | None]:
    """What the ``watermark_stuck_batch`` checks are evaluated from: the coordinator's
    decision for the open batch (None: no batch is open) and, when the batch is stuck, the
    error of its newest failed run (see :func:`stuck_result`)."""
    batch = store.open_batch()
    step = None
    if batch is not None:
        facts = batch_runs(instance, batch.batch_id, pipeline_keys=scope).facts
        todo = unfinished(store, batch, pipelines)
        step = resume_step(batch.batch_id, todo, facts, policy=policy)
    error = (
        last_failure(instance, step.batch_id, pipeline_keys=scope)
        if step is not None and step.action is ResumeAction.STUCK
        else None
    )
    return step, error


def stuck_evaluations(
    instance: DagsterInstance,
    store: "WatermarkStore",
    pipeline_keys: Mapping[str, AssetKey],
    policy: RetryPolicy,
    *,
    scope: AbstractSet[AssetKey] | None = None,
) -> list[AssetCheckEvaluation]:
    """Every pipeline's ``watermark_stuck_batch`` check evaluated now, as the check's own
    op evaluates it, as events a run logs after it materialized the pipelines outside the
    batch job (a replay from the launchpad): without them the check shows "Not evaluated"
    for the new materializations until the coordinator next reports a change."""
    step, error = stuck_state(instance, store, pipeline_keys.keys(), policy, scope=scope)
    events = []
    for name, key in sorted(pipeline_keys.items()):
        passed, _, description, meta = stuck_result(name, step, error)
        events.append(check_evaluation(AssetCheckKey(key, STUCK_CHECK), passed, description, meta))
    return events
