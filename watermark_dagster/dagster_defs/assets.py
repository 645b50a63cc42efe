"""Dagster assets: upstreams as observable sources, pipelines as batch-partitioned assets."""

import json
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    BetaWarning,
    DataVersion,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    ObserveResult,
    asset,
    multi_observable_source_asset,
)

from watermark_dagster.config.declared import describe
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import CursorUpstream, Upstream
from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.observations import Observation
from watermark_dagster.core.ranges import ReadMode
from watermark_dagster.core.records import Batch, BatchKind, BatchStatus, batch_id_for
from watermark_dagster.dagster_defs.names import (
    BATCHES_PARTITIONS_NAME as BATCHES_PARTITIONS_NAME,
)
from watermark_dagster.dagster_defs.names import (
    DEFAULT_NAMES,
    UPSTREAMS_OP,
    LocationNames,
)
from watermark_dagster.dagster_defs.resources import SparkSessionResource, WatermarkStoreResource
from watermark_dagster.dagster_defs.runs import (
    ATTEMPT_TAG,
    DRIFT_METADATA,
    PIPELINE_METADATA,
    PLAN_ID_METADATA,
    WATERMARK_POOL,
    died_tags,
    error_failure_metadata,
    terminal_error_tags,
    worker_tags,
)
from watermark_dagster.dagster_defs.targets import TARGET_VERSION_KEY, target_metadata
from watermark_dagster.errors import (
    TerminalError,
    UpstreamUnavailableError,
    WatermarkError,
    error_line,
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


class WatermarkTranslator:
    """Maps upstreams and pipelines to Dagster assets; override a ``get_*`` hook to change
    one aspect (in the style of dagster-dbt's translator).

    Each hook takes an :class:`Upstream` or a :class:`Pipeline`. The asset of a pipeline
    also carries ``watermark/pipeline`` metadata naming it, whatever the hooks return: the
    headless runner finds pipeline assets by it.

    Example:
        >>> class Prefixed(WatermarkTranslator):
        ...     def get_asset_key(self, item):
        ...         return AssetKey(["lake", item.name])
        >>> defs = build_definitions(registry, control_root="/lake/_wm", translator=Prefixed())
    """

    def get_asset_key(self, item: Upstream | Pipeline) -> AssetKey:
        """Asset key (default: the name)."""
        return AssetKey([item.name])

    def get_group_name(self, item: Upstream | Pipeline) -> str:
        """Asset group (default: ``upstreams`` or ``pipelines``)."""
        return "pipelines" if isinstance(item, Pipeline) else "upstreams"

    def get_description(self, item: Upstream | Pipeline) -> str:
        """Asset description (default: the declared one, else where it reads or writes)."""
        if item.description:
            return item.description
        if isinstance(item, Pipeline):
            return f"Pipeline {item.name} → {item.target}"
        if isinstance(item, CursorUpstream):
            return f"{item.format} source at {item.path}, read by cursor {item.cursor!r}"
        return f"Delta table at {item.path}"

    def get_metadata(self, item: Upstream | Pipeline) -> dict[str, Any]:
        """Asset definition metadata (default: path or target, mode, keys)."""
        if isinstance(item, Pipeline):
            metadata: dict[str, Any] = {
                "dagster/uri": item.target,
                "target": MetadataValue.path(item.target),
                "keys": list(item.keys),
                "write": str(item.write),
            }
            if item.declared is not None:
                # Where each upstream's changes reach the target: what the derived
                # incremental transform recomputes.
                metadata["transform"] = f"declared ({describe(item.declared)['form']})"
                metadata["key_paths"] = MetadataValue.json(describe(item.declared)["key_paths"])
                if item.declared.sql is not None:
                    metadata["sql"] = MetadataValue.md(f"```sql\n{item.declared.sql}\n```")
            elif item.full_transform is not None:
                metadata["transform"] = "hand-written, with a full transform"
            if item.chooses_strategy:
                metadata["strategy"] = str(item.strategy)
            return metadata
        return {
            "dagster/uri": item.path,
            "path": MetadataValue.path(item.path),
            "mode": str(item.mode),
            "start_from": str(item.start_from),
            **(
                {"max_versions_per_batch": item.max_versions_per_batch}
                if item.max_versions_per_batch is not None
                else {}
            ),
        }

    def get_kinds(self, item: Upstream | Pipeline) -> set[str]:
        """Kinds shown on the asset (default: ``delta``, plus ``spark`` for pipelines)."""
        return {"spark", "delta"} if isinstance(item, Pipeline) else {"delta"}

    # Called by build_definitions until it calls get_asset_key itself (not documented).


def observation_metadata(obs: Observation, committed: int | None) -> dict[str, Any]:
    """What an upstream observation shows: versions, lag, CDF flag, identity."""
    if obs.is_cursor:
        return {"source_state": obs.state or "unknown", "path": MetadataValue.path(obs.path)}
    lag = obs.latest_version - (-1 if committed is None else committed)
    # Numbers stay numbers (the UI plots them); a value that does not exist is left out.
    return {
        "latest_version": obs.latest_version,
        **({"committed_version": committed} if committed is not None else {}),
        "lag_versions": lag,
        "cdf_enabled": obs.cdf_enabled,
        "table_id": obs.table_id,
        "schema_fingerprint": obs.schema_fingerprint,
        "path": MetadataValue.path(obs.path),
    }


def observation_event(obs: Observation, key: AssetKey, committed: int | None) -> AssetObservation:
    """An observation event a sensor can report.

    It carries the table's versions as metadata, not as a Dagster data version: Dagster
    marks a partition "Unsynced" when an upstream's data version differs from the one
    recorded when the partition was materialized. A batch partition's inputs are its pinned
    ranges, which never change (I3), so a newer upstream version is work for a new batch,
    never a reason to re-run a completed one; the upstream's data version therefore stays
    constant and completed batches stay in sync.
    """
    return AssetObservation(asset_key=key, metadata=observation_metadata(obs, committed))


def build_upstream_assets(
    registry: Registry,
    translator: WatermarkTranslator,
    observer: Observer,
    names: LocationNames = DEFAULT_NAMES,
) -> AssetsDefinition:
    """One observable source asset per upstream (observed without a JVM); ``names`` gives
    its op name and the key of the control tables' resource."""
    keys = {translator.get_asset_key(u): u for u in registry.upstreams.values()}
    specs = [
        AssetSpec(
            key=key,
            group_name=translator.get_group_name(u),
            description=translator.get_description(u),
            metadata=translator.get_metadata(u),
            kinds=translator.get_kinds(u),
        )
        for key, u in keys.items()
    ]

    def observe_upstreams(context: AssetExecutionContext) -> Iterator[ObserveResult]:
        watermark_store: WatermarkStoreResource = names.resource(context, names.store_resource)
        committed = watermark_store.get_store().committed_versions()
        for key in context.selected_asset_keys:
            upstream = keys[key]
            try:
                obs = observer.observe(upstream)
            except UpstreamUnavailableError as e:
                context.log.error(str(e))
                raise Failure(description=str(e), metadata=e.metadata()) from e
            # No data version, as for the sensors' observations (see observation_event).
            yield ObserveResult(
                asset_key=key, metadata=observation_metadata(obs, committed.get(upstream.name))
            )

    # multi_observable_source_asset is the current, non-deprecated form; it is marked beta.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        return multi_observable_source_asset(
            specs=specs,
            can_subset=True,
            name=names.of(UPSTREAMS_OP),
            required_resource_keys={names.store_resource},
        )(observe_upstreams)


