"""The control tables as Delta tables: compare-and-swap commits, Arrow writes, creation
and migration, upkeep. No record or rule of the control plane lives here.

Every state change is a compare-and-swap on one table: the change is decided against the
table as of version ``v`` and committed as version ``v + 1`` with delta-rs' own commit
retries turned off, so a concurrent writer that got there first makes the commit fail;
:meth:`ControlTables._cas` then reloads, decides again and retries.

Reads (:mod:`watermark_dagster.store.scans`) cost what a tick needs, not what history
holds. After each commit the bucket it touched is compacted once it holds more than
:data:`COMPACT_AT` files, so file counts stay bounded continuously; Delta checkpoints
every :data:`CHECKPOINT_EVERY` commits and expired log entries are cleaned up with them.
"""

import contextlib
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake import Field as DeltaField
from deltalake.exceptions import CommitFailedError, DeltaError

from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.errors import CommitConflictError
from watermark_dagster.store import schema
from watermark_dagster.store.conditional import require_conditional_writes
from watermark_dagster.store.scans import ScanStats, TableReads
from watermark_dagster.store.schema import BUCKET

T = TypeVar("T")

# A commit decided against version v must land as v + 1, or not at all.
_CAS = CommitProperties(max_commit_retries=0)

# A bucket is compacted into one file once a commit leaves it with more files than this.
COMPACT_AT = 12

# Delta table properties of the control tables: a checkpoint every 20 commits (a load
# replays at most 20 commit files), and log entries older than an hour removed when a
# checkpoint is written, so the log folder a load or refresh lists stays small (listing
# it is most of their cost). Nothing reads the control tables' older versions: a
# compare-and-swap decides and commits within milliseconds, a handle that fell behind the
# cleanup is loaded again, and ``history`` is the audit trail.
CHECKPOINT_EVERY = 20
PROPERTIES = {
    "delta.checkpointInterval": str(CHECKPOINT_EVERY),
    "delta.logRetentionDuration": "interval 1 hours",
    "delta.enableExpiredLogCleanup": "true",
}

# The names of the control tables (their schemas: :data:`schema.TABLES`).
BATCHES = "batches"
WATERMARKS = "committed_watermarks"
CHECKPOINTS = "pipeline_checkpoints"
HISTORY = "history"


def where(**values: Any) -> dict[str, Any]:
    """Rows whose columns equal ``values`` (None values are left out)."""
    return {column: value for column, value in values.items() if value is not None}


def arrow_table(table: str, rows: list[dict[str, Any]], columns: Sequence[str] = ()) -> pa.Table:
    """``rows`` in the schema of control table ``table`` (only ``columns`` when given).

    Rows of a bucketed table get their ``bucket`` from their ``batch_id`` unless they
    carry one, so no caller computes it.
    """
    table_schema = schema.TABLES[table]
    if table in schema.BUCKETED and (not columns or BUCKET in columns):
        rows = [
            r if BUCKET in r else {**r, BUCKET: schema.bucket_of(r.get("batch_id"))} for r in rows
        ]
    if columns:
        table_schema = pa.schema([f for f in table_schema if f.name in set(columns)])
    return pa.Table.from_pylist(rows, schema=table_schema)


def _buckets_of(table: str, rows: Iterable[Mapping[str, Any]]) -> frozenset[int]:
    """The buckets ``rows`` of ``table`` live in (none for an unbucketed table)."""
    if table not in schema.BUCKETED:
        return frozenset()
    return frozenset(
        r[BUCKET] if BUCKET in r else schema.bucket_of(r.get("batch_id")) for r in rows
    )


def _on(keys: Sequence[str], buckets: frozenset[int] = frozenset()) -> str:
    """A merge predicate matching ``keys``, limited to ``buckets`` so the merge opens only
    their files. Column names are the fixed control schema's and buckets are integers:
    never user input."""
    terms = [f"t.{k} = s.{k}" for k in keys]
    if buckets:
        terms.insert(0, f"t.{BUCKET} IN ({', '.join(str(int(b)) for b in sorted(buckets))})")
    return " AND ".join(terms)


