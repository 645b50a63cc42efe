"""Merging a batch's changes into a pipeline's target table, idempotently and at the cost
of what changed.

The target keeps, per row, the sequence number of the batch that last wrote it
(``_wm_seq``). A change is applied only when its batch is at least as new as the row's,
so running the same batch twice (retry after a crash between the target commit and the
checkpoint) changes nothing the second time, and re-running an older batch cannot
overwrite what a newer one wrote.

Cost: the output is persisted once and one aggregate gives every count and check (see
:mod:`~watermark_dagster.write.summary`); the MERGE condition carries the key ranges of
the batch's changes, so Delta skips the files those keys cannot be in, and targets have
deletion vectors, so the files that do hold a changed key are not rewritten, unless the
target is small enough that rewriting them is cheaper (see
:mod:`~watermark_dagster.write.layout`).
"""

import logging
import operator
import re
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import reduce
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable as RsDeltaTable
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

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
from watermark_dagster.write.layout import (
    PERSISTENT_DELETION_VECTORS_CONF,
    create_target,
    rewrite_below_bytes,
    rewrites_small_target,
    target_layout,
)
from watermark_dagster.write.summary import OutputSummary, intervals, range_keys, summarize

log = logging.getLogger("watermark_dagster")

# Up to this many changed keys are fetched to the driver (one small job) to build a
# file-skipping condition finer than one min..max range, of at most this many intervals.
# Beyond it, keys spread over the whole range leave the intervals little to skip.
KEY_LIST_LIMIT = 2_000
MAX_INTERVALS = 32
BROADCAST_THRESHOLD_CONF = "spark.sql.autoBroadcastJoinThreshold"

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


def _literal(value: Any, dtype: T.DataType) -> Column:
    # Cast to the column's own type, so the comparison keeps the bare column (a cast on the
    # column side would make it ineligible for Delta's data skipping).
    return F.lit(value).cast(dtype)


def skipping_condition(
    prepared: DataFrame,
    summary: OutputSummary,
    keys: Sequence[str],
    key_spans: Sequence[tuple[Any, Any]],
    target_schema: T.StructType | None = None,
) -> Column | None:
    """A condition on the target's key columns alone that every row a change can match
    satisfies: Delta uses it to skip files whose min/max statistics lie outside it.

    Per key column, the min..max range of the changes; for the first key, when its
    changed values were fetched, the intervals ``key_spans`` around them (at most
    :data:`MAX_INTERVALS`, from :func:`~watermark_dagster.write.summary.intervals`); either
    or'ed with ``IS NULL`` when a change's key is NULL (the MERGE matches NULL keys). A key
    whose type differs in the target is left out (a cast on the target's column would
    defeat skipping, and a value may not fit the target's type).
    """
    parts: list[Column] = []
    for k, (lo, hi) in summary.key_ranges.items():
        dtype = prepared.schema[k].dataType
        if target_schema is not None and (
            k not in target_schema.fieldNames() or target_schema[k].dataType != dtype
        ):
            continue
        target = quoted(k)
        if k == keys[0] and key_spans:
            spans = [
                (target == _literal(a, dtype))
                if a == b
                else ((target >= _literal(a, dtype)) & (target <= _literal(b, dtype)))
                for a, b in key_spans
            ]
            part = reduce(operator.or_, spans)
        else:
            part = (target >= _literal(lo, dtype)) & (target <= _literal(hi, dtype))
        if k in summary.null_keys:
            part = part | target.isNull()
        parts.append(part)
    return reduce(operator.and_, parts) if parts else None


def _first_key_spans(
    prepared: DataFrame, keys: Sequence[str], summary: OutputSummary, files: pa.Table | None
) -> list[tuple[Any, Any]]:
    """Up to :data:`MAX_INTERVALS` intervals around the first key's changed values, when
    they are few enough to fetch (a small job over the persisted output) and the intervals
    let Delta skip target files that the key's one min..max range does not
    (:func:`intervals_skip_more`); else none."""
    key = keys[0]
    if key not in summary.key_ranges or summary.rows > KEY_LIST_LIMIT:
        return []
    values = [r[0] for r in prepared.select(quoted(key)).collect() if r[0] is not None]
    spans = intervals(values, MAX_INTERVALS)
    if files is not None and not intervals_skip_more(files, key, spans, summary.key_ranges[key]):
        return []
    return spans