def outcome_metadata(outcome: PipelineOutcome) -> dict[str, Any]:
    """Materialization metadata: per-upstream mode and range, rows read, and what the
    write committed (rows inserted, updated, deleted and copied; files added, removed and
    touched), taken from the target commits of this run only."""
    meta: dict[str, Any] = {
        "batch_id": outcome.batch.batch_id,
        "batch_seq": outcome.batch.seq,
        PLAN_ID_METADATA: outcome.batch.plan_id,
    }
    if outcome.skipped_reason:
        meta["skipped"] = outcome.skipped_reason
        if outcome.skip is not None:
            meta["skip_kind"] = outcome.skip.value
        return meta
    rows = []
    for r in outcome.inputs:
        prefix = f"{r.upstream}"
        meta[f"{prefix}/read_mode"] = r.mode
        # Numbers only, so the UI plots them: a snapshot covers every version up to its end
        # (start 0); a NOOP input read no range (no start); a cursor window has no versions.
        if r.end_version is not None:
            if r.start_version is not None:
                meta[f"{prefix}/start_version"] = MetadataValue.int(r.start_version)
            elif r.mode != ReadMode.NOOP.value:
                meta[f"{prefix}/start_version"] = MetadataValue.int(0)
            meta[f"{prefix}/end_version"] = MetadataValue.int(r.end_version)
        meta[f"{prefix}/rows_read"] = r.rows_read
        if r.files_read is not None:
            meta[f"{prefix}/files_read"] = r.files_read
        if r.window is not None:
            meta[f"{prefix}/window"] = r.window
        if r.window is not None:
            rng = r.window
        elif r.start_version is not None:
            rng = f"[{r.start_version}, {r.end_version}]"
        else:
            rng = f"@{r.end_version}"
        rows.append(f"| {r.upstream} | {r.mode} | {rng} | {r.rows_read} |")
    meta["ranges"] = MetadataValue.md(
        "| upstream | mode | versions | rows read |\n|---|---|---|---|\n" + "\n".join(rows)
    )
    meta["full_load"] = outcome.full_load
    if outcome.strategy is not None:
        meta.update(outcome.strategy.metadata())
    meta["rows_read"] = outcome.rows_read
    meta["rows_written"] = outcome.rows_written
    if outcome.write is not None:
        # Every figure comes from the commits this write made; none when it made none.
        write = outcome.write
        meta["committed"] = write.committed
        meta["rows_inserted"] = write.rows_inserted
        meta["rows_updated"] = write.rows_updated
        meta["rows_deleted"] = write.rows_deleted
        meta["rows_copied"] = write.rows_copied
        meta["files_added"] = write.files_added
        meta["files_removed"] = write.files_removed
        meta["files_touched"] = write.files_touched
        meta["target_version"] = write.target_version
        meta["already_applied"] = write.already_applied
        meta["write_conflicts"] = write.conflicts
        if write.drift is not None:
            # A full batch of a declared pipeline: the keys it corrected that its own
            # changes did not touch (the watermark_drift check reads them).
            meta[DRIFT_METADATA] = write.drift
            meta[f"{DRIFT_METADATA}_sample"] = MetadataValue.json(list(write.drift_sample))
    meta["attempt"] = outcome.attempt or 0
    return meta


