"""The headless Dagster runner as the executor of one batch, for ``watermark replay``.

The batch runs as a Dagster run of the batch job in this process (its materializations
show in the UI like any other), then the command's Spark session is stopped.
"""

from collections.abc import Sequence

from watermark_dagster.cli.context import Context
from watermark_dagster.operations.replay import BatchExecutor


def headless_executor(ctx: Context) -> BatchExecutor:
    """A :class:`~watermark_dagster.operations.replay.BatchExecutor` running the batch's
    pipelines through :class:`~watermark_dagster.dagster_defs.headless.HeadlessRunner` on
    the current Dagster instance."""

    def execute(batch_id: str, pipelines: Sequence[str]) -> list[str | None]:
        from dagster import AssetCheckKey, DagsterInstance, RunRequest, SensorResult

        from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
        from watermark_dagster.dagster_defs.health_stuck import STUCK_CHECK
        from watermark_dagster.dagster_defs.pipeline_outcomes import nothing_to_do_events
        from watermark_dagster.dagster_defs.replay_backfill import REPLAY_TAG
        from watermark_dagster.dagster_defs.runs import ATTEMPT_TAG, BATCH_TAG

        instance = DagsterInstance.get()
        names = ctx.location.names
        instance.add_dynamic_partitions(names.batches_partitions, [batch_id])
        runner = HeadlessRunner(ctx.defs, instance, name=names.prefix)
        # The pipelines the batch does not concern show its partition done, not missing.
        for event in nothing_to_do_events(ctx.store.get_batch(batch_id), runner.pipeline_keys):
            instance.report_runless_asset_event(event)
        report = CycleReport()
        keys = [runner.pipeline_key(p) for p in pipelines]
        spark = ctx.spark()
        try:
            runner.execute_requests(
                SensorResult(
                    run_requests=[
                        RunRequest(
                            partition_key=batch_id,
                            asset_selection=keys,
                            tags={ATTEMPT_TAG: "1", BATCH_TAG: batch_id},
                        )
                    ]
                ),
                report,
            )
        finally:
            spark.stop()
        # The batch job leaves the pipelines' checks to the coordinator, which reports them
        # when a batch ends; a replay ends no batch of its: they are evaluated here, after
        # every materialization of the replay's partition (replayed or nothing to do).
        runner.evaluate_checks(
            [AssetCheckKey(k, STUCK_CHECK) for k in runner.pipeline_keys.values()],
            {REPLAY_TAG: batch_id},
        )
        return [r.error for r in report.failed_runs]

    return execute
