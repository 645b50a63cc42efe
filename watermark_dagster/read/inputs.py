"""What a transform gets for one upstream: the pinned changes and the pinned snapshot.

Every read is reproducible from the plan alone (I3): a version range reads the same
commits every time, and a cursor window's end is pinned by the first read and reused.
Before anything is read, the range is checked against the table (still the same table,
its commits still there, its schema still compatible), so an unreadable range fails
loudly, before any write (I6).
"""

import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property, reduce

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.config.upstream import OnDataChange, Upstream
from watermark_dagster.core.columns import (
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    INSERT,
    PREIMAGE,
)
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import CursorPosition, CursorWindow, ReadMode, VersionRange
from watermark_dagster.errors import UpstreamUnreadableError
from watermark_dagster.read import log as delta_log
from watermark_dagster.read.changes import latest_per_key

log = logging.getLogger("watermark_dagster")

# Pins a cursor window's end: (end position or None, when the rows held back by the lag
# pass it, in microseconds since the epoch, or None) -> the pinned window.
PinWindow = Callable[[CursorPosition | None, int | None], CursorWindow]


def _reader(spark: SparkSession, upstream: Upstream, fmt: str = "delta"):  # noqa: ANN202
    reader = spark.read.format(fmt)
    for key, value in {**(upstream.storage_options or {}), **(upstream.read_options or {})}.items():
        reader = reader.option(key, value)
    return reader


def read_snapshot(spark: SparkSession, upstream: Upstream, version: int) -> DataFrame:
    """The upstream as of ``version`` (Delta time travel)."""
    return _reader(spark, upstream).option("versionAsOf", version).load(upstream.path)


def read_changes(spark: SparkSession, upstream: Upstream, rng: VersionRange) -> DataFrame:
    """The change data feed of ``upstream`` for the inclusive range ``rng``."""
    return (
        _reader(spark, upstream)
        .option("readChangeFeed", "true")
        .option("startingVersion", rng.start)
        .option("endingVersion", rng.end)
        .load(upstream.path)
    )


def _as_changes(rows: DataFrame, version: int | None) -> DataFrame:
    """Rows presented as change rows: all inserts, at ``version``."""
    return (
        rows.withColumn(CHANGE_TYPE, F.lit(INSERT))
        .withColumn(COMMIT_VERSION, F.lit(version).cast(T.LongType()))
        .withColumn(COMMIT_TIMESTAMP, F.lit(None).cast(T.TimestampType()))
    )


def read_appended(
    spark: SparkSession, upstream: Upstream, rng: VersionRange, scan: delta_log.AppendScan
) -> DataFrame:
    """Rows of exactly the files the range's commits added, with their commit version.

    The files are read directly (OPTIMIZE may have rewritten them into files that also
    hold older rows, which must not be read again); partition values come from the log.
    """
    schema = read_snapshot(spark, upstream, rng.end).schema
    partitions = set(delta_log.partition_columns(upstream, rng.end))
    mapping_schema = T.StructType(
        [T.StructField("_wm_file", T.StringType()), T.StructField(COMMIT_VERSION, T.LongType())]
        + [T.StructField(f"_wm_p_{c}", T.StringType()) for c in sorted(partitions)]
    )
    if not scan.files:
        return _as_changes(spark.createDataFrame([], schema), None).where(F.lit(False))
    config = delta_log.configuration(upstream, rng.end)
    if config.get("delta.columnmapping.mode", "none") != "none":
        raise UpstreamUnreadableError(
            f"Upstream '{upstream.name}' uses column mapping, which an append-only read of its "
            "files cannot follow.",
            upstream=upstream.name,
            versions=f"range={rng}",
            fix="enable the change data feed on the table and run "
            f"`watermark reset -t {upstream.name} --force`, or set mode='snapshot'.",
        )
    data_schema = T.StructType([f for f in schema.fields if f.name not in partitions])
    paths = [delta_log.absolute_file(upstream, f.path) for f in scan.files]
    mapping = spark.createDataFrame(
        [
            (
                p.rsplit("/", 1)[-1],
                f.version,
                *[f.partition_values.get(c) for c in sorted(partitions)],
            )
            for p, f in zip(paths, scan.files, strict=True)
        ],
        mapping_schema,
    )
    rows = (
        _reader(spark, upstream, "parquet")
        .schema(data_schema)
        .load(paths)
        .withColumn("_wm_file", F.col("_metadata.file_name"))
        .join(F.broadcast(mapping), "_wm_file")
    )
    columns = [
        F.col(f"_wm_p_{f.name}").cast(f.dataType).alias(f.name)
        if f.name in partitions
        else F.col(f"`{f.name}`")
        for f in schema.fields
    ]
    return (
        rows.select(*columns, F.col(COMMIT_VERSION))
        .withColumn(CHANGE_TYPE, F.lit(INSERT))
        .withColumn(COMMIT_TIMESTAMP, F.lit(None).cast(T.TimestampType()))
    )