# Run tag naming the pipelines of a run that skipped, e.g. "orders_enriched=superseded".
SKIPPED_TAG = "watermark/skipped"

_SKIP_WORDS = {
    SkipKind.SUPERSEDED: "SKIPPED (superseded): nothing written",
    SkipKind.ALREADY_APPLIED: "SKIPPED (already applied): nothing written",
    SkipKind.NOT_IN_BATCH: "SKIPPED (nothing changed for it in this batch): nothing written",
}


def report_skip(context: AssetExecutionContext, decision: PipelineDecision) -> None:
    """Say in the run's log, as a run tag the runs list shows, and as an observation of
    the batch partition, that a pipeline did nothing on this batch and why (a run that
    skipped would otherwise read only "RUN_SUCCESS")."""
    assert decision.skip is not None
    context.log.warning(
        f"{decision.pipeline.name} on batch {decision.batch.batch_id}: "
        f"{_SKIP_WORDS[decision.skip]}; {decision.skipped_reason}. No Spark session was started."
    )
    # One tag per run (Dagster allows one namespace level in tag keys), listing every
    # pipeline of the run that skipped.
    run = context.instance.get_run_by_id(context.run.run_id)
    earlier = (run.tags if run else {}).get(SKIPPED_TAG, "")
    entry = f"{decision.pipeline.name}={decision.skip.value}"
    context.instance.add_run_tags(
        context.run.run_id, {SKIPPED_TAG: f"{earlier}, {entry}" if earlier else entry}
    )
    # An observation, not a materialization: the partition keeps the materialization of
    # the run that applied the batch, with its ranges and write figures.
    context.log_event(
        AssetObservation(
            asset_key=context.asset_key,
            partition=decision.batch.batch_id,
            metadata=outcome_metadata(decision.skipped_outcome()),
        )
    )


