"""Running one pipeline on one batch: read the pinned inputs, transform, write, checkpoint.

No Dagster here: the asset is a thin wrapper, and tests or the command line can call
:func:`execute_pipeline` directly.
"""

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import cast

from pyspark.sql import DataFrame, SparkSession

from watermark_dagster.config.pipeline import Pipeline, Strategy
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.core.faults import SimulatedCrash, fault_point
from watermark_dagster.core.planning import delta_source_version
from watermark_dagster.core.ranges import CursorPosition, CursorWindow
from watermark_dagster.core.records import (
    Batch,
    BatchKind,
    BatchStatus,
    CheckpointStatus,
)
from watermark_dagster.core.strategy import MeasuredStrategy, StrategyChoice, choose_strategy
from watermark_dagster.errors import BatchStateError, TerminalError, error_line
from watermark_dagster.frames.delta import existing_target
from watermark_dagster.frames.stages import spark_stage
from watermark_dagster.operations.coordinate import committed_fingerprint
from watermark_dagster.operations.decide import (
    PipelineDecision,
    PipelineOutcome,
    decide_pipeline,
)
from watermark_dagster.operations.replay import refuse_reloading_replay
from watermark_dagster.operations.run_record import input_reports, log_run, register_target
from watermark_dagster.read.catalog import check_catalog_names
from watermark_dagster.read.cursor import PinWindow
from watermark_dagster.read.database_schema import check_batch_columns
from watermark_dagster.read.derive import DerivedOutput, transformed
from watermark_dagster.read.inputs import UpstreamInput
from watermark_dagster.read.unreadable import unreadable_in_run
from watermark_dagster.store import WatermarkStore
from watermark_dagster.write.commits import root_prefix
from watermark_dagster.write.fences import check_target_bound, target_mark
from watermark_dagster.write.targets import target_writer

log = logging.getLogger("watermark_dagster")


@dataclass
class PinnedBatch:
    """The :class:`~watermark_dagster.config.batch_context.BatchContext` a transform receives:
    the batch, and each upstream's :class:`UpstreamInput` as the batch pinned it."""

    batch_id: str
    seq: int
    pipeline: str
    inputs: Mapping[str, UpstreamInput]
    spark: SparkSession
    full_load: bool = False
    strategy: StrategyChoice | None = None

    def __getitem__(self, upstream: str) -> UpstreamInput:
        try:
            return self.inputs[upstream]
        except KeyError:
            raise KeyError(
                f"Pipeline '{self.pipeline}' does not read upstream '{upstream}'; it reads "
                f"{sorted(self.inputs)}. Add it to the pipeline's upstreams."
            ) from None


def _error_text(exc: BaseException) -> str:
    """The one line a failed checkpoint records (the whole error, stack included, is in
    the run's log)."""
    return error_line(exc, limit=4000)


def execute_pipeline(
    *,
    spark: SparkSession,
    store: WatermarkStore,
    registry: Registry,
    pipeline_name: str,
    batch_id: str,
    run_id: str | None = None,
) -> PipelineOutcome:
    """Run ``pipeline_name`` on batch ``batch_id`` and record its checkpoint:
    :func:`decide_pipeline`, then :func:`run_pipeline`.

    Raises:
        BatchStateError: the batch is unknown or abandoned.
        Exception: whatever the read, transform or write raised (after recording FAILED).
    """
    decision = decide_pipeline(
        store=store, registry=registry, pipeline_name=pipeline_name, batch_id=batch_id
    )
    return run_pipeline(
        spark=spark, store=store, registry=registry, decision=decision, run_id=run_id
    )


