"""What a transform gets for one upstream: the pinned changes and the pinned snapshot.

Every read is reproducible from the plan alone (I3): a version range reads the same
commits every time, and a cursor window's end is pinned by the first read and reused.
Before anything is read, the range passes the preflight checks (still the same table, its
commits still there, its schema still compatible: :mod:`watermark_dagster.read.preflight`),
so an unreadable range fails loudly, before any write (I6). Each read mode has its reader:
:mod:`~watermark_dagster.read.cdf`, :mod:`~watermark_dagster.read.appended`,
:mod:`~watermark_dagster.read.snapshot` and :mod:`~watermark_dagster.read.cursor`.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from watermark_dagster.config.upstream import CursorUpstream, Upstream
from watermark_dagster.core.columns import CHANGE_TYPE, PREIMAGE
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import CursorWindow, ReadMode, VersionRange
from watermark_dagster.frames.changes import latest_per_key
from watermark_dagster.observe.change_rows import commit_change_bytes, range_change_rows
from watermark_dagster.observe.log import DeltaLog
from watermark_dagster.read.append_log import AppendScan
from watermark_dagster.read.appended import read_appended
from watermark_dagster.read.cdf import read_changes
from watermark_dagster.read.cursor import (
    PinWindow,
    pin_window,
    position_columns,
    snapshot_rows,
    window_changes,
)
from watermark_dagster.read.database_pin import Sightings
from watermark_dagster.read.frames import as_changes
from watermark_dagster.read.landing import (
    PinnedFiles,
    as_landing,
    file_changes,
    pin_files,
    read_files,
)
from watermark_dagster.read.preflight import preflight
from watermark_dagster.read.snapshot import read_snapshot
from watermark_dagster.read.tables import table_at
from watermark_dagster.read.unreadable import unreadable


def _cursor_upstream(upstream: Upstream) -> CursorUpstream:
    """``upstream`` as the cursor upstream a window belongs to."""
    if not isinstance(upstream, CursorUpstream):
        raise TypeError(f"upstream {upstream.name!r} has a cursor window but is not read by cursor")
    return upstream


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
        source_version: the Delta version a cursor upstream stored as Delta is read at
            (the version its batch was planned at), so every reader of the batch sees
            the same rows, even rows committed later inside the window (I3).
        files_read: data files an APPEND_ONLY read opened (None for other modes).
        table_id: the Delta table id the batch planned the range on (None when unknown).
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
    source_version: int | None = None
    table_id: str | None = None
    _scan: AppendScan | None = field(default=None, repr=False)
    _files: PinnedFiles | None = field(default=None, repr=False)
    # Each read once, on first use: the transform and the rows-read count share them.
    _snapshot: DataFrame | None = field(default=None, init=False, repr=False)
    _changes: DataFrame | None = field(default=None, init=False, repr=False)

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
        source_version: int | None = None,
        sightings: Sightings | None = None,
    ) -> "UpstreamInput":
        """Bind a planned input to Spark after checking it can be read as planned.

        Cursor windows are pinned here (the first read fixes the end); a cursor source
        stored as Delta is read as of ``source_version`` when given, and a database
        table's integer cursor with a lag ends where the looks' ``sightings`` say.

        Raises:
            UpstreamRecreatedError, UpstreamUnreadableError, UpstreamSchemaChangedError,
            UpstreamDataChangedError: the range cannot be read as planned (I6).
        """
        window, scan, rows_without_cursor, files = planned.window, None, 0, None
        files_read: int | None = None
        if planned.is_cursor:
            assert window is not None
            try:
                window, rows_without_cursor = pin_window(
                    spark,
                    _cursor_upstream(upstream),
                    window,
                    pin,
                    now or datetime.now(UTC),
                    source_version,
                    sightings,
                )
            except Exception as e:  # Spark's errors are matched by their text
                at = f"as of version {source_version}" if source_version is not None else ""
                raise unreadable(upstream, f"of window {window} {at}".strip(), e) from e
            mode = ReadMode.SNAPSHOT if full_load else planned.mode
        elif (landing := as_landing(upstream)) is not None:
            assert planned.snapshot_version is not None
            mode = ReadMode.SNAPSHOT if full_load else planned.mode
            files = pin_files(
                landing,
                planned.range,
                planned.snapshot_version,
                table_id=table_id,
                whole=mode is ReadMode.SNAPSHOT,
            )
            files_read = files.read_by(mode)
        else:
            assert planned.snapshot_version is not None
            mode, scan = preflight(upstream, planned, full_load=full_load, table_id=table_id)
            files_read = len(scan.files) if scan is not None else None
        return cls(
            name=upstream.name,
            mode=mode,
            range=planned.range,
            snapshot_version=planned.snapshot_version,
            window=window,
            _spark=spark,
            _upstream=upstream,
            files_read=files_read,
            rows_without_cursor=rows_without_cursor,
            source_version=source_version if planned.is_cursor else None,
            table_id=table_id,
            _scan=scan,
            _files=files,
        )

    @property
    def changes_are_differences(self) -> bool:
        """Whether ``changes`` holds exactly the rows the range removed (deletes and
        pre-images) and added (inserts and post-images): a Delta table's change feed or
        appended files, so that signed they sum to the difference between the snapshots
        before and after the range. A cursor window holds the latest rows, not what they
        replaced; a snapshot read holds everything."""
        plain = self.window is None and self._files is None and self.range is not None
        return plain and self.mode in (ReadMode.CDF, ReadMode.APPEND_ONLY)

    @property
    def location(self) -> str:
        """Where the upstream's data lives (a catalog table's resolved location)."""
        return self._upstream.path

    @property
    def reads_snapshot(self) -> bool:
        """True when this input is read as a whole snapshot (a full load)."""
        return self.mode is ReadMode.SNAPSHOT

    @property
    def snapshot(self) -> DataFrame:
        """The table as of the range's end (the committed version for NOOP); for a cursor
        upstream, every row up to the window's end."""
        if self._snapshot is None:
            self._snapshot = self._read_snapshot()
        return self._snapshot

    def _read_snapshot(self) -> DataFrame:
        if self.window is not None:
            upstream = _cursor_upstream(self._upstream)
            return snapshot_rows(self._spark, upstream, self.window, self.source_version)
        assert self.snapshot_version is not None
        if (landing := as_landing(self._upstream)) is not None:
            assert self._files is not None
            return read_files(self._spark, landing, self._files.snapshot)
        return read_snapshot(self._spark, self._upstream, self.snapshot_version)

    @property
    def changes(self) -> DataFrame:
        """Every change row the batch pins, with ``_change_type``, ``_commit_version`` and
        ``_commit_timestamp``: the change feed (update pre-images included), the appended
        rows, the window's rows, or the whole snapshot as inserts. Empty for NOOP."""
        if self._changes is None:
            self._changes = self._read_changes()
        return self._changes

    def _read_changes(self) -> DataFrame:
        if self.mode is ReadMode.NOOP:
            return as_changes(self.snapshot, None).limit(0)
        landing = as_landing(self._upstream) if self._files is not None else None
        if landing is not None and self._files is not None:  # each row at its file's number
            if self.mode is ReadMode.SNAPSHOT:
                frame = file_changes(self._spark, landing, self.snapshot, self._files.snapshot)
            else:
                rows = read_files(self._spark, landing, self._files.changes)
                frame = file_changes(self._spark, landing, rows, self._files.changes)
        elif self.mode is ReadMode.SNAPSHOT:
            frame = as_changes(self.snapshot, self.snapshot_version)
        elif self.mode is ReadMode.TIMESTAMP:
            assert self.window is not None
            upstream = _cursor_upstream(self._upstream)
            frame = window_changes(self._spark, upstream, self.window, self.source_version)
        elif self.mode is ReadMode.APPEND_ONLY:
            assert self.range is not None
            assert self._scan is not None
            frame = read_appended(self._spark, self._upstream, self.range, self._scan)
        else:
            assert self.range is not None
            frame = read_changes(self._spark, self._upstream, self.range)
        # Read once: the transform and the rows-read count both use it.
        return frame.persist(StorageLevel.MEMORY_AND_DISK)

    def count_rows(self) -> int:
        """Rows in ``changes``, counted by Spark.

        Raises:
            UpstreamUnreadableError: the change files, data files or log versions the range
                needs are gone, or the change data feed was off for part of it.
        """
        if self.mode is ReadMode.NOOP:
            return 0
        try:
            return self.changes.count()
        except Exception as e:  # Spark's errors are matched by their text
            raise unreadable(self._upstream, self.describe(), e) from e

    def rows_read(self) -> int:
        """What the batch reports it read: a snapshot's rows from its files' statistics
        (:meth:`snapshot_rows`) and a change data feed range's from its commits' log entries
        (:func:`~watermark_dagster.observe.change_rows.range_change_rows`), with no Spark
        job; else :meth:`count_rows` (after the write: the cached rows the transform read).

        Raises:
            UpstreamUnreadableError: as :meth:`count_rows`.
        """
        if self.mode is ReadMode.SNAPSHOT and self.window is None and self._files is None:
            return self.snapshot_rows()  # from the log's file statistics where they say
        if self.mode is ReadMode.CDF and self.range is not None and self._files is None:
            log = DeltaLog(self._upstream.path, self._upstream.storage_options)
            rows = range_change_rows(
                log.actions(v) for v in range(self.range.start, self.range.end + 1)
            )
            if rows is not None:
                return rows
        return self.count_rows()

    def snapshot_rows(self) -> int:
        """Rows of the pinned snapshot: what a batch that reads the snapshot whole reads.

        From the Delta log's file statistics (no Spark job) when every file has a row
        count and the table cannot have deletion vectors (whose removed rows the log's
        file list does not show); else counted by Spark (Delta answers a plain count from
        the log too). 0 for NOOP.

        Raises:
            UpstreamUnreadableError: the snapshot cannot be read.
        """
        if self.mode is ReadMode.NOOP:
            return 0
        if self.window is None and self.snapshot_version is not None and self._files is None:
            table = table_at(self._upstream, self.snapshot_version)
            features = table.protocol().reader_features or []
            files = pa.table(table.get_add_actions())
            counts = files.column("num_records").to_pylist() if files.num_rows else []
            if "deletionVectors" not in features and all(c is not None for c in counts):
                return sum(int(c) for c in counts)
        try:
            return self.snapshot.count()
        except Exception as e:  # Spark's errors are matched by their text
            raise unreadable(self._upstream, self.describe(), e) from e

    def bytes_estimate(self) -> tuple[int, int] | None:
        """``(bytes the pinned range changed, bytes of the pinned snapshot)`` from the Delta
        log alone, before any Spark job (:func:`commit_change_bytes` per commit, and the
        sizes of the snapshot's files). None for a cursor upstream, whose source has no
        such log."""
        if self.window is not None or self.snapshot_version is None:
            return None
        if self._files is not None:
            return self._files.change_bytes, self._files.snapshot_bytes
        files = pa.table(table_at(self._upstream, self.snapshot_version).get_add_actions())
        snapshot = sum(int(size or 0) for size in files.column("size_bytes").to_pylist())
        if self.mode is ReadMode.NOOP:
            return 0, snapshot
        if self.mode is ReadMode.SNAPSHOT or self.range is None:
            return snapshot, snapshot
        log = DeltaLog(self._upstream.path, self._upstream.storage_options)
        changed = sum(
            commit_change_bytes(log.actions(v) or [])
            for v in range(self.range.start, self.range.end + 1)
        )
        return changed, snapshot

    def release(self) -> None:
        """Drop the cached change rows (called when the pipeline's batch is done)."""
        if self._changes is not None:
            self._changes.unpersist()
            self._changes = None

    def describe(self) -> str:
        """``CDF [3, 5]``, ``SNAPSHOT @5``, ``TIMESTAMP (a .. b] as of version 4`` (a Delta
        cursor source), ``NOOP``."""
        if self.mode is ReadMode.NOOP:
            return "NOOP"
        if self.window is not None:
            at = f" as of version {self.source_version}" if self.source_version is not None else ""
            return f"{self.mode.value} {self.window}{at}"
        if self.mode is ReadMode.SNAPSHOT:
            return f"SNAPSHOT @{self.snapshot_version}"
        return f"{self.mode.value} {self.range}"

    def net_changes(self, keys: Sequence[str]) -> DataFrame:
        """The latest change per key: ``insert``, ``update_postimage`` or ``delete`` rows,
        one per key, pre-images dropped.

        The latest is the change of the highest commit version; inside one commit the row
        describing the state after it wins over a delete of the same key (a RESTORE or a
        rewrite without change files removes and re-adds a key in one commit); for a cursor
        upstream, the row with the greatest cursor (see :mod:`watermark_dagster.frames.changes`);
        for a landing upstream, the row of the highest numbered file (its ``_commit_version``),
        in every batch, retry, replay and reload (I3).
        """
        then: list[Column] = []
        if self.window is not None:
            then = [
                c.desc_nulls_last()
                for c in position_columns(self.changes, _cursor_upstream(self._upstream))
            ]
        changes = self.changes.where(F.col(CHANGE_TYPE) != PREIMAGE)
        return latest_per_key(changes, keys, *then)

    def changed_keys(self, columns: Sequence[str]) -> DataFrame:
        """Distinct values of ``columns`` over every change row (pre-images included), e.g.
        the customer ids whose rows moved, before and after the change.

        NULL is a value like any other: a row that moved into or out of a NULL group (a
        customer without a region) touches that group. Select rows with them through
        :func:`~watermark_dagster.read.changes.matching_keys`, which matches NULL to NULL.
        """
        return self.changes.select(*[F.col(f"`{c}`") for c in columns]).distinct()