def nothing_to_do_metadata(batch: Batch, pipeline: str) -> dict[str, Any]:
    """The materialization of a batch partition for a pipeline the batch did not need:
    none of its upstreams changed, so its target already reflects the batch (a replay:
    the replay does not concern it)."""
    why = (
        f"replay batch {batch.batch_id} does not concern '{pipeline}': its target is "
        "unchanged by it"
        if batch.kind is BatchKind.REPLAY
        else f"no upstream of '{pipeline}' changed in batch {batch.batch_id}: its target "
        "already reflects this batch"
    )
    return {
        "batch_id": batch.batch_id,
        "batch_seq": batch.seq,
        PLAN_ID_METADATA: batch.plan_id,
        "skipped": f"{why} (nothing to do, nothing written)",
        "skip_kind": SkipKind.NOT_IN_BATCH.value,
        "rows_read": 0,
        "rows_written": 0,
    }


def nothing_to_do_events(
    batch: Batch, pipeline_keys: Mapping[str, AssetKey]
) -> list[AssetMaterialization]:
    """Materializations of ``batch``'s partition for the pipelines it did not need, so
    the UI shows them done with nothing to do rather than missing (and "Materialize
    missing" launches no run for them)."""
    return [
        AssetMaterialization(
            asset_key=key,
            partition=batch.batch_id,
            metadata=nothing_to_do_metadata(batch, name),
        )
        for name, key in sorted(pipeline_keys.items())
        if name not in batch.pipelines
    ]


# Run tag naming the REPLAY batch a backfill of an applied batch partition recorded.
REPLAY_TAG = "watermark/replay_batch"


class ReapplyRefused(Failure):
    """A backfill (or manual materialization) of an applied batch partition whose replay
    is refused: the pipeline does not merge, or the batch pins nothing to replay.

    A :class:`dagster.Failure`, so Dagster records its description and metadata as the step
    failure's and retries nothing; its own name, so the run's error reads as a refusal and
    not as a crash (``ReapplyRefused: Not replayed: ...``). It is raised in the asset's body
    before any store write or Spark work.
    """


def refuse_replay(decision: PipelineDecision, error: WatermarkError) -> ReapplyRefused:
    """The failure of a backfill of a batch ``decision``'s pipeline already applied (or
    that a newer batch superseded) when its replay is refused by ``error``: it says why,
    nothing having been read or written. Its metadata: the batch, its status, the pipeline,
    why it was not replayed and the fix."""
    batch, name = decision.batch, decision.pipeline.name
    return ReapplyRefused(
        description=(
            f"Not replayed: '{name}' on batch {batch.batch_id} ({decision.skipped_reason}). "
            f"{error.reason} Nothing was read or written, and the partition keeps its "
            "materialization."
        ),
        metadata={
            "batch_id": batch.batch_id,
            "batch_status": batch.status.value,
            "pipeline": name,
            "skip_kind": str(decision.skip),
            "error": type(error).__name__,
            **({"fix": error.fix} if error.fix else {}),
        },
        allow_retries=False,
    )


def start_replay(
    context: AssetExecutionContext,
    store: WatermarkStore,
    registry: Registry,
    decision: PipelineDecision,
) -> PipelineDecision:
    """A backfill of an ended batch the pipeline already applied (or that a newer batch
    superseded) replays it: records a REPLAY batch re-reading that batch's ranges of the
    pipeline's upstreams, written at its position (newer rows are left alone, no watermark
    moves; what ``watermark replay`` does for each range), and returns the decision to run
    it. Decided without Spark; refused with :class:`ReapplyRefused` before anything is
    written when the replay cannot be made safe."""
    from watermark_dagster.operations.replay import plan_backfill_replay, start_backfill_replay

    name, batch = decision.pipeline.name, decision.batch
    run_id = context.run.run_id
    try:
        plan = plan_backfill_replay(store, registry, batch, name)
    except WatermarkError as e:
        raise refuse_replay(decision, e) from None
    replay = start_backfill_replay(
        store,
        registry,
        plan,
        actor=run_id,
        reason=f"backfill of batch {batch.batch_id} (Dagster run {run_id})",
    )
    context.instance.add_run_tags(run_id, {REPLAY_TAG: replay.batch_id})
    context.log.info(
        f"{name} on batch {batch.batch_id}: {decision.skipped_reason}. Replaying its ranges "
        f"as REPLAY batch {replay.batch_id} ("
        + ", ".join(f"{u} {i.describe()}" for u, i in sorted(replay.inputs.items()) if i.reads)
        + f"), written at the position of batch seq {replay.order_seq}: newer rows are left "
        "as they are and no committed watermark moves."
    )
    return decide_pipeline(
        store=store, registry=registry, pipeline_name=name, batch_id=replay.batch_id
    )