def run_pipeline(
    *,
    spark: SparkSession,
    store: WatermarkStore,
    registry: Registry,
    decision: PipelineDecision,
    run_id: str | None = None,
) -> PipelineOutcome:
    """Carry out ``decision``: read the pinned inputs, transform, write, checkpoint.

    A decision to skip returns its outcome and touches neither Spark nor the store.

    Raises:
        Exception: whatever the read, transform or write raised (after recording FAILED).
    """
    if decision.skip is not None:
        return decision.skipped_outcome()
    pipeline, batch = decision.pipeline, decision.batch
    pipeline_name, batch_id = pipeline.name, batch.batch_id
    root = store.root_id()
    mark = target_mark(pipeline, root)  # before this attempt can write (see TargetMark)
    attempt = store.begin_checkpoint(pipeline_name, batch_id, run_id=run_id, mark=mark)
    first = mark if attempt == 1 else store.first_mark(pipeline_name, batch_id)
    inputs: dict[str, UpstreamInput] = {}
    stage = partial(spark_stage, spark, pipeline_name, batch_id)
    replay = batch.kind is BatchKind.REPLAY
    try:
        # A target another control root wrote, or this root ahead of the batch (restored
        # from an older copy): refused before anything is read, skipped or written.
        check_target_bound(
            pipeline,
            batch_id,
            batch.write_seq,
            root,
            first_attempt=attempt == 1,
            first=first,
            replay=replay,
        )
        with stage("bind"):
            bound = _bind(spark, store, registry, pipeline, batch, inputs)
        context = PinnedBatch(
            batch_id, batch.seq, pipeline_name, inputs, spark, bound.full_load, bound.strategy
        )
        started = time.perf_counter()
        with stage("transform"):
            # The strategy the output was computed with: the one decided above, or the whole
            # form a declared `auto` batch switched to (a new value; the decision is
            # unchanged).
            derived = _transformed(pipeline, context)
            output, ran = derived.frame, derived.strategy
        # The fence of a forced change: a batch abandoned while this run read and
        # transformed is not written to (the next batch reads its ranges again, I4).
        _refuse_abandoned(store, pipeline_name, batch_id)
        # A rewrite (decided above, or by the transform past the keys the driver collects)
        # overwrites the target with the full transform's output, as a full load does.
        rewrite = ran is not None and ran.strategy is Strategy.REWRITE
        with stage("write"):
            try:
                write = target_writer(pipeline)(
                    spark,
                    output,
                    pipeline,
                    batch_id=batch_id,
                    write_seq=batch.write_seq,
                    full_load=bound.full_load or rewrite,
                    replay=replay,
                    retried=attempt > 1,
                    root=root,
                    first=first,
                    known_keys=derived.keys,
                )
            except Exception as e:  # files of a pinned input gone: named, as a read's are (I6)
                named = unreadable_in_run(inputs, e)
                if named is e:
                    raise
                raise named from e
        measured = (
            MeasuredStrategy(ran, round(time.perf_counter() - started, 3))
            if ran is not None
            else None
        )
        with stage("record"):
            reports = input_reports(registry, inputs, rewriting=bound.rewriting)
            register_target(spark, pipeline)
        log_run(pipeline, batch_id, reports, write, measured, full_load=bound.full_load)
        fault_point("after_target_commit", where=pipeline_name)
    except BaseException as exc:
        if isinstance(exc, SimulatedCrash):
            raise  # a stand-in for a killed process: nothing gets to record anything
        error = _error_text(exc)
        store.finish_checkpoint(
            pipeline_name,
            batch_id,
            attempt,
            CheckpointStatus.FAILED,
            error=error,
            actor=run_id,
            detail={"attempt": attempt, "error": error},
        )
        raise
    finally:
        for upstream_input in inputs.values():
            upstream_input.release()
    outcome = PipelineOutcome(
        pipeline_name, batch, attempt, reports, write, full_load=bound.full_load, strategy=measured
    )
    # A write Delta skipped (its commit landed before a crash) measured nothing: no seconds
    # are recorded, so `auto` weighs nothing from it. Its strategy may not be the one that
    # wrote the target (a configuration changed in between), so what is recorded is what
    # the batch's commit shows: an overwrite is a rewrite, which stamped every row with the
    # batch's position, so a replay ending inside the batch is allowed as after any
    # rewrite; a MERGE may have been `full`, recorded as unknown, which a replay inside the
    # batch treats as `full` (operations/replay.py).
    measuring = measured is not None and not replay and not write.already_applied
    recorded = measured.measured() if measuring and measured is not None else None
    if measured is not None and not replay and write.already_applied:
        rewritten = _rewritten(pipeline, batch_id, root)
        recorded = {"strategy": str(Strategy.REWRITE)} if rewritten else None
    # One control-table commit after the write: the checkpoint row that closes the attempt,
    # holding its history row (store/checkpoints.py).
    store.finish_checkpoint(
        pipeline_name,
        batch_id,
        attempt,
        CheckpointStatus.SUCCESS,
        rows_read=outcome.rows_read,
        rows_written=outcome.rows_written,
        actor=run_id,
        detail={
            "attempt": attempt,
            "rows_read": outcome.rows_read,
            "rows_written": outcome.rows_written,
            # What the strategy cost, for `auto` to weigh in later batches (a replay's
            # older ranges say nothing about the batches to come), or only the strategy
            # that wrote the batch (a retry's skipped write, above).
            **({"strategy": recorded} if recorded is not None else {}),
        },
    )
    fault_point("after_checkpoint")
    return outcome


