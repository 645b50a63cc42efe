"""The pipelines as Dagster assets: one batch-partitioned asset per pipeline
(:func:`build_pipeline_asset`) that decides, without Spark, whether to run, skip or replay
a batch, runs it on the run's Spark session, and reports the outcome.
"""

from collections.abc import Iterator

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    DataVersion,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    asset,
)

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.records import Batch, BatchKind, BatchStatus
from watermark_dagster.dagster_defs.names import DEFAULT_NAMES, LocationNames
from watermark_dagster.dagster_defs.pipeline_outcomes import (
    nothing_to_do_metadata,
    outcome_metadata,
    report_skip,
)
from watermark_dagster.dagster_defs.replay_backfill import REPLAY_TAG, replay_metadata, start_replay
from watermark_dagster.dagster_defs.resources import SparkSessionResource, WatermarkStoreResource
from watermark_dagster.dagster_defs.runs import (
    ATTEMPT_TAG,
    PIPELINE_METADATA,
    WATERMARK_POOL,
    died_tags,
    error_failure_metadata,
    terminal_error_tags,
    worker_tags,
)
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.dagster_defs.targets import TARGET_VERSION_KEY, target_metadata
from watermark_dagster.dagster_defs.translator import WatermarkTranslator
from watermark_dagster.errors import (
    QueryRefusedError,
    TerminalError,
    WatermarkError,
    error_line,
    one_line,
)
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.decide import (
    PipelineDecision,
    PipelineOutcome,
    SkipKind,
    decide_pipeline,
)
from watermark_dagster.runtime.connect import EngineUnavailableError
from watermark_dagster.store import WatermarkStore

# Run tag naming where a run's Spark ran: "connect:<url>" (the home's engine), "remote:<url>"
# or "process".
ENGINE_TAG = "watermark/engine"


def _run(
    context: AssetExecutionContext,
    spark: SparkSessionResource,
    store: WatermarkStore,
    registry: Registry,
    decision: PipelineDecision,
) -> PipelineOutcome:
    """Run a decided pipeline on the run's session: a Connect session on the home's engine
    when one is used, else this process's own (the run's ``watermark/engine`` tag says
    which).

    Raises:
        EngineUnavailableError: the engine went away under the run (retryable: the write is
            one Delta commit, and a retry skips what that commit applied).
    """
    # Imported here: the read and write modules import PySpark, which loading the
    # definitions must not (a code server, sensors and skipped runs never need it).
    from watermark_dagster.operations.run_pipeline import run_pipeline

    session = spark.get_session()
    context.instance.add_run_tags(context.run.run_id, {ENGINE_TAG: spark.engine_label()})
    try:
        return run_pipeline(
            spark=session,
            store=store,
            registry=registry,
            decision=decision,
            run_id=context.run.run_id,
        )
    except Exception as e:
        lost = engine_lost(e, spark) or refused_query(e, decision)
        if lost is None:
            raise
        raise lost from e


def refused_query(error: BaseException, decision: PipelineDecision) -> WatermarkError | None:
    """``error`` as a :class:`QueryRefusedError` when Spark's analyzer refused a query of
    the run (a column, table, schema or path that is not there, a type that does not fit):
    the same query refuses again on every retry, so the batch fails once and says what to
    fix. Other errors (an executor lost, a commit conflict) are None: retries may help."""
    from pyspark.errors import AnalysisException

    if not isinstance(error, AnalysisException):
        return None
    batch = decision.batch.batch_id
    return QueryRefusedError(
        f"Spark refused a query of pipeline '{decision.pipeline.name}' in batch {batch}: "
        f"{one_line(str(error))[:1500]}",
        pipeline=decision.pipeline.name,
        batch_id=batch,
        fix="the transform, or a table or path the registry names, does not match what is "
        "there: fix it, then `watermark run --retry` (the target is written in one commit: a "
        "retry skips what was applied).",
    )


def engine_lost(error: BaseException, spark: SparkSessionResource) -> WatermarkError | None:
    """``error`` as an :class:`EngineUnavailableError` when the run's session was on the
    home's engine and that server is gone or was replaced since (it died under the run),
    else None (the error is the pipeline's own)."""
    used = spark.used_engine()
    if used is None:
        return None
    from watermark_dagster.runtime.connect import live_engine

    now = live_engine(spark.engine_record_folder())
    if now is not None and now.server_pid == used.server_pid:
        return None
    return EngineUnavailableError(
        f"The engine's Spark Connect server ({used.url}, pid {used.server_pid}) went away "
        f"during the run ({type(error).__name__}); its log is {used.log}. The target is "
        "written in one Delta commit, so it is either applied or untouched; a retry skips "
        "what was applied.",
        fix="the coordinator retries the run once the engine is back (`watermark engine` "
        "restarts a server that died); read the engine's log if it keeps failing.",
    )


