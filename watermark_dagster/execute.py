"""Running one pipeline on one batch: read the pinned inputs, transform, write, checkpoint.

No Dagster here: the asset is a thin wrapper, and tests or the command line can call
:func:`execute_pipeline` directly.
"""

import logging
import traceback
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from watermark_dagster.errors import BatchStateError, TerminalError
from watermark_dagster.faults import fault_point
from watermark_dagster.read.inputs import UpstreamInput
from watermark_dagster.registry import Pipeline, Registry
from watermark_dagster.store import Batch, BatchStatus, CheckpointStatus, WatermarkStore, seq_of
from watermark_dagster.write.merge import WriteResult, merge_into_target

log = logging.getLogger("watermark_dagster")


@dataclass
class BatchContext:
    """What a transform receives: the batch, and each upstream as the batch pinned it.

    ``batch["orders"].changes`` is the change feed in the pinned range;
    ``batch["orders"].snapshot`` is the table as of the range's end.
    """

    batch_id: str
    seq: int
    pipeline: str
    inputs: Mapping[str, UpstreamInput]
    spark: SparkSession

    def __getitem__(self, upstream: str) -> UpstreamInput:
        try:
            return self.inputs[upstream]
        except KeyError:
            raise KeyError(
                f"Pipeline '{self.pipeline}' does not read upstream '{upstream}'; it reads "
                f"{sorted(self.inputs)}. Add it to the pipeline's upstreams."
            ) from None


@dataclass(frozen=True)
class InputReport:
    """Per-upstream facts of one run, shown as materialization metadata."""

    upstream: str
    mode: str
    start_version: int | None
    end_version: int
    rows_read: int


@dataclass(frozen=True)
class PipelineOutcome:
    """The result of one pipeline on one batch."""

    pipeline: str
    batch: Batch
    attempt: int | None
    inputs: tuple[InputReport, ...]
    write: WriteResult | None
    skipped_reason: str | None = None

    @property
    def rows_read(self) -> int:
        """Change rows read across upstreams."""
        return sum(i.rows_read for i in self.inputs)

    @property
    def rows_written(self) -> int:
        """Target rows inserted, updated or deleted."""
        return self.write.rows_written if self.write else 0


def _error_text(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text[:4000]


def execute_pipeline(
    *,
    spark: SparkSession,
    store: WatermarkStore,
    registry: Registry,
    pipeline_name: str,
    batch_id: str,
    run_id: str | None = None,
) -> PipelineOutcome:
    """Run ``pipeline_name`` on batch ``batch_id`` and record its checkpoint.

    Raises:
        BatchStateError: the batch is unknown or abandoned.
        Exception: whatever the read, transform or write raised (after recording FAILED).
    """
    pipeline: Pipeline = registry.pipelines[pipeline_name]
    batch = store.get_batch(batch_id)
    if batch.status is BatchStatus.ABANDONED:
        raise BatchStateError(
            f"Batch {batch_id} was abandoned; pipeline '{pipeline_name}' will not run it.",
            pipeline=pipeline_name,
            batch_id=batch_id,
            fix="materialize a newer batch partition instead.",
        )
    if pipeline_name not in batch.pipelines:
        reason = f"no upstream of '{pipeline_name}' changed in batch {batch_id}"
        log.info("pipeline=%s batch=%s skipped: %s", pipeline_name, batch_id, reason)
        return PipelineOutcome(pipeline_name, batch, None, (), None, skipped_reason=reason)
    newest = store.newest_success(pipeline_name)
    if newest is not None and seq_of(newest) > batch.seq:
        # I5: a backfill of an older batch must not overwrite what newer batches wrote (nor
        # bring back rows they deleted). The target already holds this batch's effects.
        reason = (
            f"batch {batch_id} is superseded: '{pipeline_name}' already applied the newer "
            f"batch {newest}; its target is left as it is"
        )
        log.info("pipeline=%s batch=%s skipped: %s", pipeline_name, batch_id, reason)
        return PipelineOutcome(pipeline_name, batch, None, (), None, skipped_reason=reason)
    missing = [u for u in pipeline.upstreams if u not in batch.inputs]
    if missing:
        raise BatchStateError(
            f"Batch {batch_id} pins no range for upstream(s) {missing} of pipeline "
            f"'{pipeline_name}' (the pipeline's upstreams changed after the batch was planned).",
            pipeline=pipeline_name,
            batch_id=batch_id,
            fix="let the batch finish, then the next batch includes the new upstreams.",
        )

    attempt = store.begin_checkpoint(pipeline_name, batch_id, run_id=run_id)
    inputs: dict[str, UpstreamInput] = {}
    try:
        inputs = {
            u: UpstreamInput.pinned(spark, registry.upstreams[u], batch.inputs[u])
            for u in pipeline.upstreams
        }
        reports = tuple(
            InputReport(
                upstream=u,
                mode=i.mode.value,
                start_version=i.range.start if i.range else None,
                end_version=i.snapshot_version,
                rows_read=i.changes.count() if i.range else 0,
            )
            for u, i in inputs.items()
        )
        for r in reports:
            log.info(
                "pipeline=%s batch=%s upstream=%s mode=%s range=[%s, %s] rows_read=%d",
                pipeline_name,
                batch_id,
                r.upstream,
                r.mode,
                r.start_version,
                r.end_version,
                r.rows_read,
            )
        context = BatchContext(batch_id, batch.seq, pipeline_name, inputs, spark)
        output = pipeline.transform(context)
        if not isinstance(output, DataFrame):
            raise TerminalError(
                f"Pipeline '{pipeline_name}': the transform returned {type(output).__name__}, "
                "not a Spark DataFrame.",
                pipeline=pipeline_name,
                batch_id=batch_id,
                fix="return the changes to apply as a DataFrame.",
            )
        write = merge_into_target(
            spark,
            output,
            target=pipeline.target,
            keys=pipeline.keys,
            batch_seq=batch.seq,
            batch_id=batch_id,
            pipeline=pipeline_name,
        )
        log.info(
            "pipeline=%s batch=%s target=%s version=%d inserted=%d updated=%d deleted=%d",
            pipeline_name,
            batch_id,
            pipeline.target,
            write.target_version,
            write.rows_inserted,
            write.rows_updated,
            write.rows_deleted,
        )
        fault_point("after_target_commit")
    except BaseException as exc:
        error = _error_text(exc)
        store.finish_checkpoint(
            pipeline_name, batch_id, attempt, CheckpointStatus.FAILED, error=error
        )
        store.record(
            "PIPELINE_FAILED",
            actor=run_id,
            batch_id=batch_id,
            pipeline=pipeline_name,
            detail={"attempt": attempt, "error": error},
        )
        raise
    finally:
        for upstream_input in inputs.values():
            upstream_input.release()
    outcome = PipelineOutcome(pipeline_name, batch, attempt, reports, write)
    store.finish_checkpoint(
        pipeline_name,
        batch_id,
        attempt,
        CheckpointStatus.SUCCESS,
        rows_read=outcome.rows_read,
        rows_written=outcome.rows_written,
    )
    store.record(
        "PIPELINE_SUCCEEDED",
        actor=run_id,
        batch_id=batch_id,
        pipeline=pipeline_name,
        detail={
            "attempt": attempt,
            "rows_read": outcome.rows_read,
            "rows_written": outcome.rows_written,
        },
    )
    fault_point("after_checkpoint")
    return outcome