# ------------------------------------------------------------------ cursor windows


def cursor_value(source: DataFrame, upstream: Upstream) -> Column:
    """The effective cursor as a comparable value: microseconds since the epoch for
    timestamps (time-zone free), days for dates, the value itself otherwise."""
    assert upstream.cursor is not None
    names = [upstream.cursor] + ([upstream.cursor_fallback] if upstream.cursor_fallback else [])
    values = []
    for name in names:
        dtype = source.schema[name].dataType
        col = F.col(f"`{name}`")
        if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
            values.append(F.unix_micros(col.cast(T.TimestampType())))
        elif isinstance(dtype, T.DateType):
            values.append(F.unix_date(col))
        else:
            values.append(col)
    return values[0] if len(values) == 1 else F.coalesce(*values)


def is_time_cursor(source: DataFrame, upstream: Upstream) -> bool:
    """True when the cursor is a timestamp (so the lag applies)."""
    assert upstream.cursor is not None
    dtype = source.schema[upstream.cursor].dataType
    return isinstance(dtype, T.TimestampType | T.TimestampNTZType)


def _position_columns(source: DataFrame, upstream: Upstream) -> list[Column]:
    return [cursor_value(source, upstream)] + [F.col(f"`{k}`") for k in upstream.tie_break]


def _compare(
    cols: Sequence[Column], position: CursorPosition, strict: bool, greater: bool
) -> Column:
    """Lexicographic ``cols > position`` (or ``>=``, ``<``, ``<=``)."""
    op = operator.gt if greater else operator.lt
    result = F.lit(not strict)
    for col, value in reversed(list(zip(cols, position, strict=False))):
        result = op(col, F.lit(value)) | ((col == F.lit(value)) & result)
    return result


def in_window(source: DataFrame, upstream: Upstream, window: CursorWindow) -> Column:
    """``start < position <= end`` on (cursor, *tie_break)."""
    cols = _position_columns(source, upstream)
    cond = cols[0].isNotNull()
    if window.start:
        cond = cond & _compare(cols, window.start, strict=True, greater=True)
    if window.end is not None:
        if len(window.end) == 0:
            return F.lit(False)
        cond = cond & _compare(cols, window.end, strict=False, greater=False)
    return cond


@dataclass(frozen=True)
class PinnedEnd:
    """What the data said when a window's end was pinned.

    Attributes:
        end: the greatest position at or below the ceiling (None: no such row).
        held_back: rows after the start whose cursor is above the ceiling (the lag).
        recheck_at: when the earliest held-back row passes the lag (µs since the epoch).
        no_cursor: rows whose cursor (and fallback) is NULL: never read.
    """

    end: CursorPosition | None
    held_back: int
    recheck_at: int | None
    no_cursor: int


