"""The ``maintain`` strategy: a declared query's aggregates kept from the change rows.

For each aggregate of :class:`~watermark_dagster.config.maintained.MaintainedForm` (a
``GROUP BY`` over one upstream that sums per-row values) a batch keeps a **state table**:
per group, the rows and the sums and counts its outputs are computed from. The batch folds
its range's change rows, signed (``+1`` inserts and after-images, ``-1`` deletes and
before-images), into per-group deltas and adds them to the state in one MERGE; then the
touched keys' rows are the state's outputs joined to the rest of the query, which runs
over the other upstreams cut down to the touched keys, as the incremental form runs it.
The aggregated upstream's rows are never read again: a batch costs its change rows, the
state's rows of the touched keys and the rest of the query.

**Where the state lives and what it holds.** A Delta table in the target's folder,
``<target>/_watermark_state/<upstream>`` (Delta's ``VACUUM`` of the target leaves folders
whose names start with ``_`` alone). Its every commit is labelled with the upstream
version its rows are the aggregate of, and believed only when its commit was made on what
it names (:mod:`~watermark_dagster.read.state_log`). A batch whose range is
``(start, end]`` therefore:

* adds its deltas when the state reflects ``start - 1`` (the version before the range);
* does nothing when it reflects ``end`` already (a retry after the state's commit, or
  another run of the same batch);
* otherwise rebuilds it from the snapshot at ``end`` (the first batch, a state kept by an
  edited query or a recreated upstream, batches that ran another strategy in between, a
  range a forced change moved, a state whose label is not believed). A rebuild reads the
  whole upstream once, as a recompute does.

No delta is ever added twice or to the wrong base. A run killed between the state's commit
and the target's finds the state at ``end`` and writes the target from it; one killed
before the state's commit adds the deltas then. Two runs of one batch racing on the state
(one read the label, the other committed, and only then the first's MERGE ran, which Delta
does not see as a conflict) cannot double a delta unseen: the first's commit was not made
on the version whose label it believed, so that run fails retryable before writing the
target, and neither it nor anything added on top of it is believed later (the next batch
rebuilds). Each run reads the state at the version it found or committed, never a newer
one. A replay never maintains (it runs ``incremental``), so the state is never moved back.
"""

import logging
import operator
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.config.batch_context import BatchContext
from watermark_dagster.config.key_paths import KeyPath, restrictable
from watermark_dagster.config.maintained import (
    ROWS,
    SIGN,
    MaintainedAggregate,
    MaintainedForm,
    Unmaintainable,
)
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.core.columns import CHANGE_TYPE, DELETE, PREIMAGE
from watermark_dagster.core.faults import fault_point
from watermark_dagster.core.ranges import ReadMode
from watermark_dagster.errors import RetryableError
from watermark_dagster.frames.changes import quoted
from watermark_dagster.frames.delta import (
    USER_METADATA_CONF,
    delta_location,
    existing_target,
    is_write_conflict,
    session_setting,
)
from watermark_dagster.read.changes import matching_keys
from watermark_dagster.read.inputs import UpstreamInput
from watermark_dagster.read.key_values import where_in
from watermark_dagster.read.state_log import (
    added_label,
    believed,
    label_prefix,
    own_commit,
    rebuilt_label,
)

log = logging.getLogger("watermark_dagster")

STATE_FOLDER = "_watermark_state"
_SOURCE = "__wm_delta__"
_EXACT = (T.LongType, T.IntegerType, T.ShortType, T.ByteType)

Touched = list[tuple[object, ...]] | DataFrame


@dataclass(frozen=True)
class StateStep:
    """What a batch did to one aggregate's state.

    Attributes:
        upstream: the aggregated upstream.
        action: ``added`` (the range's deltas), ``rebuilt`` (from the snapshot) or
            ``found`` (it reflected the range's end already).
        before: the version the state reflected before (None: none usable).
        version: the version it reflects now (the range's end).
        state_version: the state table's version that reflects it (what the batch reads).
    """

    upstream: str
    action: str
    before: int | None
    version: int
    state_version: int

    def describe(self) -> str:
        """The step in words: ``payments state added (v4 -> v6)``."""
        was = f"v{self.before}" if self.before is not None else "none"
        return f"{self.upstream} state {self.action} ({was} -> v{self.version})"