def build_pipeline_asset(
    pipeline: Pipeline,
    registry: Registry,
    translator: WatermarkTranslator,
    partitions_def: DynamicPartitionsDefinition,
    names: LocationNames = DEFAULT_NAMES,
    settings: WatermarkSettings | None = None,
) -> AssetsDefinition:
    """The batch-partitioned asset that runs ``pipeline`` on one batch; ``names`` gives the
    keys of its resources and I/O manager. With ``settings.finalize`` ``run`` (the
    default), its last step finalizes the batch (:mod:`.finalizing`)."""
    deps = [translator.get_asset_key(registry.upstreams[u]) for u in pipeline.upstreams]
    settings = settings or WatermarkSettings()
    finalizes = settings.finalize == "run"

    @asset(
        key=translator.get_asset_key(pipeline),
        deps=deps,
        partitions_def=partitions_def,
        group_name=translator.get_group_name(pipeline),
        description=translator.get_description(pipeline),
        metadata={**translator.get_metadata(pipeline), PIPELINE_METADATA: pipeline.name},
        kinds=translator.get_kinds(pipeline),
        # A run that skips records no materialization: the partition keeps the one of the
        # run that applied the batch.
        output_required=False,
        pool=WATERMARK_POOL,
        # Plain downstream assets load the target whole through dagster-deltalake's types.
        io_manager_key=names.targets_io_manager,
        required_resource_keys={names.spark_resource, names.store_resource},
    )
    def _pipeline_asset(context: AssetExecutionContext) -> Iterator[MaterializeResult]:
        spark: SparkSessionResource = names.resource(context, names.spark_resource)
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        context.instance.add_run_tags(context.run.run_id, worker_tags(context.run.run_id))
        fault_point("after_run_start", where=pipeline.name)
        store = watermark_store.get_store()
        # Runs the coordinator requested carry their attempt; any other run of a batch
        # partition was launched by hand (a UI backfill or materialization).
        by_hand = ATTEMPT_TAG not in context.run.tags
        replayed: Batch | None = None
        try:
            # Decide from the control tables first: a run that skips asks for no Spark
            # session, so it starts no JVM (the resource creates the session on first use).
            decision = decide_pipeline(
                store=store,
                registry=registry,
                pipeline_name=pipeline.name,
                batch_id=context.partition_key,
            )
            if decision.skip is SkipKind.NOT_IN_BATCH:
                # Done with nothing to do, as the finalizer records it.
                report_skip(context, decision)
                yield MaterializeResult(
                    metadata=nothing_to_do_metadata(decision.batch, pipeline.name)
                )
                return
            if decision.skip is not None:
                if not by_hand or _still_runs(store, decision.batch, context.run.run_id):
                    # The coordinator's retry, or a backfill of the open batch: as the
                    # coordinator's run would, it skips what the pipeline applied already.
                    report_skip(context, decision)
                    return
                # A backfill of an ended batch: a version-guarded replay of its ranges.
                replayed = decision.batch
                decision = start_replay(context, store, registry, decision)
            try:
                outcome = _run(context, spark, store, registry, decision)
            except BaseException as e:
                if replayed is not None:
                    store.set_batch_status(
                        decision.batch.batch_id,
                        BatchStatus.FAILED,
                        actor=context.run.run_id,
                        error=error_line(e, limit=4000),
                    )
                raise
            if replayed is not None:
                store.set_batch_status(
                    decision.batch.batch_id, BatchStatus.COMPLETED, actor=context.run.run_id
                )
        except WatermarkError as e:
            # Our own error reaches Dagster as a Failure naming it (table, versions, fix),
            # which the UI shows and the headless runner reports as is.
            terminal = isinstance(e, TerminalError)
            if isinstance(e, EngineUnavailableError):
                # The engine went away under the run: a death, not an error of the batch's.
                context.instance.add_run_tags(
                    context.run.run_id,
                    died_tags(context.run.run_id, f"its Spark engine went away: {e.reason}"),
                )
            if terminal:
                # Retrying cannot help: the coordinator reads this tag and stops the batch.
                context.instance.add_run_tags(
                    context.run.run_id, terminal_error_tags(context.run.run_id, pipeline.name, e)
                )
            raise Failure(
                description=f"{type(e).__name__}: {e}",
                metadata=error_failure_metadata(e),
                allow_retries=not terminal,
            ) from (None if terminal else e)
        metadata, version = _run_metadata(context, store, pipeline, outcome, replayed)
        yield MaterializeResult(
            metadata=metadata,
            data_version=DataVersion(str(version)) if version is not None else None,
        )
        if pipeline.declared is not None:
            # Its watermark_drift check, for this materialization (a full batch measured
            # drift; another says it did not).
            from watermark_dagster.dagster_defs.health_drift import drift_evaluation

            evaluation = drift_evaluation(context.asset_key, pipeline.name, metadata)
            context.log_event(evaluation)  # pyright: ignore[reportArgumentType]
        if finalizes and outcome.batch.kind is BatchKind.SCHEDULED:
            _finalize_in_run(context, store, registry, translator, settings, names)

    return _pipeline_asset


