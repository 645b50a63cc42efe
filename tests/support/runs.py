"""Dagster runs of a batch as a test needs them: finished as they really end.

A run that raised an error carries Dagster's failure reason (``STEP_FAILURE``); a run that
died does not (Dagster's run monitoring marks it failed from outside, with a message). The
coordinator tells them apart by that, so a test's failed run must carry it.
"""

from typing import Any

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus
from dagster._core.storage.tags import PARTITION_NAME_TAG, RUN_FAILURE_REASON_TAG
from dagster._core.test_utils import create_run_for_test


def finished_run(
    instance: DagsterInstance,
    request: Any,
    status: DagsterRunStatus,
    *,
    job_name: str = "watermark_batch_job",
    **tags: str,
) -> DagsterRun:
    """A finished run of the run request ``request``; a FAILURE is one whose step raised."""
    reason = {RUN_FAILURE_REASON_TAG: "STEP_FAILURE"} if status is DagsterRunStatus.FAILURE else {}
    return create_run_for_test(
        instance,
        job_name=job_name,
        status=status,
        tags={**request.tags, PARTITION_NAME_TAG: request.partition_key, **reason, **tags},
    )


def died_run(
    instance: DagsterInstance,
    request: Any,
    message: str,
    *,
    job_name: str = "watermark_batch_job",
) -> DagsterRun:
    """A run of ``request`` marked failed the way Dagster's run monitoring marks a run whose
    worker it lost: from outside, with a message and no failure reason."""
    run = create_run_for_test(
        instance,
        job_name=job_name,
        status=DagsterRunStatus.STARTED,
        tags={**request.tags, PARTITION_NAME_TAG: request.partition_key},
    )
    instance.report_run_failed(run, message)
    return run