def state_location(target: str, upstream: str) -> str:
    """Where ``upstream``'s aggregate state of the pipeline writing ``target`` lives."""
    return f"{target.rstrip('/')}/{STATE_FOLDER}/{upstream}"


@dataclass(frozen=True)
class _Prepared:
    aggregate: MaintainedAggregate
    upstream: str  # as declared
    source: UpstreamInput
    base: int  # the version the range's changes apply to (its start - 1)
    end: int  # the version the state must reflect (the range's end)
    key_columns: list[str]  # the state's key columns, in the target keys' order
    output_types: Mapping[str, T.DataType]


def maintained_rows(
    pipeline: Pipeline,
    form: MaintainedForm,
    batch: BatchContext,
    paths: Mapping[str, tuple[KeyPath, ...]],
    restricted: Mapping[str, DataFrame],
    touched: Touched,
) -> tuple[DataFrame, list[StateStep]] | Unmaintainable:
    """The full transform's rows of the ``touched`` keys (their values, or a frame of
    them), computed from the maintained states and the ``restricted`` snapshots of the
    other upstreams; each state brought to the batch's range end first. Why not, with
    nothing written, when the batch shows it cannot be maintained."""
    spark = batch.spark
    prepared: list[_Prepared] = []
    for aggregate in form.aggregates:
        ready = _prepare(spark, pipeline, aggregate, batch, paths)
        if isinstance(ready, Unmaintainable):
            return ready
        prepared.append(ready)
    steps = [_bring_state(spark, pipeline, p, batch.batch_id) for p in prepared]
    for step in steps:
        log.info("pipeline=%s maintain: %s", pipeline.name, step.describe())
    for p, step in zip(prepared, steps, strict=True):
        state = (
            spark.read.format("delta")
            .option("versionAsOf", step.state_version)
            .load(state_location(pipeline.target, p.upstream))
        )
        kept = F.col(ROWS) > 0
        if p.aggregate.having is not None:
            kept = kept & F.expr(p.aggregate.having)
        rows = _cut(state, p.key_columns, touched, list(pipeline.keys)).where(kept)
        outputs = [
            F.expr(sql).cast(p.output_types[name]).alias(name) for name, sql in p.aggregate.outputs
        ]
        rows.select(*outputs).createOrReplaceTempView(p.aggregate.view)
    aggregated = {p.upstream for p in prepared}
    for upstream, frame in restricted.items():
        if upstream not in aggregated:
            frame.createOrReplaceTempView(upstream)
    return spark.sql(form.sql), steps


