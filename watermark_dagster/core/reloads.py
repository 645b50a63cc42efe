"""The reloads the next plan owes (:func:`reloads_due`), in plain Python (no Dagster,
Spark or delta-rs): those a batch could not plan, and those a forced change that abandoned
a batch leaves owed.
"""

from collections.abc import Collection, Mapping

from watermark_dagster.core.records import Batch, BatchStatus, Watermark


def reloads_due(
    newest: Batch | None,
    holding: Collection[str],
    marks: Mapping[str, Watermark],
    pipeline_inputs: Mapping[str, Collection[str]],
    *,
    reloading: Collection[str] = (),
) -> tuple[str, ...]:
    """The pipelines the next plan owes a reload in full, from the newest scheduled batch.

    A pipeline stays owed until a batch plans its reload: ``newest.reloads_owed`` names
    those the newest batch could not plan (their upstreams were blocked or unavailable).
    When a forced change abandoned ``newest``, these are owed too:

    * a pipeline that holds the batch (``holding``: succeeded, recovered by the forced
      change, or written late by a run the change could not fence because its target did
      not exist yet) and read an upstream whose committed watermark does not cover what
      the batch read: not advanced for the batch, and for a versioned one below the version
      it read up to. The next batch would read those changes again, and an append target
      would hold them twice (I4); reloading the target from the next batch's snapshots
      makes it whole again;
    * a pipeline the batch was to reload that does not hold it: its target may hold the
      rows of an earlier abandoned batch.

    None is owed by a pipeline that reloads in the next plan anyway (``reloading``: an
    overwrite pipeline, or one reading a versioned upstream with nothing committed, which
    it loads as a snapshot), nor by one no longer in ``pipeline_inputs``.
    """
    if newest is None:
        return ()
    owed = set(newest.reloads_owed)
    if newest.status is BatchStatus.ABANDONED:
        for pipeline in newest.pipelines:
            upstreams = pipeline_inputs.get(pipeline)
            if upstreams is None:
                continue
            if pipeline in holding:
                if not all(_covers(newest, u, marks.get(u)) for u in upstreams):
                    owed.add(pipeline)
            elif pipeline in newest.full_load:
                owed.add(pipeline)
    return tuple(sorted(p for p in owed if p in pipeline_inputs and p not in reloading))


def _covers(batch: Batch, upstream: str, mark: Watermark | None) -> bool:
    """Whether ``upstream``'s committed watermark covers what ``batch`` read of it."""
    planned = batch.inputs.get(upstream)
    if planned is None or upstream in batch.advanced:
        return True
    if planned.is_cursor:
        return not planned.reads  # a window read and not advanced is read again
    if mark is None or mark.committed_version is None:
        return True  # read as a snapshot next: its readers reload anyway
    read_to = planned.snapshot_version
    return read_to is None or mark.committed_version >= read_to
