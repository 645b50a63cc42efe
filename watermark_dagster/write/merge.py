"""Merging a batch's changes into a pipeline's target table, idempotently and at the cost
of what changed.

The target keeps, per row, the sequence number of the batch that last wrote it
(``_wm_seq``). A change is applied only when its batch is at least as new as the row's,
so running the same batch twice (retry after a crash between the target commit and the
checkpoint) changes nothing the second time, and re-running an older batch cannot
overwrite what a newer one wrote.

Cost: the output is persisted once and one aggregate gives every count and check (see
:mod:`~watermark_dagster.write.summary`), or, for changes whose keys the driver holds (a
declared batch's), no job runs before the MERGE at all; the MERGE condition carries the key
ranges of the batch's changes (:mod:`~watermark_dagster.write.skipping`), so Delta skips
the files those keys cannot be in, and targets have deletion vectors, so the files that do
hold a changed key are not rewritten, unless the target is small enough that rewriting them
is cheaper (see :mod:`~watermark_dagster.write.layout`).
"""

import logging
import operator
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable as RsDeltaTable
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from watermark_dagster.core.columns import (
    BATCH_COLUMN,
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    SEQ_COLUMN,
    UNTOUCHED,
    UPSERT,
)
from watermark_dagster.core.faults import fault_point
from watermark_dagster.errors import TerminalError
from watermark_dagster.frames.changes import is_delete, latest_per_key, quoted, quoted_identifier
from watermark_dagster.frames.delta import delta_location, existing_target, session_setting
from watermark_dagster.write.commits import (
    UNBOUND_ROOT,
    WriteResult,
    commits_since,
    idempotent_dml,
    labelled_commits,
    new_label,
    newest_written_seq,
    preparing,
)
from watermark_dagster.write.duplicate_keys import duplicate_key_in, refusing_duplicate_keys
from watermark_dagster.write.layout import (
    PERSISTENT_DELETION_VECTORS_CONF,
    create_target,
    rewrite_below_bytes,
    rewrites_small_target,
    target_layout,
)
from watermark_dagster.write.skipping import broadcastable, first_key_spans, skipping_condition
from watermark_dagster.write.summary import (
    OutputSummary,
    range_keys,
    summarize,
    summary_of_keys,
)

log = logging.getLogger("watermark_dagster")

__all__ = [
    "duplicate_key_error",
    "merge_into_target",
    "prepare_changes",
]


def prepare_changes(
    changes: DataFrame, *, keys: Sequence[str], batch_seq: int, batch_id: str, pipeline: str
) -> DataFrame:
    """One change per key (when ``_commit_version`` orders them), with the framework's
    columns, ready to merge. Lazy: no Spark action.

    Without ``_commit_version`` several rows of one key cannot be ordered; the caller
    checks for them in its one aggregate (:func:`duplicate_key_error`).

    Raises:
        TerminalError: a key column is missing.
    """
    missing = [k for k in keys if k not in changes.columns]
    if missing:
        raise TerminalError(
            f"Pipeline '{pipeline}': the transform's output lacks key column(s) {missing}; it "
            f"has {changes.columns}.",
            pipeline=pipeline,
            batch_id=batch_id,
            fix="return the target's key columns from the transform.",
        )
    if COMMIT_VERSION in changes.columns:
        changes = latest_per_key(changes, keys)
    if CHANGE_TYPE not in changes.columns:
        changes = changes.withColumn(CHANGE_TYPE, F.lit(UPSERT))
    return (
        changes.drop(COMMIT_VERSION, COMMIT_TIMESTAMP)
        .withColumn(SEQ_COLUMN, F.lit(batch_seq).cast("long"))
        .withColumn(BATCH_COLUMN, F.lit(batch_id))
    )


