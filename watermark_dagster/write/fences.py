"""What a target says about a batch's write, through the pipeline's Delta transaction
(application id = control root and pipeline, version = batch position,
:func:`transaction_app_id`) and the labels of its commits: whether the write already landed
(:func:`applied_by_target`), whether the target belongs to another control root's history
(:func:`refuse_bound_elsewhere`), and fences.

A target belongs to one control root: its transaction and labels name the root (the Delta
table id of its ``batches`` table). Batch positions restart in a new root and go back in a
restored one, so a position is only ever taken as applied when this root wrote it.

A forced change that abandons a batch fences its targets (:func:`fence_target`): an empty
commit records the batch's transaction, so a run of that batch still in flight, whatever
it checked before, cannot commit afterwards; Delta skips its write, or fails it when it
read the target before the fence landed (:func:`refuse_fenced` says so).
"""

from collections.abc import Callable, Mapping, Sequence

from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import SparkSession

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.core.columns import SEQ_COLUMN
from watermark_dagster.core.records import Checkpoint, TargetMark, first_mark
from watermark_dagster.errors import (
    BatchStateError,
    TargetBoundElsewhereError,
    TerminalError,
    reset_command,
)
from watermark_dagster.frames.delta import existing_target
from watermark_dagster.write.commits import (
    Fence,
    LabelledWrite,
    fence_label,
    fenced,
    label_prefix,
    labelled_commit,
    newest_labelled_write,
    root_prefix,
)


def transaction_app_id(pipeline: Pipeline, root: str) -> str:
    """The Delta transaction application id of ``pipeline``'s writes scheduled by control
    root ``root`` (:meth:`~watermark_dagster.store.tables.ControlTables.root_id`): a
    position another root wrote is never this root's, so Delta never skips a write of this
    root for it."""
    return f"watermark:{root}:{pipeline.name}"


def legacy_app_id(pipeline: Pipeline) -> str:
    """The application id older releases wrote, naming no control root."""
    return f"watermark:{pipeline.name}"


def applied_by_target(
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    *,
    root: str,
    attempts: Sequence[Checkpoint] | None = None,
) -> str | None:
    """What shows that ``pipeline``'s target already holds its write for batch
    ``batch_id`` (at position ``write_seq``) of control root ``root``, or None when nothing
    does.

    A run killed between its target commit and its SUCCESS checkpoint leaves this evidence:
    a commit labelled with the pipeline, the root and the batch (its data commit, never a
    preparatory one), or, when that label is older than the commits read, the root's Delta
    transaction of the pipeline at the batch's position (no later batch is planned while
    this one is open). A fence (:func:`fence_target`) records the transaction too, without
    rows: a fenced batch has no evidence. A write that committed nothing leaves none, and
    re-reading its range writes nothing twice either. What another root wrote is never
    evidence (:func:`refuse_bound_elsewhere` refuses it before a run skips anything).

    ``attempts`` are the pipeline's checkpoints on the batch, when the caller has them: a
    batch never attempted wrote nothing, and only what landed after its first attempt's
    mark is its write (:class:`~watermark_dagster.core.records.TargetMark`).
    """
    if attempts is not None and not attempts:
        return None
    if pipeline.warehouse is not None:
        from watermark_dagster.write.warehouse_fences import warehouse_evidence

        since = None if attempts is None else first_mark(attempts)
        return warehouse_evidence(pipeline, batch_id, write_seq, root, first=since)
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    table = existing_target(pipeline.target, options)
    if table is None:
        return None
    since = None if attempts is None else first_mark(attempts)
    return evidence_in(table, pipeline, batch_id, write_seq, root, since=since)


def target_mark(pipeline: Pipeline, root: str) -> TargetMark:
    """What ``pipeline``'s target holds now, before an attempt of a batch of control root
    ``root`` writes: its version and this root's transaction position (through delta-rs,
    no Spark job; a warehouse target's state row)."""
    if pipeline.warehouse is not None:
        from watermark_dagster.write.warehouse_fences import warehouse_mark

        return warehouse_mark(pipeline, root)
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    table = existing_target(pipeline.target, options)
    if table is None:
        return TargetMark(-1, None)
    return TargetMark(
        table.version(), table.transaction_version(transaction_app_id(pipeline, root))
    )


