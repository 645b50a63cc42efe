"""Replays of batch partitions: a backfill (or manual materialization) of an ended batch
a pipeline already applied replays its ranges as a REPLAY batch (:func:`start_replay`), or
is refused before anything is written (:class:`ReapplyRefused`); and what a replay's
materialization says, wherever it ran (:func:`replay_metadata`).
"""

import json
from typing import Any

from dagster import AssetExecutionContext, Failure

from watermark_dagster.config.registry import Registry
from watermark_dagster.core.records import Batch, batch_id_for
from watermark_dagster.dagster_defs.runs import PLAN_ID_METADATA
from watermark_dagster.errors import WatermarkError
from watermark_dagster.operations.decide import PipelineDecision, decide_pipeline
from watermark_dagster.store import WatermarkStore

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