def _prepare(
    spark: SparkSession,
    pipeline: Pipeline,
    aggregate: MaintainedAggregate,
    batch: BatchContext,
    paths: Mapping[str, tuple[KeyPath, ...]],
) -> _Prepared | Unmaintainable:
    """What maintaining ``aggregate`` needs, checked against the batch (no job)."""
    upstream = next(u for u in pipeline.upstreams if u.lower() == aggregate.upstream)
    source = batch[upstream]
    assert isinstance(source, UpstreamInput)  # what a running batch binds
    if source.mode is ReadMode.NOOP and source.snapshot_version is not None:
        base = end = source.snapshot_version  # nothing new: the state as it is, or rebuilt
    elif source.changes_are_differences:
        assert source.range is not None  # a change feed or appended files
        base, end = source.range.start - 1, source.range.end
    else:
        return Unmaintainable(
            f"{upstream} is read as {source.mode}, whose rows are not the rows the range "
            "added and removed (a change feed or appended files are)"
        )
    path = restrictable(paths[upstream])
    if path is None or path.computed or len(path.start) != len(aggregate.group):
        return Unmaintainable(
            f"{upstream}'s key path to the target keys is not its GROUP BY columns "
            f"{list(aggregate.group)}"
        )
    starts = [c.lower() for c in path.start]
    if sorted(starts) != sorted(aggregate.group):
        return Unmaintainable(
            f"{upstream} is grouped by {list(aggregate.group)}, but reaches the target keys "
            f"through {list(path.start)}"
        )
    snapshot = source.snapshot
    if SIGN in {c.lower() for c in snapshot.columns}:
        return Unmaintainable(f"{upstream} has a column named {SIGN}, which maintain uses")
    snapshot.withColumn(SIGN, F.lit(1)).createOrReplaceTempView(upstream)
    state_schema = spark.sql(aggregate.state_sql).schema  # analysed only: no job
    for column, average in aggregate.exact_sums:
        kind = state_schema[column].dataType
        exact = isinstance(kind, _EXACT) or (isinstance(kind, T.DecimalType) and not average)
        if not exact:
            what = "an AVG" if average else "a SUM"
            return Unmaintainable(
                f"{what} over {upstream} adds {kind.simpleString()} values, whose sum depends "
                "on the order of the additions (exact numbers are maintained: integers, and "
                "decimals for SUM)"
            )
    original = spark.sql(aggregate.original_sql).schema
    return _Prepared(
        aggregate=aggregate,
        upstream=upstream,
        source=source,
        base=base,
        end=end,
        key_columns=[f"_wm_g{aggregate.group.index(c)}" for c in starts],
        output_types={f.name: f.dataType for f in original.fields},
    )


def _cut(state: DataFrame, columns: list[str], touched: Touched, keys: list[str]) -> DataFrame:
    """The state's rows of the touched keys."""
    if isinstance(touched, DataFrame):
        return matching_keys(state, touched, columns, keys)
    return where_in(state, columns, touched)


def _label(p: _Prepared) -> str:
    return label_prefix(p.aggregate.fingerprint, p.source.table_id)


def _raced(pipeline: Pipeline, batch_id: str, location: str, cause: object) -> RetryableError:
    return RetryableError(
        f"Pipeline '{pipeline.name}': another run changed the aggregate state at {location} "
        f"while batch {batch_id} brought it forward ({cause}). Nothing of this run was "
        "written to the target. The next run adds the batch's changes to the state where "
        "it can show what the state holds, and rebuilds it from the snapshot where not.",
        pipeline=pipeline.name,
        batch_id=batch_id,
        fix="none needed: the batch is retried by the coordinator (another run wrote the "
        "state at the same time, e.g. a re-executed run beside the first).",
    )


def _bring_state(spark: SparkSession, pipeline: Pipeline, p: _Prepared, batch_id: str) -> StateStep:
    """Bring ``p``'s state to the range's end: add the deltas, rebuild, or find it there."""
    location = state_location(pipeline.target, p.upstream)
    options = dict(resolved_options(pipeline.storage_options) or {})
    prefix = _label(p)
    table = existing_target(location, options)
    # A state kept for an upstream whose table id is unknown could be a recreated table's:
    # it is rebuilt every batch.
    found = believed(table, prefix) if p.source.table_id is not None else None
    before, top = found if found is not None else (None, None)
    run = uuid.uuid4().hex[:12]  # names this run's commit: hexadecimal digits only
    end = p.end
    if before == end:
        assert top is not None
        return StateStep(p.upstream, "found", before, end, top)
    if before is not None and before == p.base:
        assert table is not None
        assert top is not None
        label = added_label(prefix, end, before, top, run)
        try:
            _add_deltas(spark, p, location, label)
            table.update_incremental()
            if table.version() == top:  # nothing changed: Delta made no commit
                _empty_commit(spark, location, label, run)
        except Exception as e:  # Delta's conflict: another run committed to the state
            if is_write_conflict(e):
                raise _raced(pipeline, batch_id, location, "a Delta commit conflict") from e
            raise
        action = "added"
    else:
        label = rebuilt_label(prefix, end, run)
        try:
            _rebuild(spark, p, location, label)
        except Exception as e:
            if is_write_conflict(e):
                raise _raced(pipeline, batch_id, location, "a Delta commit conflict") from e
            raise
        action = "rebuilt"
    written = existing_target(location, options)
    mine = None if written is None else own_commit(written, label, prefix)
    if mine is None:
        made = f"on state version {top}" if action == "added" else "on the version it read"
        raise _raced(pipeline, batch_id, location, f"its commit was not made {made}")
    fault_point("after_state_commit", where=pipeline.name)
    return StateStep(p.upstream, action, before, end, mine)


