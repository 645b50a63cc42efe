"""``watermark replay`` from the Dagster UI: a job whose launchpad config names the
upstream, the versions and the pipelines.

The job records the same REPLAY batch as the command (see
:mod:`watermark_dagster.operations.replay`): the range is pinned, the other upstreams
where the scheduled batch that applied the range's end pinned them, and the replay
writes at that batch's position, so newer rows are left alone (I5) and no committed
watermark moves. Each pipeline's materialization of the replay's batch partition is
recorded as the batch job records it (ranges, rows, write figures), and the pipelines'
``watermark_stuck_batch`` checks are evaluated after them, in the same run, so the UI
shows them evaluated for the new materializations.
"""

from collections.abc import Mapping, Sequence

from dagster import (
    AssetKey,
    AssetMaterialization,
    Config,
    Failure,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    job,
    op,
)
from pydantic import Field

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.core.resuming import RetryPolicy
from watermark_dagster.dagster_defs.names import DEFAULT_NAMES, REPLAY_OP, LocationNames
from watermark_dagster.dagster_defs.resources import SparkSessionResource, WatermarkStoreResource
from watermark_dagster.dagster_defs.runs import error_failure_metadata
from watermark_dagster.errors import UsageError, WatermarkError, error_line


class ReplayConfig(Config):
    """The launchpad config of the replay job: what ``watermark replay -t UPSTREAM
    --from-version A --to-version B [-p PIPELINE ...]`` takes.

    Example (launchpad YAML):
        ops:
          watermark_replay:
            config: {upstream: orders, from_version: 3, to_version: 5}
    """

    upstream: str = Field(description="The upstream whose applied versions are re-read.")
    from_version: int = Field(description="First version of the range (inclusive).")
    to_version: int = Field(
        description="Last version of the range (inclusive); at most the committed watermark."
    )
    pipelines: list[str] = Field(
        default_factory=list,
        description="Merge pipelines reading the upstream to replay through (default: all).",
    )
    reason: str | None = Field(default=None, description="Recorded with the replay batch.")


def _checked(config: ReplayConfig, registry: Registry) -> VersionRange:
    """The config's range, refused with a message naming the value and the fix."""
    if config.upstream not in registry.upstreams:
        raise UsageError(
            f"upstream {config.upstream!r} is not in the registry; upstreams: "
            f"{sorted(registry.upstreams)}.",
            fix="set `upstream` to one of them.",
        )
    if config.from_version < 0 or config.to_version < config.from_version:
        raise UsageError(
            f"upstream {config.upstream!r}: from_version {config.from_version} to to_version "
            f"{config.to_version} is no range of versions.",
            upstream=config.upstream,
            fix="give 0 <= from_version <= to_version.",
        )
    return VersionRange(config.from_version, config.to_version)


