"""The cursor-window reader: rows of a source whose (cursor, *tie_break) position lies in
a window, and how a new window's end is pinned.

A database upstream (:mod:`~watermark_dagster.read.database`) is compared on its raw
columns against literals of their own types, which Spark pushes to the database as its
query's ``WHERE``; other sources compare a time-zone free value (microseconds, days)."""

import logging
import operator
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.upstream import CursorUpstream
from watermark_dagster.core.ranges import CursorPosition, CursorWindow
from watermark_dagster.errors import ConfigurationError, UpstreamUnavailableError
from watermark_dagster.observe.database_state import null_cursor_fix, null_cursor_message
from watermark_dagster.read.database import (
    literal_of,
    live_rows,
    read_table,
    value_of,
    with_deletes,
)
from watermark_dagster.read.database_pin import PinnedEnd, Sightings, pin_in_database
from watermark_dagster.read.frames import as_changes, spark_reader

log = logging.getLogger("watermark_dagster")


def read_source(
    spark: SparkSession,
    upstream: CursorUpstream,
    version: int | None = None,
    window: CursorWindow | None = None,
) -> DataFrame:
    """A cursor upstream's data (any Spark-readable source): a Delta source as of
    ``version`` when given (the version its batch was planned at), else its current data.
    A database table is read in ``partitions`` ranges of ``window`` when it is given."""
    if isinstance(upstream, DatabaseUpstream):
        table = read_table(spark, upstream)
        if upstream.partitions == 1 or window is None or window.end is None or not window.end:
            return table
        dtype = table.schema[upstream.cursor].dataType
        high = value_of(dtype, window.end[0])
        if window.start:
            low = value_of(dtype, window.start[0])
        else:  # the first window: from the lowest cursor (one pruned, filtered aggregate)
            cursor = F.col(f"`{upstream.cursor}`")
            low = table.where(cursor <= F.lit(high)).agg(F.min(cursor)).first()[0]  # pyright: ignore[reportOptionalSubscript]
        return read_table(spark, upstream, (low, high))
    reader = spark_reader(spark, upstream, upstream.format)
    if version is not None and upstream.format == "delta":
        reader = reader.option("versionAsOf", version)
    return reader.load(upstream.path)


def cursor_value(source: DataFrame, upstream: CursorUpstream) -> Column:
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


def is_time_cursor(source: DataFrame, upstream: CursorUpstream) -> bool:
    """True when the cursor is a timestamp (so the lag applies)."""
    assert upstream.cursor is not None
    dtype = source.schema[upstream.cursor].dataType
    return isinstance(dtype, T.TimestampType | T.TimestampNTZType)


def _without_position(cols: list[Column]) -> Column:
    """A row with a NULL in its position (the cursor or a tie-break column)."""
    missing = cols[0].isNull()
    for tie in cols[1:]:
        missing = missing | tie.isNull()
    return missing


def position_columns(source: DataFrame, upstream: CursorUpstream) -> list[Column]:
    """The columns of a row's position: the effective cursor, then the tie-break keys."""
    return [cursor_value(source, upstream)] + [F.col(f"`{k}`") for k in upstream.tie_break]


def _literals(
    source: DataFrame, upstream: CursorUpstream, position: CursorPosition
) -> list[Column]:
    """A position's values as literals: of the raw columns' types for a database upstream,
    as they are otherwise."""
    if not isinstance(upstream, DatabaseUpstream):
        return [F.lit(v) for v in position]
    names = upstream.columns_read
    return [literal_of(source.schema[n].dataType, v) for n, v in zip(names, position, strict=False)]


def _compare(
    cols: Sequence[Column], values: Sequence[Column], strict: bool, greater: bool
) -> Column:
    """Lexicographic ``cols > values`` (or ``>=``, ``<``, ``<=``)."""
    op = operator.gt if greater else operator.lt
    result = F.lit(not strict)
    for col, value in reversed(list(zip(cols, values, strict=False))):
        result = op(col, value) | ((col == value) & result)
    return result


def in_window(source: DataFrame, upstream: CursorUpstream, window: CursorWindow) -> Column:
    """``start < position <= end`` on (cursor, *tie_break); for a database upstream, on the
    raw columns, so the database evaluates it."""
    if isinstance(upstream, DatabaseUpstream):
        cols = [F.col(f"`{c}`") for c in upstream.columns_read]
    else:
        cols = position_columns(source, upstream)
    # A NULL anywhere in a position compares to nothing: such rows are in no window, and
    # counted as rows without a position (pin_end).
    cond = cols[0].isNotNull()
    for tie in cols[1:]:
        cond = cond & tie.isNotNull()
    if window.start:
        start = _literals(source, upstream, window.start)
        cond = cond & _compare(cols, start, strict=True, greater=True)
    if window.end is not None:
        if len(window.end) == 0:
            return F.lit(False)
        end = _literals(source, upstream, window.end)
        cond = cond & _compare(cols, end, strict=False, greater=False)
    return cond


def window_rows(
    spark: SparkSession,
    upstream: CursorUpstream,
    window: CursorWindow,
    version: int | None = None,
) -> DataFrame:
    """The rows of a pinned window (see :func:`read_source` for ``version``)."""
    source = read_source(spark, upstream, version, window)
    return source.where(in_window(source, upstream, window))