def _rebuild(spark: SparkSession, p: _Prepared, location: str, label: str) -> None:
    """The state written from the snapshot at the range's end (the view ``_prepare``
    made)."""
    state = spark.sql(p.aggregate.state_sql)
    keys = [c for c in state.columns if c.startswith("_wm_g")]
    (
        state.where(F.col(ROWS) != 0)
        .orderBy(*keys)  # key ranges per file: a batch reads the files of its keys
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .option("userMetadata", label)
        .save(location)
    )


def _signed(changes: DataFrame) -> DataFrame:
    """The change rows with ``_wm_sign``: -1 for what the range removed, +1 for what it
    added."""
    removed = F.col(CHANGE_TYPE).isin(DELETE, PREIMAGE)
    return changes.withColumn(SIGN, F.when(removed, F.lit(-1)).otherwise(F.lit(1)))


def _add_deltas(spark: SparkSession, p: _Prepared, location: str, label: str) -> None:
    """One MERGE adding the range's per-group deltas to the state; a group whose rows
    reach 0 is deleted."""
    _signed(p.source.changes).createOrReplaceTempView(p.upstream)
    deltas = spark.sql(p.aggregate.state_sql)
    values = [c.name for c in p.aggregate.state]
    keys = [c for c in deltas.columns if c not in values]
    # A group whose rows came and went in the range changes nothing.
    moved = reduce(operator.or_, [F.col(v) != 0 for v in values])
    source = deltas.where(moved).select(*[quoted(c).alias(_SOURCE + c) for c in deltas.columns])
    on = reduce(operator.and_, [quoted(k).eqNullSafe(quoted(_SOURCE + k)) for k in keys])
    emptied = (F.col(ROWS) + quoted(_SOURCE + ROWS)) == 0
    added = {v: quoted(v) + quoted(_SOURCE + v) for v in values}
    merge = (
        source.mergeInto(delta_location(location), on)
        .whenMatched(emptied)
        .delete()
        .whenMatched()
        .update(added)
        .whenNotMatched()
        .insert({c: quoted(_SOURCE + c) for c in deltas.columns})
    )
    with session_setting(spark, USER_METADATA_CONF, label):
        merge.merge()
    # Put the view back on the snapshot: the query's own views are the snapshots.
    p.source.snapshot.withColumn(SIGN, F.lit(1)).createOrReplaceTempView(p.upstream)


def _empty_commit(spark: SparkSession, location: str, label: str, run: str) -> None:
    """A commit that changes no row, labelled: the state reflects ``label``'s version.

    Delta commits nothing for an append of no rows, so this sets a table property naming
    the ``run`` (hexadecimal digits, made here; the location is a quoted identifier)."""
    assert run.isalnum(), run
    with session_setting(spark, USER_METADATA_CONF, label):
        spark.sql(
            f"ALTER TABLE {delta_location(location)} "
            f"SET TBLPROPERTIES ('watermark.stateRun' = '{run}')"
        )


def state_views(steps: Sequence[StateStep]) -> str:
    """The steps in words, for the strategy's reason."""
    return "; ".join(s.describe() for s in steps)