def _run_metadata(
    context: AssetExecutionContext,
    store: WatermarkStore,
    pipeline: Pipeline,
    outcome: PipelineOutcome,
    replayed: Batch | None,
) -> tuple[dict, object]:
    """The materialization's metadata (Dagster's standard table metadata: uri, columns, row
    count, from one delta-rs load, no JVM; under the figures of this run's own write, which
    win on shared keys; a replay's) and the pipeline's data version: its target's Delta
    version after this batch (None: unknown)."""
    table = target_metadata(pipeline)
    version = outcome.write.target_version if outcome.write is not None else None
    if version is None and TARGET_VERSION_KEY in table:
        version = table[TARGET_VERSION_KEY].value
    metadata: dict = {**table, **outcome_metadata(outcome)}
    if outcome.batch.kind is BatchKind.REPLAY:
        metadata.update(replay_metadata(store, outcome.batch, replayed))
        # A backfill tagged its run when it recorded the replay; `watermark replay` runs
        # the replay batch's own partition.
        context.instance.add_run_tags(context.run.run_id, {REPLAY_TAG: outcome.batch.batch_id})
    return metadata, version


def run_actor(run_id: str) -> str:
    """Who a run's finalize is recorded as: ``run:`` and the short id the Dagster UI shows."""
    return f"run:{run_id[:8]}"


def _still_runs(store: WatermarkStore, batch: Batch, run_id: str) -> bool:
    """Whether a hand-launched run ``run_id`` of ``batch`` runs it as the coordinator's
    would (skipping what is applied): the batch is open, or another step of this same run
    completed it (finalizing in its last step), so it is not an ended batch to replay."""
    if batch.status is BatchStatus.PLANNED:
        return True
    if batch.status is not BatchStatus.COMPLETED:
        return False
    actor = run_actor(run_id)
    return any(
        h["event"] == "BATCH_COMPLETED" and h["actor"] == actor
        for h in store.history(batch_id=batch.batch_id)
    )


def _finalize_in_run(
    context: AssetExecutionContext,
    store: WatermarkStore,
    registry: Registry,
    translator: WatermarkTranslator,
    settings: WatermarkSettings,
    names: LocationNames,
) -> None:
    """The run's last step: finalize its batch (:mod:`.finalizing`), reporting what the
    finalizer sensor would. A control-table error here does not fail the run, whose
    pipeline succeeded: the finalizer sensor finalizes the batch at its next tick."""
    from watermark_dagster.dagster_defs.finalizing import after_completion, finalize_reported

    actor = run_actor(context.run.run_id)
    try:
        batch = store.get_batch(context.partition_key)  # as it is now: others may have run
        if batch.status is not BatchStatus.PLANNED:
            return
        finalized = finalize_reported(
            store,
            batch,
            registry=registry,
            observer=Observer(),
            upstream_keys={n: translator.get_asset_key(u) for n, u in registry.upstreams.items()},
            pipeline_keys={n: translator.get_asset_key(p) for n, p in registry.pipelines.items()},
            actor=actor,
            log=context.log,
        )
        for event in finalized.events:
            context.log_event(event)
        if not finalized.step.complete:
            return
        pruning = after_completion(
            context.instance,
            store,
            batch,
            settings=settings,
            partitions_name=names.batches_partitions,
            log=context.log,
        )
        for key in pruning.delete:
            context.instance.delete_dynamic_partition(pruning.partitions_name, key)
    except WatermarkError as e:
        context.log.warning(
            f"batch {context.partition_key}: not finalized in this run ({e}); the finalizer "
            "sensor finalizes it at its next tick"
        )