def pin_end(
    source: DataFrame, upstream: Upstream, window: CursorWindow, now: datetime
) -> PinnedEnd:
    """The end a new window should have: the greatest position among rows after the
    start whose cursor is at or below the ceiling (``now`` minus the lag, for timestamp
    cursors)."""
    cols = _position_columns(source, upstream)
    after = in_window(source, upstream, CursorWindow(window.start, None))
    below = F.lit(True)
    if is_time_cursor(source, upstream):
        ceiling = now - timedelta(seconds=upstream.lag_seconds)
        micros = int(ceiling.timestamp() * 1_000_000)
        below = cols[0] <= F.lit(micros)
    lag_micros = int(upstream.lag_seconds * 1_000_000)
    struct = F.struct(*[c.alias(f"p{i}") for i, c in enumerate(cols)])
    row = source.select(
        F.max(F.when(after & below, struct)).alias("end"),
        F.sum(F.when(after & ~below, 1).otherwise(0)).alias("held_back"),
        F.min(F.when(after & ~below, cols[0])).alias("first_held"),
        F.sum(F.when(cols[0].isNull(), 1).otherwise(0)).alias("no_cursor"),
    ).first()
    assert row is not None
    first_held = row["first_held"]
    return PinnedEnd(
        end=None if row["end"] is None else tuple(row["end"]),
        held_back=int(row["held_back"] or 0),
        recheck_at=None if first_held is None else int(first_held) + lag_micros,
        no_cursor=int(row["no_cursor"] or 0),
    )


# ------------------------------------------------------------------ the input


