"""The control tables as Delta tables: compare-and-swap commits, Arrow reads and writes,
creation and migration, upkeep. No record or rule of the control plane lives here.

Every state change is a compare-and-swap on one table: the change is decided against the
table as of version ``v`` and committed as version ``v + 1`` with delta-rs' own commit
retries turned off, so a concurrent writer that got there first makes the commit fail;
:meth:`ControlTables._cas` then reloads, decides again and retries.
"""

import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake import Field as DeltaField
from deltalake.exceptions import CommitFailedError, DeltaError

from watermark_dagster.errors import CommitConflictError
from watermark_dagster.store import schema

T = TypeVar("T")

# A commit decided against version v must land as v + 1, or not at all.
_CAS = CommitProperties(max_commit_retries=0)


def arrow_table(table: str, rows: list[dict[str, Any]], columns: Sequence[str] = ()) -> pa.Table:
    """``rows`` in the schema of control table ``table`` (only ``columns`` when given)."""
    table_schema = schema.TABLES[table]
    if columns:
        table_schema = pa.schema([f for f in table_schema if f.name in set(columns)])
    return pa.Table.from_pylist(rows, schema=table_schema)


def _on(keys: Sequence[str]) -> str:
    # Column names are the fixed control schema's, never user input.
    return " AND ".join(f"t.{k} = s.{k}" for k in keys)


