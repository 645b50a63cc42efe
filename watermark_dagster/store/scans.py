"""Reads of the control tables: one handle per table kept up to date, scans that open
only the files a read needs, and counts of what was read.

Reads cost what a tick needs, not what history holds: ``batches``,
``pipeline_checkpoints`` and ``history`` are partitioned by ``bucket`` (see
:mod:`watermark_dagster.store.schema`), each read names the buckets it needs and prunes
files with Delta's per-file statistics before opening any, and one handle per table is
kept and refreshed to the latest version instead of loaded from scratch.
:attr:`TableReads.scans` counts what was read, so tests can prove a tick's reads do not
grow with history.
"""

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from watermark_dagster.store import schema
from watermark_dagster.store.schema import BUCKET


@dataclasses.dataclass
class ScanStats:
    """What the store read since it was created (or since :meth:`reset`).

    ``files`` and ``rows`` count the data files opened and the rows read from them, before
    any filtering in memory; ``loads`` counts tables loaded from scratch and ``refreshes``
    cached handles brought up to date; ``commits`` counts commits this store made.
    """

    files: int = 0
    rows: int = 0
    loads: int = 0
    refreshes: int = 0
    commits: int = 0

    def reset(self) -> None:
        """Start counting from zero."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, 0)

    def snapshot(self) -> dict[str, int]:
        """The counts as a mapping."""
        return dataclasses.asdict(self)


class TableReads:
    """The reads of :class:`~watermark_dagster.store.tables.ControlTables`, which sets
    these attributes when it is created."""

    root: str
    storage_options: dict[str, str] | None
    scans: ScanStats
    _handles: dict[str, DeltaTable]

    def uri(self, table: str) -> str:
        """Location of one control table."""
        return f"{self.root}/{table}"

    def _handle(self, table: str) -> DeltaTable:
        """This store's handle on ``table``, brought up to its latest version (loaded from
        scratch the first time, or when refreshing it fails, e.g. after log cleanup)."""
        dt = self._handles.get(table)
        if dt is not None:
            try:
                dt.update_incremental()
                self.scans.refreshes += 1
                return dt
            except DeltaError:
                pass
        dt = DeltaTable(self.uri(table), storage_options=self.storage_options)
        self.scans.loads += 1
        self._handles[table] = dt
        return dt

    def _scan(
        self,
        dt: DeltaTable,
        predicate: list[tuple[str, str, Any]] | None = None,
        columns: list[str] | None = None,
    ) -> pa.Table:
        """The rows of the data files of ``dt`` that ``predicate`` may match, in the
        control schema (only ``columns`` when given).

        ``predicate`` (delta-rs tuple filters) selects files by partition value and
        per-file statistics inside delta-rs, so the cost is that of the files chosen, not
        of every file in the table; rows are not filtered here (see :meth:`_rows`).
        """
        name = Path(dt.table_uri.rstrip("/")).name
        table_schema = schema.TABLES[name]
        if columns is not None:
            table_schema = pa.schema([table_schema.field(c) for c in columns])
        if dt.version() < 0:  # a table that does not exist yet (read-only stores)
            return table_schema.empty_table()
        dataset = dt.to_pyarrow_dataset(file_pruning_predicate=predicate or None)
        self.scans.files += len(dataset.files)
        if not dataset.files:
            return table_schema.empty_table()
        found = dataset.to_table(columns=columns)
        self.scans.rows += found.num_rows
        missing = [f.name for f in table_schema if f.name not in found.column_names]
        if missing:
            # A table of an older release, read without upgrading it (read-only stores):
            # its missing columns (the bucket too) read as NULL.
            for i, column in enumerate(table_schema.names):
                if column in missing:
                    field = table_schema.field(column).with_nullable(True)
                    table_schema = table_schema.set(i, field)
                    found = found.append_column(field, pa.nulls(found.num_rows, field.type))
        # Files written by delta-rs merges may carry ``string_view`` columns: filters run
        # after this cast to the declared schema.
        return found.select(table_schema.names).cast(table_schema)

    @staticmethod
    def _bucketed(dt: DeltaTable) -> bool:
        """Whether ``dt`` has the ``bucket`` layout (an older release's table has not)."""
        return dt.version() >= 0 and BUCKET in dt.metadata().partition_columns

    def _rows(
        self,
        dt: DeltaTable,
        match: Mapping[str, Any] | None = None,
        *,
        buckets: Iterable[int] | None = None,
        also: Callable[[dict[str, Any]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Rows whose columns equal ``match`` (a list value: any of its values), read
        from ``buckets`` only when given, for which ``also`` (a test statistics cannot
        decide, like a substring match) is true when given.

        ``match`` and ``buckets`` choose the files to open; every row read is then
        filtered exactly.
        """
        match = dict(match or {})
        predicate: list[tuple[str, str, Any]] = []
        if buckets is not None and self._bucketed(dt):
            predicate.append((BUCKET, "in", sorted(set(buckets))))
        for column, value in match.items():
            many = isinstance(value, list | tuple | set | frozenset)
            predicate.append((column, "in", sorted(value)) if many else (column, "=", value))
        table = self._scan(dt, predicate)
        if BUCKET in table.column_names:
            table = table.drop_columns([BUCKET])
        # A bucket's rows are few: exact filtering in Python costs less than planning a
        # filter query over them.
        wanted = {
            c: set(v) if isinstance(v, list | tuple | set | frozenset) else {v}
            for c, v in match.items()
        }
        return [
            row
            for row in table.to_pylist()
            if all(row[c] in values for c, values in wanted.items()) and (also is None or also(row))
        ]

    def _buckets(self, dt: DeltaTable) -> list[int]:
        """The buckets that hold rows in ``dt``, newest first (from the log, no data read)."""
        if not self._bucketed(dt):
            # Nothing yet, or an older release's table read as it is: one read of it all.
            return [0] if dt.version() >= 0 else []
        return sorted({int(p[BUCKET]) for p in dt.partitions()}, reverse=True)

    def _rows_newest_first(
        self,
        dt: DeltaTable,
        match: Mapping[str, Any] | None = None,
        *,
        enough: Callable[[list[dict[str, Any]]], bool],
    ) -> list[dict[str, Any]]:
        """Rows matching ``match``, reading one bucket at a time from the newest until
        ``enough`` says the rows found so far suffice (never the bucket of rows of no
        batch, which sorts below every batch's)."""
        found: list[dict[str, Any]] = []
        for bucket in self._buckets(dt):
            if bucket == schema.NO_BATCH_BUCKET:
                break
            found.extend(self._rows(dt, match, buckets=[bucket]))
            if enough(found):
                break
        return found

    def _next_seq(self, dt: DeltaTable) -> int:
        """The sequence number after the highest in ``batches`` as of ``dt`` (reads the
        newest bucket only)."""
        buckets = self._buckets(dt)
        if not buckets:
            return 1
        newest = [(BUCKET, "=", buckets[0])] if self._bucketed(dt) else None
        seqs = self._scan(dt, newest, ["seq"])["seq"].to_pylist()
        return max(seqs, default=0) + 1


__all__ = ["ScanStats", "TableReads"]
