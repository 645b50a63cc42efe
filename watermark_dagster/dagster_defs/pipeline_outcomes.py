"""What a batch partition of a pipeline shows for a run: the materialization metadata of
its outcome (:func:`outcome_metadata`), a run that skipped (:func:`report_skip`, the
``watermark/skipped`` run tag), and the pipelines a batch did not need, shown done with
nothing to do (:func:`nothing_to_do_events`).
"""

from collections.abc import Mapping
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    MetadataValue,
)

from watermark_dagster.core.ranges import ReadMode
from watermark_dagster.core.records import Batch, BatchKind
from watermark_dagster.dagster_defs.runs import DRIFT_METADATA, PLAN_ID_METADATA
from watermark_dagster.operations.decide import PipelineDecision, PipelineOutcome, SkipKind


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
        if r.rows_without_cursor is not None:
            meta[f"{prefix}/rows_without_cursor"] = r.rows_without_cursor
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