class ControlTables(TableReads):
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
        self.storage_options = resolved_options(storage_options, "The control root")
        self.max_commit_attempts = max_commit_attempts
        self.scans = ScanStats()
        # table -> rows rewritten into the bucketed layout by this process (see ensure_tables)
        self.migrated: dict[str, int] = {}
        self._ensured = False
        self._handles: dict[str, DeltaTable] = {}
        self._touched: dict[str, set[int]] = {}
        self._root_id: str | None = None

    # ---------------------------------------------------------------- creation, migration

    def ensure_tables(self) -> None:
        """Create the control tables that do not exist yet, and bring tables written by an
        older release up to the current layout (safe to call concurrently; once per store).

        A table written before the ``bucket`` partitioning is rewritten in place in one
        compare-and-swap commit (every row kept, its bucket derived from its batch id):
        :attr:`migrated` tells how many rows each rewritten table held.
        """
        if self._ensured:
            return
        # On S3, a commit is atomic only if the server honours conditional writes: checked
        # before the first write (once per process), refused with the fix otherwise.
        require_conditional_writes(self.root, self.storage_options)
        for name, table_schema in schema.TABLES.items():
            uri = self.uri(name)
            if DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                self._upgrade(name, table_schema)
                continue
            try:
                DeltaTable.create(
                    uri,
                    table_schema,
                    mode="ignore",
                    partition_by=[BUCKET] if name in schema.BUCKETED else None,
                    name=f"watermark_{name}",
                    configuration=PROPERTIES,
                    storage_options=self.storage_options,
                )
            except DeltaError:
                # Another process created it between our check and our create.
                if not DeltaTable.is_deltatable(uri, storage_options=self.storage_options):
                    raise
        self._ensured = True

    def _upgrade(self, name: str, table_schema: pa.Schema) -> None:
        """Bring one existing control table to the current layout and properties."""
        dt = self._handle(name)
        if name in schema.BUCKETED and BUCKET not in dt.metadata().partition_columns:
            self.migrated[name] = self._cas(
                name, lambda dt: self._repartition(dt, name), ensure=False
            )
            dt = self._handle(name)
        self._add_missing_columns(dt, table_schema)
        config = dt.metadata().configuration
        if any(config.get(k) != v for k, v in PROPERTIES.items()):
            # A concurrent process may set them first: the same values.
            with contextlib.suppress(DeltaError):
                dt.alter.set_table_properties(PROPERTIES, raise_if_not_exists=False)

    def _repartition(self, dt: DeltaTable, name: str) -> int:
        """Rewrite table ``name`` (as of ``dt``) partitioned by ``bucket``, every row kept,
        as the version right after ``dt`` (inside :meth:`_cas`). Returns the rows
        rewritten, 0 when a concurrent process already did it."""
        if BUCKET in dt.metadata().partition_columns:
            return 0
        rows = dt.to_pyarrow_dataset().to_table().to_pylist()
        self.scans.rows += len(rows)
        write_deltalake(
            dt,
            arrow_table(name, rows),
            mode="overwrite",
            schema_mode="overwrite",
            partition_by=[BUCKET],
            commit_properties=_CAS,
        )
        self.scans.commits += 1
        return len(rows)

    def _add_missing_columns(self, dt: DeltaTable, table_schema: pa.Schema) -> None:
        """Bring a control table written by an older release up to the current schema
        (new columns are nullable, so old rows read as NULL)."""
        have = {f.name for f in dt.schema().fields}
        missing = [f for f in table_schema if f.name not in have]
        if not missing:
            return
        try:
            dt.alter.add_columns([DeltaField.from_arrow(f) for f in missing])
        except DeltaError:
            # A concurrent process added them first.
            dt = DeltaTable(dt.table_uri, storage_options=self.storage_options)
            if any(f.name not in {g.name for g in dt.schema().fields} for f in missing):
                raise

    # ---------------------------------------------------------------- reads

    def _load(self, table: str) -> DeltaTable:
        self.ensure_tables()
        return self._handle(table)

    def root_id(self) -> str:
        """The identity of this control root: the Delta table id of its ``batches`` table,
        fixed when the root is created. A copy or a move of the root keeps it; a new root
        (a reset or deleted root) has another. Targets record it in their Delta transaction
        and commit labels (:mod:`watermark_dagster.write.fences`)."""
        if self._root_id is None:
            self._root_id = str(self._load(BATCHES).metadata().id)
        return self._root_id

    def table_version(self, table: str) -> int:
        """Current Delta version of one control table (used to prove nothing was written)."""
        return self._load(table).version()

    # ---------------------------------------------------------------- writes

    def _cas(
        self, table: str, decide_and_commit: Callable[[DeltaTable], T], *, ensure: bool = True
    ) -> T:
        """Run ``decide_and_commit`` against the latest version until its commit lands.

        ``decide_and_commit`` commits with :meth:`_insert`, :meth:`_merge` or
        :meth:`_clear`, which all refuse to land anywhere but right after ``dt``. The
        buckets the commit touched are tidied afterwards (:meth:`_tidy`). ``ensure`` False
        is for the upgrade inside :meth:`ensure_tables` itself.
        """
        if ensure:
            self.ensure_tables()
        for attempt in range(self.max_commit_attempts):
            dt = self._handle(table)
            self._touched.pop(table, None)
            try:
                result = decide_and_commit(dt)
            except CommitFailedError:
                time.sleep(random.uniform(0.005, 0.05) * min(attempt + 1, 8))
                continue
            self._tidy(table)
            return result
        raise CommitConflictError(
            f"Control table '{table}' under {self.root}: {self.max_commit_attempts} commits in a "
            "row lost to concurrent writers.",
            fix="check for a runaway process writing the control tables, then retry.",
        )

    def _committed(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Note a commit to ``table`` touching the buckets of ``rows``."""
        self.scans.commits += 1
        self._touched.setdefault(table, set()).update(_buckets_of(table, rows))

    def _append(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Blind append (history): never conflicts, delta-rs retries it itself."""
        if not rows:
            return
        data = arrow_table(table, rows)
        write_deltalake(
            self.uri(table),
            data,
            mode="append",
            partition_by=[BUCKET] if table in schema.BUCKETED else None,
            storage_options=self.storage_options,
        )
        self._committed(table, rows)
        self._tidy(table)

    def append_rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` (built by :mod:`watermark_dagster.store.codec`) to control table
        ``table`` in one commit, without any compare-and-swap: for bulk imports into a root
        no process is writing (migrations, benchmarks that synthesize history)."""
        self.ensure_tables()
        self._append(table, rows)

    def _insert(self, dt: DeltaTable, table: str, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` as the version right after ``dt`` (inside :meth:`_cas`)."""
        write_deltalake(
            dt,
            arrow_table(table, rows),
            mode="append",
            partition_by=[BUCKET] if table in schema.BUCKETED else None,
            commit_properties=_CAS,
        )
        self._committed(table, rows)

    def _merge(
        self,
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
        then have every column); inside :meth:`_cas`. Opens only the buckets of ``rows``."""
        source = arrow_table(table, rows, list(rows[0]))
        updated = [c for c in rows[0] if c not in on] if columns is None else list(columns)
        merger = dt.merge(
            source,
            predicate=_on(on, _buckets_of(table, rows)),
            source_alias="s",
            target_alias="t",
            commit_properties=_CAS,
        ).when_matched_update({c: f"s.{c}" for c in updated})
        if insert:
            merger = merger.when_not_matched_insert_all()
        merger.execute()
        self._committed(table, rows)

    def _clear(self, dt: DeltaTable, table: str, key: Mapping[str, Any], column: str) -> None:
        """Set string ``column`` to NULL in the rows equal to ``key`` (which may include
        ``column``: cleared only while it still holds that value); inside :meth:`_cas`."""
        source = arrow_table(table, [dict(key)], list(key))
        (
            dt.merge(
                source,
                predicate=_on(list(key), _buckets_of(table, [key])),
                source_alias="s",
                target_alias="t",
                commit_properties=_CAS,
            )
            .when_matched_update({column: "CAST(NULL AS STRING)"})
            .execute()
        )
        self._committed(table, [key])

    # ---------------------------------------------------------------- upkeep

    def _tidy(self, table: str) -> None:
        """Compact each bucket (or the whole unbucketed table) the last commit to ``table``
        touched once it holds more than :data:`COMPACT_AT` files. A compaction that loses
        to a concurrent writer is skipped: the next commit tries again."""
        touched = self._touched.pop(table, set())
        if table not in schema.BUCKETED:
            touched = {schema.NO_BATCH_BUCKET}
        dt = self._handle(table)
        for bucket in sorted(touched):
            if table in schema.BUCKETED:
                where = [(BUCKET, "=", str(bucket))]
                files = len(dt.file_uris(file_pruning_predicate=where))
            else:
                files, where = len(dt.file_uris()), None
            if files <= COMPACT_AT:
                continue
            try:
                dt.optimize.compact(partition_filters=where)
                self.scans.commits += 1
            except DeltaError:
                pass

    def maintain(self, *, vacuum_retention_hours: int = 168) -> dict[str, int]:
        """Compact each control table's small files, checkpoint its log and vacuum files
        older than the retention (7 days by default, Delta's own minimum).

        Commits keep each bucket compacted as they go (:meth:`_tidy`), so this is only
        needed to delete the files compaction replaced; safe while other writers run.

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
            dt.cleanup_metadata()
            dt.vacuum(retention_hours=vacuum_retention_hours, dry_run=False)
        return removed


__all__ = [
    "BATCHES",
    "CHECKPOINTS",
    "HISTORY",
    "WATERMARKS",
    "ControlTables",
    "arrow_table",
    "where",
]