def duplicate_key_error(
    summary: OutputSummary | Mapping[str, Any], *, pipeline: str, batch_id: str
) -> TerminalError | None:
    """The error for a transform output holding several rows of one key, if it does:
    ``summary`` is the output's summary, or the duplicated key itself."""
    duplicate = summary.duplicate if isinstance(summary, OutputSummary) else summary
    if duplicate is None:
        return None
    return TerminalError(
        f"Pipeline '{pipeline}': the transform returned several rows for key "
        f"{dict(duplicate)} and no {COMMIT_VERSION} column to pick the latest.",
        pipeline=pipeline,
        batch_id=batch_id,
        fix=f"return one row per key, or include {COMMIT_VERSION}.",
    )


def merge_into_target(
    spark: SparkSession,
    changes: DataFrame,
    *,
    target: str,
    keys: Sequence[str],
    batch_seq: int,
    batch_id: str,
    pipeline: str,
    storage_options: Mapping[str, str] | None = None,
    partition_by: Sequence[str] = (),
    cluster_by: Sequence[str] = (),
    insert_missing: bool = True,
    transaction: tuple[str, int] | None = None,
    change_feed: bool = False,
    root: str = UNBOUND_ROOT,
    known_keys: Sequence[tuple[object, ...]] | None = None,
) -> WriteResult:
    """Apply the batch's changes to ``target``: upserts, deletes, latest change per key.

    Creates the target if it is missing (with deletion vectors, clustered on the keys by
    default). The merge only touches rows whose ``_wm_seq`` is not newer than this
    batch's, which makes the write safe to repeat. With ``insert_missing`` off (replays),
    keys the target does not hold are not inserted: the target cannot tell a key never
    seen from one a newer batch deleted. An empty output commits nothing.

    ``root`` (the control root scheduling the batch) goes into the commit's label.
    ``transaction`` (Delta application id, version), when given, is recorded by the MERGE's
    commit, and Delta skips the MERGE when the target records that transaction at that
    version or later: a retry after the commit, or a batch a forced change fenced
    (:func:`~watermark_dagster.write.fences.fence_target`), commits nothing.

    ``known_keys`` (the keys of ``changes``, one change each, held by the driver) spares the
    summary job: the key ranges come from them and the keys are checked unique inside the
    MERGE's source (:mod:`~watermark_dagster.write.summary`).

    Raises:
        TerminalError: a key column is missing, or several rows share a key and there is
            no ``_commit_version`` to choose the latest.
    """
    prepared = prepare_changes(
        changes, keys=keys, batch_seq=batch_seq, batch_id=batch_id, pipeline=pipeline
    )
    one_per_key = COMMIT_VERSION not in changes.columns and UNTOUCHED not in changes.columns
    by_keys = known_keys is not None and one_per_key
    # Evaluate the transform once: the summary and the MERGE (which scans its source more
    # than once) read the persisted rows. With the keys known there is no summary job, and
    # the MERGE materializes its own source (Delta's `merge.materializeSource`).
    persisted = None if by_keys else prepared.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        if known_keys is not None and by_keys:
            summary = summary_of_keys(prepared, keys, known_keys)
            prepared = refusing_duplicate_keys(prepared, keys)
        else:
            assert persisted is not None
            summary = _summary(persisted, keys, changes, pipeline=pipeline, batch_id=batch_id)
            # The drift flag was for the summary; the MERGE writes the target's columns.
            prepared = persisted.drop(UNTOUCHED)
        drift = {"drift": summary.drift, "drift_sample": summary.drift_sample}
        # The target's log, read once for what this write decides from it.
        table = existing_target(target, storage_options)
        before = None if table is None else table.version()
        if before is not None and summary.rows == 0:
            log.info("pipeline=%s batch=%s: no changes; nothing committed", pipeline, batch_id)
            return replace(WriteResult.nothing(before), **drift)
        label = new_label(pipeline, batch_id, batch_seq, root)
        with labelled_commits(spark, label):
            if table is None:
                schema = prepared.drop(CHANGE_TYPE).schema
                layout = target_layout(
                    spark,
                    schema,
                    keys=keys,
                    merge=True,
                    partition_by=partition_by,
                    cluster_by=cluster_by,
                    change_feed=change_feed,
                )
                with preparing(spark):
                    create_target(spark, target, schema, layout)
                fault_point("after_target_create", where=pipeline)
                small, files = None, None
            else:
                files = pa.table(table.get_add_actions(flatten=True))
                small = _rewrite_bytes(spark, target, table, files, batch_seq)
            if summary.rows:
                rewriting = (
                    session_setting(spark, PERSISTENT_DELETION_VECTORS_CONF, "false")
                    if small is not None
                    else nullcontext()
                )
                if small is not None:
                    log.info(
                        "pipeline=%s batch=%s: target=%s holds %d bytes, under %d: the MERGE "
                        "rewrites the files it touches instead of writing deletion vectors",
                        pipeline,
                        batch_id,
                        target,
                        small,
                        rewrite_below_bytes(spark),
                    )
                with rewriting, _duplicates_named(pipeline, batch_id):
                    _merge(
                        spark,
                        prepared,
                        summary,
                        target=target,
                        keys=keys,
                        # A target created by this write takes every upsert, as a first write.
                        insert_missing=insert_missing or before is None,
                        files=files,
                        transaction=transaction,
                        known_keys=known_keys if by_keys else None,
                    )
        version, commits = commits_since(target, storage_options, before, label, table=table)
        return replace(WriteResult.from_commits(version, commits, created=before is None), **drift)
    finally:
        if persisted is not None:
            persisted.unpersist()