@dataclass(frozen=True)
class _Bound:
    """The bind stage's result: the inputs as the batch pinned them, whether the pipeline
    loads in full, and the strategy chosen for it (None for a full load)."""

    inputs: dict[str, UpstreamInput]
    full_load: bool
    strategy: StrategyChoice | None

    @property
    def rewriting(self) -> bool:
        """Whether the batch was decided a rewrite, which reads each snapshot whole."""
        return self.strategy is not None and self.strategy.strategy is Strategy.REWRITE


def _bind(
    spark: SparkSession,
    store: WatermarkStore,
    registry: Registry,
    pipeline: Pipeline,
    batch: Batch,
    inputs: dict[str, UpstreamInput],
) -> _Bound:
    """Check the batch's catalog names, bind its inputs into ``inputs`` (which the run
    releases however it ends) and choose the strategy (from the log and the pipeline's
    measured history: no Spark job)."""
    full_load = pipeline.name in batch.full_load
    # I6 for catalog names: each must still point where the batch expects it, checked
    # through this run's own session before anything is read or written.
    check_catalog_names(spark, registry, pipeline, batch.locations, batch_id=batch.batch_id)
    registry = _at_planned_locations(registry, pipeline, batch)
    inputs.update(_bind_inputs(spark, store, registry, pipeline, batch, full_load=full_load))
    replay = batch.kind is BatchKind.REPLAY
    if replay:
        refuse_reloading_replay(pipeline, batch, inputs, full_load=full_load)
    if not full_load and any(i.reads_snapshot for i in inputs.values()):
        # An append-only range that changed rows, read as a snapshot as configured:
        # the pipeline reloads from snapshots of every upstream at their pinned ends.
        full_load = True
        for unused in inputs.values():
            unused.release()
        inputs.update(_bind_inputs(spark, store, registry, pipeline, batch, full_load=True))
    if full_load:
        return _Bound(inputs, True, None)
    weighs_history = pipeline.chooses_strategy and pipeline.strategy == Strategy.AUTO
    strategy = choose_strategy(
        pipeline,
        inputs,
        replay=replay,
        history=store.strategy_runs(pipeline.name) if weighs_history and not replay else (),
        change_feed=registry.change_feed(pipeline.name),
    )
    return _Bound(inputs, False, strategy)


def _transformed(pipeline: Pipeline, context: PinnedBatch) -> DerivedOutput:
    """:func:`transformed`, checked to be a DataFrame; a pinned input it could not read is
    named (I6: the transform's collects are the first to read a range)."""
    try:
        derived = transformed(pipeline, context)
    except Exception as e:
        named = unreadable_in_run(context.inputs, e)
        if named is e:
            raise
        raise named from e
    output = derived.frame
    # The transform is user code: its annotation promises a DataFrame, this checks it.
    if not isinstance(output, DataFrame):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TerminalError(
            f"Pipeline '{pipeline.name}': the transform returned {type(output).__name__}, "
            "not a Spark DataFrame.",
            pipeline=pipeline.name,
            batch_id=context.batch_id,
            fix="return the changes to apply as a DataFrame.",
        )
    return derived


