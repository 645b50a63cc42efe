"""The shipped dagster.yaml, loaded into a real Dagster instance: run monitoring is on, and
the concurrency pool of the pipeline assets limits this code location's batch runs (not
every run of the instance), decided by the queued-run daemon's own dequeue pass. No JVM: the
code location is loaded in process and no run is launched.
"""

import importlib.util
import textwrap
from pathlib import Path

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, Definitions

# Private, and kept: the daemon's dequeue pass is what applies pool limits to queued runs;
# calling it (without launching) shows which runs it would start, with no run process.
from dagster._core.test_utils import in_process_test_workspace
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)

from watermark_dagster.dagster_defs.runs import WATERMARK_POOL
from watermark_dagster.definitions import build_demo_location

POOL_LIMIT = 2  # concurrency: pools: default_limit in the shipped dagster.yaml


def test_pipeline_assets_are_in_the_watermark_pool(tmp_path: Path) -> None:
    location = build_demo_location(tmp_path / "wm")
    defs = location.definitions
    pipelines = set(location.registry.pipelines)
    assert pipelines
    for assets_def in defs.resolve_asset_graph().assets_defs:
        keys = {key.to_user_string() for key in assets_def.keys}
        if keys & pipelines:
            assert assets_def.op.pool == WATERMARK_POOL, keys
    batch_job = defs.resolve_job_def("watermark_batch_job")
    assert {node.definition.pool for node in batch_job.graph.nodes} == {WATERMARK_POOL}


def test_shipped_dagster_yaml_enables_run_monitoring_and_run_scoped_pools(
    dagster_home: Path,
) -> None:
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_start_timeout_seconds > 0
        assert instance.run_monitoring_cancel_timeout_seconds > 0
        assert instance.run_monitoring_max_runtime_seconds == 0  # a first load may take long
        # The default run launcher cannot resume a run: resuming must stay off, or the
        # instance refuses to start monitoring.
        assert instance.run_monitoring_max_resume_run_attempts == 0
        pools = instance.get_concurrency_config().pool_config
        assert pools.pool_granularity is not None
        assert pools.pool_granularity.value == "run"
        assert pools.default_pool_limit == POOL_LIMIT
        # A queued batch run is launched within a second, not Dagster's default five: the
        # run queue daemon's loop is the one wait between the coordinator's request and
        # the run that this file can shorten (the sensor daemon's loop is fixed).
        assert getattr(instance.run_coordinator, "dequeue_interval_seconds", None) == 1


def test_queue_starts_at_most_the_pool_limit_of_batch_runs_and_other_runs_freely(
    dagster_home: Path, tmp_path: Path
) -> None:
    # The demo code location plus a job of another kind (no pool), as one code location.
    module = tmp_path / "location.py"
    module.write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path

            from dagster import Definitions, job, op

            from watermark_dagster.definitions import build_demo_definitions


            @op
            def touch() -> None:
                pass


            @job
            def other_job() -> None:
                touch()


            defs = Definitions.merge(
                build_demo_definitions(Path({str(tmp_path / "wm")!r})),
                Definitions(jobs=[other_job]),
            )
            """
        )
    )
    spec = importlib.util.spec_from_file_location("deploy_location", module)
    assert spec is not None
    assert spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    defs: Definitions = loaded.defs

    origin = LoadableTargetOrigin(
        python_file=str(module), attribute="defs", working_directory=str(tmp_path)
    )
    with (
        DagsterInstance.from_config(str(dagster_home)) as instance,
        in_process_test_workspace(instance, origin) as workspace,
    ):
        (entry,) = workspace.get_code_location_entries().values()
        assert entry.code_location is not None, entry.load_error
        (repository,) = entry.code_location.get_repositories().values()

        def queue(job_name: str) -> DagsterRun:
            remote = repository.get_full_job(job_name)
            return instance.create_run_for_job(
                defs.resolve_job_def(job_name),
                status=DagsterRunStatus.QUEUED,
                remote_job_origin=remote.get_remote_origin(),
                job_code_origin=remote.get_python_origin(),
            )

        # Oldest first: three batch runs, then a run outside the pool.
        batch_runs = [queue("watermark_batch_job") for _ in range(3)]
        other = queue("other_job")
        for run in batch_runs:
            assert run.run_op_concurrency is not None
            assert run.run_op_concurrency.all_pools == {WATERMARK_POOL}
        assert other.run_op_concurrency is None

        daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
        config = instance.get_concurrency_config()
        # Dagster gives a pool its `default_limit` the first time the queue sees it (that
        # pass does not apply it yet); from then on the limit holds.
        daemon._get_runs_to_dequeue(instance, config, None)
        limits = {p.name: p.limit for p in instance.event_log_storage.get_pool_limits()}
        assert limits == {WATERMARK_POOL: POOL_LIMIT}
        chosen = [r.run_id for r in daemon._get_runs_to_dequeue(instance, config, None)]
        assert chosen == [r.run_id for r in batch_runs[:POOL_LIMIT]] + [other.run_id]