def _summary(
    persisted: DataFrame, keys: Sequence[str], changes: DataFrame, *, pipeline: str, batch_id: str
) -> OutputSummary:
    """The one aggregate over the persisted output (:func:`summarize`), its duplicated key
    refused.

    Raises:
        TerminalError: several rows share a key and ``changes`` has no ``_commit_version``.
    """
    summary = summarize(
        persisted,
        keys=keys,
        check_duplicates=COMMIT_VERSION not in changes.columns,
        ranges=range_keys(persisted, keys),
    )
    error = duplicate_key_error(summary, pipeline=pipeline, batch_id=batch_id)
    if error is not None:
        raise error
    return summary


@contextmanager
def _duplicates_named(pipeline: str, batch_id: str) -> Iterator[None]:
    """A key :func:`~watermark_dagster.write.duplicate_keys.refusing_duplicate_keys` found
    duplicated in the MERGE's source, raised as :func:`duplicate_key_error` (the MERGE
    committed nothing)."""
    try:
        yield
    except Exception as e:
        key = duplicate_key_in(e)
        if key is None:
            raise
        error = duplicate_key_error(key, pipeline=pipeline, batch_id=batch_id)
        assert error is not None
        raise error from e


def _rewrite_bytes(
    spark: SparkSession, target: str, table: RsDeltaTable, files: pa.Table, batch_seq: int
) -> int | None:
    """The target's bytes when this MERGE should rewrite the files it touches instead of
    writing deletion vectors (:func:`rewrites_small_target`), else None.

    Only for a write at least as new as the newest the target records: the files a MERGE
    rewrites are those holding a matched key, whether or not the ``_wm_seq`` guard lets the
    change apply, so a batch older than the target's rows (a replay) would rewrite them and
    commit for nothing, where deletion vectors mark only the rows it changes.
    """
    small = rewrites_small_target(spark, target, table, files)
    if small is None:
        return None
    newest = newest_written_seq(table)
    return small if newest is not None and newest <= batch_seq else None


# The MERGE's source columns are renamed with this prefix, so that a bare column name in
# its conditions and assignments means the target's column and a prefixed one the
# source's: ``DataFrame.mergeInto`` offers no alias for its target.
SOURCE_PREFIX = "__wm_source__"


def _source(name: str) -> Column:
    return F.col(quoted_identifier(SOURCE_PREFIX + name))