def evidence_in(
    table: RsDeltaTable,
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    root: str,
    *,
    since: TargetMark | None = None,
) -> str | None:
    """:func:`applied_by_target` on a target's log already opened.

    A target last written by an older release (its transaction and labels name no root) is
    taken as this root's when its position is the batch's: a write the older release
    committed just before it was upgraded (the binding check refuses the position on a
    batch's first attempt, when no write of this root can have landed).

    With ``since`` (the batch's first attempt's mark), a labelled commit at or before the
    mark, or a transaction already at the batch's position then, is an earlier life's write
    of the same batch id (a root restored from an older copy), never this batch's.
    """

    def after_mark(version: int | None) -> bool:
        return version is not None and (since is None or not since.before(version))

    version = labelled_commit(table, root_prefix(pipeline.name, batch_id, root))
    if after_mark(version):
        return f"the target's version {version} was written by {pipeline.name} for {batch_id}"
    if fenced(table, pipeline.name, batch_id, root) is not None:
        return None
    if since is not None and since.holds(write_seq):
        return None
    app_id = transaction_app_id(pipeline, root)
    applied = table.transaction_version(app_id)
    if applied is not None:
        if applied == write_seq and version is None:
            return f"the target's Delta transaction {app_id} is at {applied} (the batch's position)"
        return None
    legacy = labelled_commit(table, label_prefix(pipeline.name, batch_id) + "seq=")
    if after_mark(legacy):
        return (
            f"the target's version {legacy} was written by {pipeline.name} for {batch_id} "
            "(by an older release)"
        )
    old_id = legacy_app_id(pipeline)
    old = table.transaction_version(old_id)
    if old is not None and old == write_seq and since is None:
        return f"the target's Delta transaction {old_id} is at {old} (an older release's write)"
    return None


def _bound_elsewhere(
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    root: str,
    *,
    what: str,
    position: int | None,
    other_root: str | None,
) -> TargetBoundElsewhereError:
    theirs = "" if position is None else f" at position {position}"
    resets = " and ".join(f"`{reset_command(u)} --yes`" for u in pipeline.upstreams)
    by = (
        "a control root whose labelled commits are gone from the target's history"
        if other_root == ""
        else f"control root {other_root}"
        if other_root is not None and other_root != root
        else (
            "an older release (its transaction names no control root)"
            if other_root is None
            else f"this control root ({root}) in an earlier life: the root was restored "
            "from an older copy or its batches were rewound"
        )
    )
    return TargetBoundElsewhereError(
        f"Pipeline '{pipeline.name}': its target {pipeline.target} records a write{theirs} "
        f"by {by} ({what}), which control root {root} did not schedule: its batch "
        f"{batch_id} is at position {write_seq}. Taking the batch as already applied would "
        "drop its changes, and merging it under newer rows would lose them; nothing was "
        "skipped or written.",
        pipeline=pipeline.name,
        batch_id=batch_id,
        versions=f"target position={position}, batch position={write_seq}, "
        f"target root={other_root or 'none'}, this root={root}",
        fix=f"if this control root now owns the target, move {pipeline.target} aside (or "
        f"delete it), then run {resets} and `watermark run --retry`: the batch is abandoned "
        "(or, when it loads the target in full itself, retried) and the target is loaded in "
        "full from the upstreams. If the target belongs to the other "
        "control root, run the pipeline from that root, or give this one its own target.",
    )