@dataclass
class UpstreamInput:
    """One upstream as a batch pinned it, for one pipeline.

    Attributes:
        name: the upstream's name.
        mode: how it is read for this pipeline: the planned mode, or SNAPSHOT when the
            pipeline loads fully (first run, overwrite, an append-only range that changed
            rows with ``on_data_change="snapshot"``).
        range: the inclusive version range, None for NOOP and cursor upstreams.
        snapshot_version: the version ``snapshot`` is read at (None for cursor upstreams).
        window: the pinned cursor window of a cursor upstream.
        files_read: data files an APPEND_ONLY read opened (None for other modes).
    """

    name: str
    mode: ReadMode
    range: VersionRange | None
    snapshot_version: int | None
    window: CursorWindow | None
    _spark: SparkSession
    _upstream: Upstream
    files_read: int | None = None
    rows_without_cursor: int = 0
    _scan: delta_log.AppendScan | None = field(default=None, repr=False)

    @classmethod
    def pinned(
        cls,
        spark: SparkSession,
        upstream: Upstream,
        planned: PlannedInput,
        *,
        full_load: bool = False,
        table_id: str | None = None,
        pin: PinWindow | None = None,
        now: datetime | None = None,
    ) -> "UpstreamInput":
        """Bind a planned input to Spark after checking it can be read as planned.

        Cursor windows are pinned here (the first read fixes the end).

        Raises:
            UpstreamRecreatedError, UpstreamUnreadableError, UpstreamSchemaChangedError,
            UpstreamDataChangedError: the range cannot be read as planned (I6).
        """
        mode, scan = planned.mode, None
        window = planned.window
        rows_without_cursor = 0
        if planned.is_cursor:
            assert window is not None
            if not window.pinned:
                if pin is None:
                    raise ValueError(f"{upstream.name}: an unpinned window needs a pin callback")
                source = read_source(spark, upstream)
                found = pin_end(source, upstream, window, now or datetime.now(UTC))
                rows_without_cursor = found.no_cursor
                if found.held_back or found.no_cursor:
                    log.warning(
                        "upstream=%s: %d row(s) held back by the lag (read by a later batch), "
                        "%d row(s) with no cursor value (never read)",
                        upstream.name,
                        found.held_back,
                        found.no_cursor,
                    )
                window = pin(found.end, found.recheck_at)
            if full_load:
                mode = ReadMode.SNAPSHOT
        else:
            assert planned.snapshot_version is not None
            rng = planned.range
            if rng is not None:
                delta_log.check_identity(upstream, rng, table_id)
            if mode in (ReadMode.CDF, ReadMode.APPEND_ONLY) and not full_load:
                assert rng is not None
                delta_log.require_commits(upstream, rng)
                delta_log.check_schema(upstream, rng)
            if mode is ReadMode.APPEND_ONLY and not full_load:
                assert rng is not None
                scan = delta_log.scan_appends(upstream, rng)
                if scan.data_changes:
                    if upstream.on_data_change is not OnDataChange.SNAPSHOT:
                        raise delta_log.data_changed_error(upstream, rng, scan)
                    log.warning(
                        "upstream=%s range=%s: commits %s change rows; reading a snapshot "
                        "(on_data_change='snapshot')",
                        upstream.name,
                        rng,
                        [v for v, _ in scan.data_changes],
                    )
                    mode, scan = ReadMode.SNAPSHOT, None
            if full_load:
                mode = ReadMode.SNAPSHOT
        return cls(
            name=upstream.name,
            mode=mode,
            range=planned.range,
            snapshot_version=planned.snapshot_version,
            window=window,
            _spark=spark,
            _upstream=upstream,
            files_read=len(scan.files) if scan is not None else None,
            rows_without_cursor=rows_without_cursor,
            _scan=scan,
        )

    @property
    def reads_snapshot(self) -> bool:
        """True when this input is read as a whole snapshot (a full load)."""
        return self.mode is ReadMode.SNAPSHOT

    @cached_property
    def snapshot(self) -> DataFrame:
        """The table as of the range's end (the committed version for NOOP); for a cursor
        upstream, every row up to the window's end."""
        if self.window is not None:
            source = read_source(self._spark, self._upstream)
            upto = CursorWindow(None, self.window.end if self.window.end is not None else ())
            return source.where(in_window(source, self._upstream, upto))
        assert self.snapshot_version is not None
        return read_snapshot(self._spark, self._upstream, self.snapshot_version)

    @cached_property
    def changes(self) -> DataFrame:
        """Every change row the batch pins, with ``_change_type``, ``_commit_version`` and
        ``_commit_timestamp``: the change feed (update pre-images included), the appended
        rows, the window's rows, or the whole snapshot as inserts. Empty for NOOP."""
        if self.mode is ReadMode.NOOP:
            return _as_changes(self.snapshot, None).limit(0)
        if self.mode is ReadMode.SNAPSHOT:
            frame = _as_changes(self.snapshot, self.snapshot_version)
        elif self.mode is ReadMode.TIMESTAMP:
            assert self.window is not None
            source = read_source(self._spark, self._upstream)
            frame = _as_changes(source.where(in_window(source, self._upstream, self.window)), None)
        elif self.mode is ReadMode.APPEND_ONLY:
            assert self.range is not None and self._scan is not None
            frame = read_appended(self._spark, self._upstream, self.range, self._scan)
        else:
            assert self.range is not None
            frame = read_changes(self._spark, self._upstream, self.range)
        # Read once: the transform and the rows-read count both use it.
        return frame.persist(StorageLevel.MEMORY_AND_DISK)

    def count_rows(self) -> int:
        """Rows in ``changes`` (this is where Spark first reads the range).

        Raises:
            UpstreamUnreadableError: the change files, data files or log versions the range
                needs are gone, or the change data feed was off for part of it.
        """
        if self.mode is ReadMode.NOOP:
            return 0
        try:
            return self.changes.count()
        except Exception as e:  # noqa: BLE001 - Spark's errors are matched by their text
            raise unreadable(self._upstream, self.describe(), e) from e

    def release(self) -> None:
        """Drop the cached change rows (called when the pipeline's batch is done)."""
        if "changes" in self.__dict__:
            self.__dict__.pop("changes").unpersist()

    def describe(self) -> str:
        """``CDF [3, 5]``, ``SNAPSHOT @5``, ``TIMESTAMP (a .. b]``, ``NOOP``."""
        if self.mode is ReadMode.NOOP:
            return "NOOP"
        if self.window is not None:
            return f"{self.mode.value} {self.window}"
        if self.mode is ReadMode.SNAPSHOT:
            return f"SNAPSHOT @{self.snapshot_version}"
        return f"{self.mode.value} {self.range}"

    def net_changes(self, keys: Sequence[str]) -> DataFrame:
        """The latest change per key: ``insert``, ``update_postimage`` or ``delete`` rows,
        one per key, pre-images dropped.

        The latest is the change of the highest commit version; inside one commit the row
        describing the state after it wins over a delete of the same key (a RESTORE or a
        rewrite without change files removes and re-adds a key in one commit); for a cursor
        upstream, the row with the greatest cursor (see :mod:`watermark_dagster.read.changes`).
        """
        then: list[Column] = []
        if self.window is not None:
            then = [c.desc_nulls_last() for c in _position_columns(self.changes, self._upstream)]
        changes = self.changes.where(F.col(CHANGE_TYPE) != PREIMAGE)
        return latest_per_key(changes, keys, *then)

    def changed_keys(self, columns: Sequence[str]) -> DataFrame:
        """Distinct values of ``columns`` over every change row (pre-images included), e.g.
        the customer ids whose rows moved, before and after the change."""
        present = reduce(operator.and_, [F.col(f"`{c}`").isNotNull() for c in columns])
        return self.changes.select(*[F.col(f"`{c}`") for c in columns]).where(present).distinct()