@dataclass(frozen=True)
class MergeForm:
    """What our MERGE adds to a plain one, each on by default (the production form).
    ``benchmarks/merge_forms.py`` turns them off one at a time to price each; turning one off
    here changes what the write guarantees, so production code never does.

    Attributes:
        null_safe: keys matched with ``<=>`` (NULL keys are keys), else with ``=``.
        skipping: the target-only key-range condition Delta skips files with.
        broadcast: the broadcast hint on a source under Spark's broadcast threshold.
        schema_evolution: new output columns are added to the target.
        guard: changes apply only over rows no newer than the batch (``_wm_seq``).
    """

    null_safe: bool = True
    skipping: bool = True
    broadcast: bool = True
    schema_evolution: bool = True
    guard: bool = True


def _merge(
    spark: SparkSession,
    prepared: DataFrame,
    summary: OutputSummary,
    *,
    target: str,
    keys: Sequence[str],
    insert_missing: bool,
    files: pa.Table | None = None,
    form: MergeForm = MergeForm(),
    transaction: tuple[str, int] | None = None,
    known_keys: Sequence[tuple[object, ...]] | None = None,
) -> None:
    """One MERGE through PySpark's ``DataFrame.mergeInto`` (Spark's own MERGE plan, which
    Delta's analyzer runs), so the same code runs on a local session, a cluster and a
    Spark Connect server without Delta's Connect plugin."""
    data_columns = [c for c in prepared.columns if c != CHANGE_TYPE]
    target_schema = spark.read.format("delta").load(target).schema
    clashing = [c for c in target_schema.fieldNames() if c.startswith(SOURCE_PREFIX)]
    if clashing:
        raise TerminalError(
            f"Target {target} has column(s) {clashing} whose names start with "
            f"{SOURCE_PREFIX!r}, which the MERGE reserves for its source's columns.",
            fix="rename those columns in the transform's output.",
        )
    added = [c for c in data_columns if c not in target_schema.fieldNames()]
    if added:
        # New output columns (an upstream gained a column) are added to the target first,
        # by an empty append that merges the schema, so the MERGE can assign them.
        with preparing(spark):
            (
                prepared.select(*[quoted(c) for c in data_columns])
                .limit(0)
                .write.format("delta")
                .mode("append")
                .option("mergeSchema", "true")
                .save(target)
            )
    deleting = is_delete(_source(CHANGE_TYPE))
    # Null-safe, as keys are matched everywhere (read.changes.matching_keys): with `=` a
    # NULL key's row would never be updated or deleted, and an upsert would add a second.
    equal = Column.eqNullSafe if form.null_safe else Column.__eq__
    on = reduce(operator.and_, [equal(quoted(k), _source(k)) for k in keys])
    spans = first_key_spans(prepared, keys, summary, files, known_keys) if form.skipping else []
    skip = skipping_condition(prepared, summary, keys, spans, target_schema)
    if skip is not None and form.skipping:
        # Target-only conditions are what Delta's MERGE prunes target files with.
        on = on & skip
    not_older = _source(SEQ_COLUMN) >= quoted(SEQ_COLUMN) if form.guard else F.lit(True)
    assignments: dict[str, Column] = {quoted_identifier(c): _source(c) for c in data_columns}
    source = prepared.select(*[quoted(c).alias(SOURCE_PREFIX + c) for c in prepared.columns])
    if form.broadcast and broadcastable(spark, prepared, summary.rows):
        # Delta materializes a MERGE's source, which hides its size from the planner: without
        # the hint a few changed rows are joined by shuffling every row of the touched files.
        source = F.broadcast(source)
    merge = source.mergeInto(delta_location(target), on)
    if form.schema_evolution:
        merge = merge.withSchemaEvolution()
    merge = (
        merge.whenMatched(deleting & not_older)
        .delete()
        .whenMatched(~deleting & not_older)
        .update(assignments)
    )
    if insert_missing:
        merge = merge.whenNotMatched(~deleting).insert(assignments)
    with idempotent_dml(spark, transaction):
        merge.merge()