def refuse_bound_elsewhere(
    table: RsDeltaTable,
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    root: str,
    *,
    first_attempt: bool,
    first: TargetMark | None = None,
    replay: bool = False,
) -> None:
    """Refuse to run ``pipeline``'s write of batch ``batch_id`` (position ``write_seq``) of
    control root ``root`` when its target belongs to another root's history: checked before
    anything is skipped as already applied or written.

    Refused when:

    * the newest write, preparation or fence among the target's recent commits (of this
      pipeline or another) was labelled by another root;
    * this root's own transaction is ahead of the batch's position, or at it on the batch's
      first attempt (which cannot have written yet: the attempt is recorded before the
      write), or it was at it already when the batch's first attempt began (``first``, its
      mark: a retry of a batch refused once is refused again), which means the root was
      restored from an older copy;
    * this root never wrote the target and an older release's transaction (naming no
      root) is ahead of the batch's position, or at it on a first attempt or on a retry
      whose first attempt this release made (``first``: it writes under the root's own id).
      At or below it, on a retry of a batch an older release began, it is this root's own
      history from before the upgrade.

    A replay writes below the target's positions by design: only the first rule applies.

    Raises:
        TargetBoundElsewhereError: naming the target, both positions and roots, and the fix.
    """

    def refuse(what: str, position: int | None, other: str | None) -> None:
        raise _bound_elsewhere(
            pipeline, batch_id, write_seq, root, what=what, position=position, other_root=other
        )

    # Any pipeline's: another root's pipeline of another name writing this target is
    # another history all the same (its positions are not this root's).
    newest: LabelledWrite | None = newest_labelled_write(table, None)
    if newest is not None and newest.root is not None and newest.root != root:
        other_id = f"watermark:{newest.root}:{newest.pipeline}"
        theirs = table.transaction_version(other_id)
        refuse(
            f"its version {newest.version}, labelled for {newest.pipeline}'s batch "
            f"{newest.batch_id}; Delta "
            f"transaction {other_id}",
            theirs if theirs is not None else newest.seq,
            newest.root,
        )
    if replay:
        return
    own_id = transaction_app_id(pipeline, root)
    own = table.transaction_version(own_id)
    if own is not None:
        # At the batch's position on a first attempt is a restored root, unless a forced
        # change fenced the batch (its fence records that transaction): the write then
        # fails naming the fence.
        at_fence = own == write_seq and fenced(table, pipeline.name, batch_id, root) is not None
        earlier = first_attempt or (first is not None and first.holds(write_seq))
        if own > write_seq or (own == write_seq and earlier and not at_fence):
            refuse(f"Delta transaction {own_id}", own, root)
        return
    old_id = legacy_app_id(pipeline)
    old = table.transaction_version(old_id)
    # A first attempt with a mark ran on this release, which writes under the root's own
    # id: an older release's transaction at the batch's position was there before it.
    began_here = first_attempt or first is not None
    if old is not None and (old > write_seq or (old == write_seq and began_here)):
        refuse(f"Delta transaction {old_id}", old, None)
    # This root never wrote the target, and no label is among its recent commits (many
    # unlabelled commits since: maintenance, property changes). Its rows still carry the
    # positions they were written at: rows ahead of the batch are another root's, and the
    # version guard would keep them over the batch's changes.
    highest = highest_row_seq(table)
    if highest is not None and highest > write_seq and (old is None or highest > old):
        found = newest_labelled_write(table, pipeline.name, newest=table.version() + 1)
        refuse(
            f"rows at position {highest} in its {SEQ_COLUMN} column"
            + (f", the newest labelled write its version {found.version}" if found else ""),
            highest,
            found.root if found is not None and found.root is not None else "",
        )


def highest_row_seq(table: RsDeltaTable) -> int | None:
    """The greatest ``_wm_seq`` of the target's rows, from its files' statistics in the
    Delta log (no data file is read); None when the column or its statistics are absent."""
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(table.get_add_actions(flatten=True))
    name = f"max.{SEQ_COLUMN}"
    if name not in actions.column_names:
        return None
    top = pc.max(actions.column(name)).as_py()  # pyright: ignore[reportAttributeAccessIssue]
    return None if top is None else int(top)


def check_target_bound(
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    root: str,
    *,
    first_attempt: bool,
    first: TargetMark | None = None,
    replay: bool = False,
) -> None:
    """:func:`refuse_bound_elsewhere` on the pipeline's target, read through delta-rs (no
    Spark job); nothing to check while the target does not exist. A warehouse target's
    state row is checked by the same rules
    (:func:`~watermark_dagster.write.warehouse.check_warehouse_bound`)."""
    if pipeline.warehouse is not None:
        from watermark_dagster.write.warehouse_fences import check_warehouse_bound

        check_warehouse_bound(
            pipeline,
            batch_id,
            write_seq,
            root,
            first_attempt=first_attempt,
            first=first,
            replay=replay,
        )
        return
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    table = existing_target(pipeline.target, options)
    if table is not None:
        refuse_bound_elsewhere(
            table,
            pipeline,
            batch_id,
            write_seq,
            root,
            first_attempt=first_attempt,
            first=first,
            replay=replay,
        )