def intervals_skip_more(
    files: pa.Table, key: str, spans: Sequence[tuple[Any, Any]], key_range: tuple[Any, Any]
) -> bool:
    """True when a MERGE condition on ``spans`` makes Delta read fewer of the target's
    ``files`` (its add actions, with flattened statistics) than one on ``key_range``.

    From each file's min/max of ``key`` in the log: a file overlapping the range but no
    span is skipped only by the spans. A file without statistics is read either way; keys
    whose statistics cannot be compared with the values give False. When the spans skip
    nothing more (changes spread over every file), the one range is the cheaper condition:
    32 intervals cost Delta's scans of a 2M-row target with deletion vectors 2-3x the time
    of one range (``python -m benchmarks.incremental --sizes 2M --changes 0.1%``).
    """
    low, high = f"min.{key}", f"max.{key}"
    if low not in files.column_names or high not in files.column_names:
        return False
    lo, hi = key_range
    by_range = by_spans = 0
    try:
        for first, last in zip(
            files.column(low).to_pylist(), files.column(high).to_pylist(), strict=True
        ):
            if first is None or last is None or last < lo or first > hi:
                continue
            by_range += 1
            by_spans += any(not (last < a or first > b) for a, b in spans)
    except TypeError:  # statistics of another type than the changed values
        return False
    return by_spans < by_range


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}


def _size_setting(text: str) -> int:
    """A Spark byte-size setting (``10MB``, ``10485760b``, ``-1``) in bytes."""
    match = re.fullmatch(r"\s*(-?\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        return -1
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def _row_bytes(schema: T.StructType) -> int:
    """A rough width of a row (Spark's own default sizes, strings counted generously)."""
    width = 0
    for f in schema.fields:
        dtype = f.dataType
        if isinstance(dtype, T.StringType | T.BinaryType):
            width += 64
        elif isinstance(dtype, T.ArrayType | T.MapType | T.StructType):
            width += 256
        else:
            width += 8
    return width


def _broadcastable(spark: SparkSession, prepared: DataFrame, rows: int) -> bool:
    """True when the changes are small enough, by Spark's own broadcast threshold, to be
    sent to every task instead of shuffling the target."""
    threshold = _size_setting(spark.conf.get(BROADCAST_THRESHOLD_CONF, "10MB") or "-1")
    return threshold > 0 and rows * _row_bytes(prepared.schema) <= threshold


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

    Raises:
        TerminalError: a key column is missing, or several rows share a key and there is
            no ``_commit_version`` to choose the latest.
    """
    prepared = prepare_changes(
        changes, keys=keys, batch_seq=batch_seq, batch_id=batch_id, pipeline=pipeline
    )
    # Evaluate the transform once: the summary and the MERGE (which scans its source more
    # than once) read the persisted rows.
    persisted = prepared.persist(StorageLevel.MEMORY_AND_DISK)
    prepared = persisted
    try:
        summary = summarize(
            prepared,
            keys=keys,
            check_duplicates=COMMIT_VERSION not in changes.columns,
            ranges=range_keys(prepared, keys),
        )
        error = duplicate_key_error(summary, pipeline=pipeline, batch_id=batch_id)
        if error is not None:
            raise error
        drift = {"drift": summary.drift, "drift_sample": summary.drift_sample}
        # The drift flag was for the summary; the MERGE writes the target's columns.
        prepared = persisted.drop(UNTOUCHED)
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
                with rewriting:
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
                    )
        version, commits = commits_since(target, storage_options, before, label, table=table)
        return replace(WriteResult.from_commits(version, commits, created=before is None), **drift)
    finally:
        persisted.unpersist()


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
    spans = _first_key_spans(prepared, keys, summary, files) if form.skipping else []
    skip = skipping_condition(prepared, summary, keys, spans, target_schema)
    if skip is not None and form.skipping:
        # Target-only conditions are what Delta's MERGE prunes target files with.
        on = on & skip
    not_older = _source(SEQ_COLUMN) >= quoted(SEQ_COLUMN) if form.guard else F.lit(True)
    assignments: dict[str, Column] = {quoted_identifier(c): _source(c) for c in data_columns}
    source = prepared.select(*[quoted(c).alias(SOURCE_PREFIX + c) for c in prepared.columns])
    if form.broadcast and _broadcastable(spark, prepared, summary.rows):
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