def _rewritten(pipeline: Pipeline, batch_id: str, root: str) -> bool:
    """Whether the target's data commit of ``pipeline``'s write of ``batch_id`` (among its
    newest 100 commits) is an overwrite: the ``rewrite`` strategy wrote the batch (never
    said of a warehouse target, whose loads leave no history of their form)."""
    if pipeline.warehouse is not None:
        return False
    table = existing_target(pipeline.target, resolved_options(pipeline.storage_options))
    if table is None:
        return False
    prefix = root_prefix(pipeline.name, batch_id, root)  # fences and preparing commits differ
    for commit in table.history(100):
        if str(commit.get("userMetadata") or "").startswith(prefix):
            parameters = cast(Mapping[str, object], commit.get("operationParameters") or {})
            return commit.get("operation") == "WRITE" and parameters.get("mode") == "Overwrite"
    return False


def _refuse_abandoned(store: WatermarkStore, pipeline_name: str, batch_id: str) -> None:
    """Re-read the batch just before the write and stop if a forced change abandoned it
    meanwhile (``watermark set``/``reset --force`` from another process).

    Raises:
        BatchStateError: the batch is abandoned; nothing was written.
    """
    if store.get_batch(batch_id).status is BatchStatus.ABANDONED:
        raise BatchStateError(
            f"Batch {batch_id} was abandoned by a forced change while pipeline "
            f"'{pipeline_name}' was running it; its output was not written.",
            pipeline=pipeline_name,
            batch_id=batch_id,
            fix="nothing to do: the next batch reads the abandoned batch's ranges again.",
        )


def _at_planned_locations(registry: Registry, pipeline: Pipeline, batch: Batch) -> Registry:
    """``registry`` with the pipeline's catalog-named upstreams at the locations the batch
    recorded (I3: its inputs come from the plan alone, not from this process's resolution)."""
    planned = {
        u: location
        for u in pipeline.upstreams
        if registry.upstreams[u].table is not None
        and (location := batch.locations.get(u)) is not None
        and location != registry.upstreams[u].path
    }
    return registry.with_locations(planned, {}) if planned else registry


def _bind_inputs(
    spark: SparkSession,
    store: WatermarkStore,
    registry: Registry,
    pipeline: Pipeline,
    batch: Batch,
    *,
    full_load: bool,
) -> dict[str, UpstreamInput]:
    def pinner(upstream: str) -> PinWindow:
        def pin(end: CursorPosition | None, recheck_at: int | None) -> CursorWindow:
            return store.pin_window(batch.batch_id, upstream, end, recheck_at=recheck_at)

        return pin

    _check_database_columns(store, registry, pipeline, batch, full_load=full_load)
    return {
        u: UpstreamInput.pinned(
            spark,
            registry.upstreams[u],
            batch.inputs[u],
            full_load=full_load,
            table_id=batch.table_ids.get(u),
            pin=pinner(u),
            # A Delta cursor source is read as the batch planned it: a row committed after
            # the first reader pinned the window, inside it, is not seen by later readers
            # (a retry, the batch's other pipelines) either.
            source_version=delta_source_version(batch.source_states.get(u)),
            sightings=partial(store.sightings, u),
        )
        for u in pipeline.upstreams
    }


def _check_database_columns(
    store: WatermarkStore, registry: Registry, pipeline: Pipeline, batch: Batch, *, full_load: bool
) -> None:
    """A scheduled batch refuses a database table whose columns changed incompatibly since
    the batch that committed its position (a full load reads the table as it now is)."""
    if full_load or batch.order_seq is not None:
        return
    marks = store.committed()
    check_batch_columns(
        {u: registry.upstreams[u] for u in pipeline.upstreams},
        lambda u: committed_fingerprint(store, marks.get(u), u, batch.batch_id),
    )