def build_replay_job(
    registry: Registry,
    pipeline_keys: Mapping[str, AssetKey],
    names: LocationNames = DEFAULT_NAMES,
    policy: RetryPolicy | None = None,
) -> JobDefinition:
    """The job that replays an applied version range of one upstream, configured in the
    launchpad with :class:`ReplayConfig`; ``names`` gives its name, its op's, the batch
    partitions' and the resource keys, ``policy`` the coordinator's (its stuck-batch
    checks are evaluated with it after the replay)."""
    policy = policy or RetryPolicy()

    @op(
        name=names.of(REPLAY_OP),
        required_resource_keys={names.spark_resource, names.store_resource},
    )
    def watermark_replay(context: OpExecutionContext, config: ReplayConfig) -> None:
        """Record the REPLAY batch, run its pipelines in this process, end it."""
        from watermark_dagster.dagster_defs.health_stuck import runs_scope, stuck_evaluations
        from watermark_dagster.dagster_defs.pipeline_outcomes import (
            nothing_to_do_events,
            outcome_metadata,
        )
        from watermark_dagster.dagster_defs.replay_backfill import REPLAY_TAG, replay_metadata
        from watermark_dagster.dagster_defs.targets import target_metadata
        from watermark_dagster.operations.replay import plan_replay, run_replay
        from watermark_dagster.operations.run_pipeline import execute_pipeline

        spark: SparkSessionResource = names.resource(context, names.spark_resource)
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        store = watermark_store.get_store()
        run_id = context.run.run_id

        def execute(batch_id: str, pipelines: Sequence[str]) -> list[str | None]:
            context.instance.add_dynamic_partitions(names.batches_partitions, [batch_id])
            context.instance.add_run_tags(run_id, {REPLAY_TAG: batch_id})
            # The pipelines the replay does not concern show its partition done, not
            # missing (as the finalizer does for a scheduled batch).
            for event in nothing_to_do_events(store.get_batch(batch_id), pipeline_keys):
                context.log_event(event)
            errors: list[str | None] = []
            for name in pipelines:
                try:
                    outcome = execute_pipeline(
                        spark=spark.get_session(),
                        store=store,
                        registry=registry,
                        pipeline_name=name,
                        batch_id=batch_id,
                        run_id=run_id,
                    )
                except Exception as e:
                    context.log.error(f"{name} on replay batch {batch_id}: {e}")
                    errors.append(f"{name}: {error_line(e)}")
                    continue
                pipeline = registry.pipelines[name]
                context.log_event(
                    AssetMaterialization(
                        asset_key=pipeline_keys[name],
                        partition=batch_id,
                        metadata={
                            **target_metadata(pipeline),
                            **outcome_metadata(outcome),
                            **replay_metadata(store, outcome.batch),
                        },
                    )
                )
            # Every pipeline's partition got a materialization in this run (its replay, or
            # nothing to do): its checks are evaluated after it, as a batch's are.
            for evaluation in stuck_evaluations(
                context.instance,
                store,
                pipeline_keys,
                policy,
                scope=runs_scope(pipeline_keys, names),
            ):
                # Dagster takes check evaluations here (not in its annotation).
                context.log_event(evaluation)  # pyright: ignore[reportArgumentType]
            return errors

        try:
            rng = _checked(config, registry)
            plan = plan_replay(
                store, registry, config.upstream, rng, pipelines=config.pipelines or None
            )
            context.log.info(
                f"replay {plan.upstream} {plan.mode.value} {plan.range} through "
                f"{list(plan.pipelines)}: newer rows in the targets are left as they are; "
                "no watermark moves"
            )
            done = run_replay(
                store, registry, plan, execute=execute, actor=run_id, reason=config.reason
            )
        except WatermarkError as e:
            raise Failure(
                description=f"{type(e).__name__}: {e}",
                metadata=error_failure_metadata(e),
                allow_retries=False,
            ) from None
        summary = {
            "replay_batch_id": done.batch.batch_id,
            "upstream": plan.upstream,
            "range": str(plan.range),
            "mode": plan.mode.value,
            "pipelines": MetadataValue.json(list(plan.pipelines)),
            "written_at_position_of": done.batch.write_seq,
            "committed_version": plan.committed,
            "status": done.status.value,
        }
        context.log.info(
            f"replay batch {done.batch.batch_id}: {plan.upstream} {plan.range} -> "
            f"{done.status.value}; committed watermark of {plan.upstream} unchanged "
            f"({plan.committed})"
        )
        if done.failed:
            raise Failure(
                description=f"replay batch {done.batch.batch_id} failed: {done.error}",
                metadata={k: v for k, v in summary.items() if v is not None},
                allow_retries=False,
            )

    @job(
        name=names.replay_job,
        description="Replays an applied version range of one upstream through its merge "
        "pipelines, as `watermark replay` does: a REPLAY batch written at the position of "
        "the batch that applied it (newer rows untouched), no watermark moved. Configure "
        "upstream, from_version, to_version and pipelines in the launchpad.",
    )
    def watermark_replay_job() -> None:
        watermark_replay()

    return watermark_replay_job