def _fenced_error(pipeline: str, batch_id: str, version: int) -> BatchStateError:
    return BatchStateError(
        f"Batch {batch_id} was abandoned by a forced change: pipeline '{pipeline}''s target "
        f"is fenced against it (its version {version}); its output was not written.",
        pipeline=pipeline,
        batch_id=batch_id,
        fix="nothing to do once the forced change has finished: the next batch reads the "
        "abandoned batch's ranges again. If the change was interrupted, run it again.",
    )


def refuse_fenced(table: RsDeltaTable, pipeline: Pipeline, batch_id: str, root: str) -> None:
    """Raise when a forced change fenced ``pipeline``'s target against ``batch_id`` of
    control root ``root``: a write Delta skipped for that reason was not applied, and must
    not be reported so.

    Raises:
        BatchStateError: the target holds a fence for the batch.
    """
    version = fenced(table, pipeline.name, batch_id, root)
    if version is not None:
        raise _fenced_error(pipeline.name, batch_id, version)


def fence_pipeline(
    spark: Callable[[], SparkSession],
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    *,
    root: str,
    attempts: Sequence[Checkpoint],
) -> Fence | None:
    """Fence ``pipeline``'s target against ``batch_id``: a Delta target by
    :func:`fence_target` (``spark`` started only then), a warehouse's by its state row
    (:func:`~watermark_dagster.write.warehouse_fences.fence_warehouse`); None when there is
    no Delta target yet to fence."""
    if pipeline.warehouse is not None:
        from watermark_dagster.write.warehouse_fences import fence_warehouse

        return fence_warehouse(pipeline, batch_id, write_seq, root)
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    if existing_target(pipeline.target, options) is None:
        return None
    return fence_target(spark(), pipeline, batch_id, write_seq, root=root, attempts=attempts)


def fence_target(
    spark: SparkSession,
    pipeline: Pipeline,
    batch_id: str,
    write_seq: int,
    *,
    root: str,
    attempts: Sequence[Checkpoint] | None = None,
) -> Fence:
    """Make sure no write of batch ``batch_id`` lands in ``pipeline``'s target from now on.

    An empty append records the pipeline's Delta transaction at ``write_seq`` (labelled
    as a fence, which is never evidence). Every write of a scheduled batch carries that
    transaction, so Delta skips a later attempt of the batch, and fails (concurrent
    transaction) one that read the target before the fence committed. When the batch's
    write landed first, the fence commits nothing and the evidence is returned: the
    caller records the pipeline as succeeded instead.

    A target that does not exist yet is not fenced (there is no log to commit to): a late
    first write that creates it is found by the next plan, which reloads the target in full
    (:func:`~watermark_dagster.operations.coordinate.reloads_after_abandon`).

    ``attempts`` are the pipeline's checkpoints on the batch (see
    :func:`applied_by_target`).
    """
    options: Mapping[str, str] = resolved_options(pipeline.storage_options) or {}
    table = existing_target(pipeline.target, options)
    if table is None:
        return Fence()
    # A batch never attempted wrote nothing; only what landed after its first attempt's
    # mark is its write (``attempts``: the pipeline's checkpoints on it; None: unknown).
    since = None if attempts is None else first_mark(attempts)
    evidence = (
        None
        if attempts is not None and not attempts
        else evidence_in(table, pipeline, batch_id, write_seq, root, since=since)
    )
    if evidence is not None:
        return Fence(applied=evidence)
    existing = fenced(table, pipeline.name, batch_id, root)
    if existing is not None:  # an interrupted forced change fenced it already
        return Fence(fenced=existing)
    before = table.version()
    label = fence_label(pipeline.name, batch_id, write_seq, root)
    writer = (
        spark.read.format("delta")
        .load(pipeline.target)
        .limit(0)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", transaction_app_id(pipeline, root))
        .option("txnVersion", write_seq)
        .option("userMetadata", label)
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save(pipeline.target)
    table.update_incremental()
    version = fenced(table, pipeline.name, batch_id, root, newest=max(1, table.version() - before))
    if version is not None:
        return Fence(fenced=version, new=True)
    evidence = evidence_in(table, pipeline, batch_id, write_seq, root, since=since)
    if evidence is not None:  # the batch's write won the race: Delta skipped the fence
        return Fence(applied=evidence)
    raise TerminalError(
        f"Pipeline '{pipeline.name}': the fence against batch {batch_id} was not committed to "
        f"{pipeline.target}, and the target records no write of the batch either.",
        pipeline=pipeline.name,
        batch_id=batch_id,
        fix="run the forced change again; report it if it persists.",
    )