class ControlTables:
    """The four control tables under one root folder (a local path or an object-store URI).

    Args:
        root: folder that holds the tables; created on first use.
        storage_options: delta-rs storage options for object stores.
        max_commit_attempts: how many times a conflicting commit is decided again.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        storage_options: Mapping[str, str] | None = None,
        max_commit_attempts: int = 60,
    ) -> None:
        root_str = str(root)
        if "://" not in root_str:
            root_str = str(Path(root_str).expanduser().resolve())
        self.root = root_str.rstrip("/")
        self.storage_options = dict(storage_options) if storage_options else None
        self.max_commit_attempts = max_commit_attempts
        self._ensured = False

    def uri(self, table: str) -> str:
        """Location of one control table."""
        return f"{self.root}/{table}"

    # ---------------------------------------------------------------- creation, migration

    def ensure_tables(self) -> None:
        """Create the control tables that do not exist yet (safe to call concurrently)."""
        if self._ensured:
            return
        for name, table_schema in schema.TABLES.items():
            uri = self.uri(name)
            if DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                self._add_missing_columns(uri, table_schema)
                continue
            try:
                DeltaTable.create(
                    uri,
                    table_schema,
                    mode="ignore",
                    name=f"watermark_{name}",
                    storage_options=self.storage_options,
                )
            except DeltaError:
                # Another process created it between our check and our create.
                if not DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                    raise
        self._ensured = True

    def _add_missing_columns(self, uri: str, table_schema: pa.Schema) -> None:
        """Bring a control table written by an older release up to the current schema
        (new columns are nullable, so old rows read as NULL)."""
        dt = DeltaTable(uri, storage_options=self.storage_options)
        have = {f.name for f in dt.schema().fields}
        missing = [f for f in table_schema if f.name not in have]
        if not missing:
            return
        try:
            dt.alter.add_columns([DeltaField.from_arrow(f) for f in missing])
        except DeltaError:
            # A concurrent process added them first.
            dt = DeltaTable(uri, storage_options=self.storage_options)
            if any(f.name not in {g.name for g in dt.schema().fields} for f in missing):
                raise

    # ---------------------------------------------------------------- reads

    def _load(self, table: str) -> DeltaTable:
        self.ensure_tables()
        return DeltaTable(self.uri(table), storage_options=self.storage_options)

    def table_version(self, table: str) -> int:
        """Current Delta version of one control table (used to prove nothing was written)."""
        return self._load(table).version()

    @staticmethod
    def _arrow(dt: DeltaTable, columns: list[str] | None = None) -> pa.Table:
        """The table as of ``dt``'s version, in the control schema.

        Files written by delta-rs merges may carry ``string_view`` columns; casting to the
        declared schema keeps filters and comparisons uniform.
        """
        name = Path(dt.table_uri.rstrip("/")).name
        table_schema = schema.TABLES[name]
        if columns is not None:
            table_schema = pa.schema([table_schema.field(c) for c in columns])
        return dt.to_pyarrow_dataset().to_table(columns=columns).cast(table_schema)

    @classmethod
    def _rows(cls, dt: DeltaTable, filter_: pc.Expression | None = None) -> list[dict[str, Any]]:
        table = cls._arrow(dt)
        if filter_ is not None:
            table = table.filter(filter_)
        return table.to_pylist()

    @classmethod
    def _next_seq(cls, dt: DeltaTable) -> int:
        """The sequence number after the highest in ``batches`` as of ``dt``."""
        return max(cls._arrow(dt, ["seq"])["seq"].to_pylist(), default=0) + 1

    # ---------------------------------------------------------------- writes

    def _cas(self, table: str, decide_and_commit: Callable[[DeltaTable], T]) -> T:
        """Run ``decide_and_commit`` against the latest version until its commit lands.

        ``decide_and_commit`` commits with :meth:`_insert`, :meth:`_merge` or
        :meth:`_clear`, which all refuse to land anywhere but right after ``dt``.
        """
        for attempt in range(self.max_commit_attempts):
            dt = self._load(table)
            try:
                return decide_and_commit(dt)
            except CommitFailedError:
                time.sleep(random.uniform(0.005, 0.05) * min(attempt + 1, 8))
        raise CommitConflictError(
            f"Control table '{table}' under {self.root}: {self.max_commit_attempts} commits in a "
            "row lost to concurrent writers.",
            fix="check for a runaway process writing the control tables, then retry.",
        )

    def _append(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Blind append (history): never conflicts, delta-rs retries it itself."""
        if not rows:
            return
        data = arrow_table(table, rows)
        write_deltalake(self.uri(table), data, mode="append", storage_options=self.storage_options)

    def append_rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` (built by :mod:`watermark_dagster.store.codec`) to control table
        ``table`` in one commit, without any compare-and-swap: for bulk imports into a root
        no process is writing (migrations, benchmarks that synthesize history)."""
        self.ensure_tables()
        self._append(table, rows)

    @staticmethod
    def _insert(dt: DeltaTable, table: str, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` as the version right after ``dt`` (inside :meth:`_cas`)."""
        write_deltalake(dt, arrow_table(table, rows), mode="append", commit_properties=_CAS)

    @staticmethod
    def _merge(
        dt: DeltaTable,
        table: str,
        rows: list[dict[str, Any]],
        *,
        on: Sequence[str],
        columns: Sequence[str] | None = None,
        insert: bool = False,
    ) -> None:
        """Update the rows matching ``rows`` on the ``on`` columns (only ``columns``, else
        every other column ``rows`` has), and insert the others when ``insert`` (``rows``
        then have every column); inside :meth:`_cas`."""
        source = arrow_table(table, rows, list(rows[0]))
        updated = [c for c in rows[0] if c not in on] if columns is None else list(columns)
        merger = dt.merge(
            source,
            predicate=_on(on),
            source_alias="s",
            target_alias="t",
            commit_properties=_CAS,
        ).when_matched_update({c: f"s.{c}" for c in updated})
        if insert:
            merger = merger.when_not_matched_insert_all()
        merger.execute()

    @staticmethod
    def _clear(dt: DeltaTable, table: str, key: Mapping[str, Any], column: str) -> None:
        """Set string ``column`` to NULL in the rows equal to ``key`` (which may include
        ``column``: cleared only while it still holds that value); inside :meth:`_cas`."""
        source = arrow_table(table, [dict(key)], list(key))
        (
            dt.merge(
                source,
                predicate=_on(list(key)),
                source_alias="s",
                target_alias="t",
                commit_properties=_CAS,
            )
            .when_matched_update({column: "CAST(NULL AS STRING)"})
            .execute()
        )

    # ---------------------------------------------------------------- upkeep

    def maintain(self, *, vacuum_retention_hours: int = 168) -> dict[str, int]:
        """Compact each control table's small files, checkpoint its log and vacuum files
        older than the retention (7 days by default, Delta's own minimum).

        Every state change adds a small file; without this, reads slow down as history
        grows. Safe while other writers run: their compare-and-swap retries absorb it.

        Returns:
            table -> files removed by compaction.
        """
        removed: dict[str, int] = {}
        for name in schema.TABLES:
            dt = self._load(name)
            metrics = dt.optimize.compact()
            removed[name] = int(metrics.get("numFilesRemoved", 0))
            dt = self._load(name)
            dt.create_checkpoint()
            dt.vacuum(retention_hours=vacuum_retention_hours, dry_run=False)
        return removed


__all__ = ["ControlTables", "arrow_table"]