def read_source(spark: SparkSession, upstream: Upstream) -> DataFrame:
    """A cursor upstream's current data (any Spark-readable source)."""
    return _reader(spark, upstream, upstream.format).load(upstream.path)


_CAUSES = (
    (
        ("DELTA_MISSING_CHANGE_DATA", "change data was not recorded", "CHANGE_DATA_NOT_RECORDED"),
        "the change data feed was off for part of the range",
        "turn the change data feed back on (delta.enableChangeDataFeed = true), then run "
        "`watermark reset -t {name} --force` to reload the table from a snapshot.",
    ),
    (
        ("FileNotFound", "FILE_NOT_FOUND", "does not exist", "CHANGE_DATA_FILE_NOT_FOUND"),
        "files the range needs were removed (VACUUM)",
        "run `watermark reset -t {name} --force` to reload the table from a snapshot; to "
        "prevent it, keep delta.deletedFileRetentionDuration longer than your batch delay.",
    ),
    (
        ("VersionNotFound", "Cannot time travel", "VERSIONS_NOT_CONTIGUOUS", "TIME_TRAVEL"),
        "log versions the range needs were cleaned up",
        "run `watermark reset -t {name} --force` to reload the table from a snapshot; to "
        "prevent it, keep delta.logRetentionDuration longer than your batch delay.",
    ),
)


def unreadable(upstream: Upstream, what: str, error: BaseException) -> BaseException:
    """Turn Spark's failure to read a pinned range into a named, actionable error; other
    failures pass through unchanged.

    The message keeps Spark's own first line without the py4j call noise ("An error
    occurred while calling o59.count.") or the Java class in front of it, and names the
    missing file when Spark's text holds its path.
    """
    import re

    text = str(error)
    lines = [line.strip() for line in text.splitlines()]
    meaningful = [
        line.lstrip(": ").strip()
        for line in lines
        if line
        and not re.fullmatch(r"An error occurred while calling [\w$.]+\.?", line)
        and not line.startswith(("at ", "..."))
    ]
    first = meaningful[0] if meaningful else text.strip()
    # "org.apache.spark.SparkException: [FAILED_READ_FILE...] ..." -> "[FAILED_READ_FILE...] ..."
    first = re.sub(r"^(?:[a-z_][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error): ", "", first)[:500]
    path = None
    for pattern in (
        r"reading file (\S+?)\.? File does not exist",
        r"File (\S+) does not exist",
        r"FileNotFoundException: (?:File )?(\S+)",
    ):
        found = re.search(pattern, text)
        if found:
            path = found.group(1).rstrip(".")
            break
    for needles, cause, fix in _CAUSES:
        if any(n.lower() in text.lower() for n in needles):
            missing = f"; missing file: {path}" if path else ""
            return UpstreamUnreadableError(
                f"Upstream '{upstream.name}': the batch's read {what} failed because {cause}"
                f"{missing}. Spark: {first} Nothing was written and no watermark moved.",
                upstream=upstream.name,
                versions=what,
                fix=fix.format(name=upstream.name),
            )
    return error