def window_changes(
    spark: SparkSession,
    upstream: CursorUpstream,
    window: CursorWindow,
    version: int | None = None,
) -> DataFrame:
    """A window's rows as change rows: inserts, and deletes where a database upstream's
    soft-delete column says so."""
    changes = as_changes(window_rows(spark, upstream, window, version), None)
    return with_deletes(changes, upstream) if isinstance(upstream, DatabaseUpstream) else changes


def snapshot_rows(
    spark: SparkSession,
    upstream: CursorUpstream,
    window: CursorWindow,
    version: int | None = None,
) -> DataFrame:
    """Every row up to a pinned window's end (without the rows a database upstream's
    soft-delete column marks deleted)."""
    upto = CursorWindow(None, window.end if window.end is not None else ())
    rows = window_rows(spark, upstream, upto, version)
    return live_rows(rows, upstream) if isinstance(upstream, DatabaseUpstream) else rows


def pin_end(
    source: DataFrame, upstream: CursorUpstream, window: CursorWindow, now: datetime
) -> PinnedEnd:
    """The end a new window should have: the greatest position among rows after the
    start whose cursor is at or below the ceiling (``now`` minus the lag, for timestamp
    cursors), by Spark over the whole source. A database table's end is pinned by the
    database itself (``source`` is not read:
    :func:`~watermark_dagster.read.database_pin.pin_in_database`), by the same order that
    filters its windows.

    Raises:
        ConfigurationError: ``lag_seconds`` is set on a cursor that is not a timestamp
            (an integer or a date), where it has no meaning.
    """
    if isinstance(upstream, DatabaseUpstream):
        return pin_in_database(upstream, window, now)
    after = in_window(source, upstream, CursorWindow(window.start, None))
    cols = position_columns(source, upstream)
    below = F.lit(True)
    timed = is_time_cursor(source, upstream)
    if upstream.lag_seconds and not timed:
        dtype = source.schema[upstream.cursor].dataType.simpleString()
        raise ConfigurationError(
            f"Upstream '{upstream.name}': lag_seconds={upstream.lag_seconds:g} applies to a "
            f"timestamp cursor only; {upstream.cursor} is {dtype}, where a lag has no "
            "meaning. Nothing was read.",
            upstream=upstream.name,
            fix="remove lag_seconds, or read the source by a timestamp cursor.",
        )
    if timed:
        ceiling = now - timedelta(seconds=upstream.lag_seconds)
        micros = int(ceiling.timestamp() * 1_000_000)
        below = cols[0] <= F.lit(micros)
    lag_micros = int(upstream.lag_seconds * 1_000_000)
    struct = F.struct(*[c.alias(f"p{i}") for i, c in enumerate(cols)])
    row = source.select(
        F.max(F.when(after & below, struct)).alias("end"),
        F.sum(F.when(after & ~below, 1).otherwise(0)).alias("held_back"),
        F.min(F.when(after & ~below, cols[0])).alias("first_held"),
        F.sum(F.when(_without_position(cols), 1).otherwise(0)).alias("no_cursor"),
    ).first()
    assert row is not None
    first_held = row["first_held"]
    return PinnedEnd(
        end=None if row["end"] is None else tuple(row["end"]),
        held_back=int(row["held_back"] or 0),
        recheck_at=None if first_held is None else int(first_held) + lag_micros,
        no_cursor=int(row["no_cursor"] or 0),
    )


# Pins a cursor window's end: (end position or None, when the rows held back by the lag
# pass it, in microseconds since the epoch, or None) -> the pinned window.
PinWindow = Callable[[CursorPosition | None, int | None], CursorWindow]


def pin_window(
    spark: SparkSession,
    upstream: CursorUpstream,
    window: CursorWindow,
    pin: PinWindow | None,
    now: datetime,
    version: int | None = None,
    sightings: Sightings | None = None,
) -> tuple[CursorWindow, int]:
    """The window with its end pinned (unchanged when already pinned: the first read fixes
    it), and how many rows have no cursor value (never read). A Delta source is read as of
    ``version`` (see :func:`read_source`); a database table's integer cursor with a lag
    ends where ``sightings`` say (:func:`~.database_pin.pin_in_database`).

    Raises:
        ValueError: the window is not pinned and no ``pin`` callback was given.
    """
    if window.pinned:
        return window, 0
    if pin is None:
        raise ValueError(f"{upstream.name}: an unpinned window needs a pin callback")
    if isinstance(upstream, DatabaseUpstream):  # asked of the database: no Spark job
        found = pin_in_database(upstream, window, now, sightings)
    else:
        found = pin_end(read_source(spark, upstream, version), upstream, window, now)
    if (
        found.no_cursor
        and isinstance(upstream, DatabaseUpstream)
        and upstream.null_cursor == "fail"
    ):
        # Counted by this read too: rows may have lost their cursor since the look.
        raise UpstreamUnavailableError(
            null_cursor_message(upstream, found.no_cursor).replace(
                "so nothing is planned for it", "so the batch reads nothing"
            ),
            upstream=upstream.name,
            fix=null_cursor_fix(upstream),
        )
    if found.held_back or found.no_cursor:
        log.warning(
            "upstream=%s: %d row(s) held back by the lag (read by a later batch), "
            "%d row(s) with no cursor value (never read)",
            upstream.name,
            found.held_back,
            found.no_cursor,
        )
    return pin(found.end, found.recheck_at), found.no_cursor