def replay_metadata(
    store: WatermarkStore, replay: Batch, replayed: Batch | None = None
) -> dict[str, Any]:
    """What the materialization of a replay says, wherever it ran (a backfill of an
    applied batch partition, the launchpad's replay job, ``watermark replay``): that it was
    a replay, of which batch, the ranges it re-read, why and by whom. ``replayed`` is the
    batch whose partition a backfill materializes again (its id names the partition).
    Reads the replay's own history rows (one bucket)."""
    planned = next(
        (h for h in store.history(batch_id=replay.batch_id) if h["event"] == "BATCH_PLANNED"),
        None,
    )
    raw = planned.get("detail") if planned else None
    detail: dict[str, Any] = json.loads(raw) if isinstance(raw, str) and raw else {}
    if replayed is not None:
        origin: str | None = replayed.batch_id
    else:
        origin = detail.get("replays") or (
            batch_id_for(replay.order_seq) if replay.order_seq is not None else None
        )
    ranges = ", ".join(f"{u} {i.describe()}" for u, i in sorted(replay.inputs.items()) if i.reads)
    what = (
        f"batch {origin}'s ranges re-read as REPLAY batch {replay.batch_id} ({ranges})"
        if replayed is not None or detail.get("replays")
        else f"{ranges}, applied by batch {origin}, re-read as REPLAY batch {replay.batch_id}"
    )
    meta: dict[str, Any] = {
        "replay": f"replayed: {what}, written at the position of batch seq "
        f"{replay.order_seq}; newer rows untouched, no committed watermark moved",
        "replay_of": origin or "",
        "replay_batch_id": replay.batch_id,
        "replay_batch_seq": replay.seq,
        "replay_ranges": ranges,
        "replay_reason": detail.get("reason") or "",
        "replay_actor": replay.actor or "",
    }
    if replayed is not None:
        # The partition is the replayed batch's: its id, not the replay's.
        meta.update(
            {
                "batch_id": replayed.batch_id,
                "batch_seq": replayed.seq,
                PLAN_ID_METADATA: replayed.plan_id,
            }
        )
    return meta


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
        lost = engine_lost(e, spark)
        if lost is None:
            raise
        raise lost from e


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
) -> AssetsDefinition:
    """The batch-partitioned asset that runs ``pipeline`` on one batch; ``names`` gives the
    keys of its resources and I/O manager."""
    deps = [translator.get_asset_key(registry.upstreams[u]) for u in pipeline.upstreams]

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
                if not by_hand or decision.batch.status is BatchStatus.PLANNED:
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
        # Dagster's standard table metadata (uri, columns, row count) from one delta-rs
        # load, no JVM; the figures of this run's own write win on shared keys.
        table = target_metadata(pipeline)
        # The pipeline's data version is its target's Delta version after this batch.
        version = outcome.write.target_version if outcome.write is not None else None
        if version is None and TARGET_VERSION_KEY in table:
            version = table[TARGET_VERSION_KEY].value
        metadata = {**table, **outcome_metadata(outcome)}
        if outcome.batch.kind is BatchKind.REPLAY:
            metadata.update(replay_metadata(store, outcome.batch, replayed))
            # A backfill tagged its run when it recorded the replay; `watermark replay`
            # runs the replay batch's own partition.
            context.instance.add_run_tags(context.run.run_id, {REPLAY_TAG: outcome.batch.batch_id})
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

    return _pipeline_asset
