"""Deciding, from the control tables alone, what a run of one pipeline on one batch has to
do, and the outcome it reports. No Spark here: a run that skips, and the code location
that loads the assets, import neither PySpark nor the read and write modules.
"""

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.outcomes import succeeded_pipelines, superseded_by
from watermark_dagster.core.records import Batch, BatchStatus, seq_of
from watermark_dagster.core.strategy import MeasuredStrategy
from watermark_dagster.errors import BatchStateError
from watermark_dagster.store import WatermarkStore

if TYPE_CHECKING:
    from watermark_dagster.write.commits import WriteResult

log = logging.getLogger("watermark_dagster")


class SkipKind(StrEnum):
    """Why a pipeline run on a batch does nothing."""

    NOT_IN_BATCH = "not_in_batch"
    """None of the pipeline's upstreams changed in the batch (a NOOP pipeline)."""
    SUPERSEDED = "superseded"
    """The pipeline already applied a newer batch; re-applying this one could regress it."""
    ALREADY_APPLIED = "already_applied"
    """The pipeline already succeeded on this batch: its target holds it (a retry or a
    backfill after success), so nothing is read or written again."""


@dataclass(frozen=True)
class InputReport:
    """Per-upstream facts of one run, shown as materialization metadata."""

    upstream: str
    mode: str
    start_version: int | None
    end_version: int | None
    rows_read: int
    files_read: int | None = None
    window: str | None = None
    rows_without_cursor: int | None = None
    """A database upstream's rows whose cursor is NULL, counted when its window was pinned
    (in no window: loaded by no batch)."""


@dataclass(frozen=True)
class PipelineOutcome:
    """The result of one pipeline on one batch."""

    pipeline: str
    batch: Batch
    attempt: int | None
    inputs: tuple[InputReport, ...]
    write: "WriteResult | None"
    skipped_reason: str | None = None
    full_load: bool = False
    skip: SkipKind | None = None
    strategy: MeasuredStrategy | None = None

    @property
    def rows_read(self) -> int:
        """Change rows read across upstreams."""
        return sum(i.rows_read for i in self.inputs)

    @property
    def rows_written(self) -> int:
        """Target rows inserted, updated or deleted."""
        return self.write.rows_written if self.write else 0


@dataclass(frozen=True)
class PipelineDecision:
    """What a run of one pipeline on one batch has to do, decided from the control tables
    alone: no Spark session is needed to reach it, so a run that skips starts no JVM."""

    pipeline: Pipeline
    batch: Batch
    skip: SkipKind | None = None
    skipped_reason: str | None = None

    def skipped_outcome(self) -> PipelineOutcome:
        """The outcome of a run that skips (only when :attr:`skip` is set)."""
        assert self.skip is not None, "skipped_outcome() of a decision to run"
        return PipelineOutcome(
            self.pipeline.name,
            self.batch,
            None,
            (),
            None,
            skipped_reason=self.skipped_reason,
            skip=self.skip,
        )


def _batch_of_partition(store: WatermarkStore, pipeline_name: str, partition: str) -> Batch:
    """The batch a run's partition names.

    Raises:
        BatchStateError: the partition is no batch (added by hand: it pins nothing).
    """
    try:
        seq_of(partition)
        return store.get_batch(partition)
    except (ValueError, BatchStateError):
        raise BatchStateError(
            f"Partition '{partition}' is not a batch, so pipeline '{pipeline_name}' has no "
            "version ranges pinned to read for it. Batch partitions are added by the "
            "coordinator when it plans a batch, and by a replay; one added by hand (the "
            'launchpad\'s "Add a partition") pins nothing. Nothing was read or written.',
            pipeline=pipeline_name,
            batch_id=partition,
            fix="delete that partition, and let the coordinator plan the next batch "
            "(`watermark plan` shows it); to read a batch again, backfill its partition.",
        ) from None


def decide_pipeline(
    *, store: WatermarkStore, registry: Registry, pipeline_name: str, batch_id: str
) -> PipelineDecision:
    """Decide, without Spark, whether ``pipeline_name`` has work on batch ``batch_id``.

    It skips a batch none of its upstreams changed in (NOOP), a batch it already succeeded
    on (its target holds it: a second run could only repeat the write), and a batch older
    than one it already applied (a backfill of a superseded batch, I5).

    Raises:
        BatchStateError: the batch is unknown or abandoned, or pins no range for one of the
            pipeline's upstreams.
    """
    pipeline: Pipeline = registry.pipelines[pipeline_name]
    batch = _batch_of_partition(store, pipeline_name, batch_id)
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
        return PipelineDecision(pipeline, batch, SkipKind.NOT_IN_BATCH, reason)
    done = store.checkpoints(batch_id=batch_id, pipeline=pipeline_name)
    if pipeline_name in succeeded_pipelines(batch_id, done):
        reason = f"'{pipeline_name}' already succeeded on batch {batch_id}; its target holds it"
        log.info("pipeline=%s batch=%s skipped: %s", pipeline_name, batch_id, reason)
        return PipelineDecision(pipeline, batch, SkipKind.ALREADY_APPLIED, reason)
    newer = superseded_by(batch, lambda: store.newest_applied(pipeline_name))
    if newer is not None:
        reason = (
            f"batch {batch_id} is superseded: '{pipeline_name}' already applied the newer "
            f"batch {newer.batch_id}; its target is left as it is"
        )
        log.info("pipeline=%s batch=%s skipped: %s", pipeline_name, batch_id, reason)
        return PipelineDecision(pipeline, batch, SkipKind.SUPERSEDED, reason)
    missing = [u for u in pipeline.upstreams if u not in batch.inputs]
    if missing:
        raise BatchStateError(
            f"Batch {batch_id} pins no range for upstream(s) {missing} of pipeline "
            f"'{pipeline_name}' (the pipeline's upstreams changed after the batch was planned).",
            pipeline=pipeline_name,
            batch_id=batch_id,
            fix="let the batch finish, then the next batch includes the new upstreams.",
        )
    return PipelineDecision(pipeline, batch)
