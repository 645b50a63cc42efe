"""The control tables opened for reading only, for commands that promise to write nothing.

A :class:`WatermarkStore` creates its control tables on first use, as the sensors need.
A preview (``watermark plan --dry-run``) must not: in a fresh home it would leave four
empty tables behind. :class:`ReadOnlyWatermarkStore` reads the same tables, reads a table
that does not exist yet as empty, and refuses every write.
"""

from typing import Any, NoReturn

from deltalake import DeltaTable

from watermark_dagster.errors import TerminalError
from watermark_dagster.store.store import WatermarkStore


class ReadOnlyStoreError(TerminalError):
    """A write was attempted through a store opened for reading only (a bug in the caller)."""


class _AbsentTable:
    """What reading a control table that does not exist yet gives: version -1, which the
    store reads as no rows."""

    def __init__(self, uri: str) -> None:
        self.table_uri = uri

    def version(self) -> int:
        return -1


class ReadOnlyWatermarkStore(WatermarkStore):
    """The control tables under ``root``, read only: nothing is created or written.

    Example:
        >>> store = ReadOnlyWatermarkStore("/lake/_watermark")
        >>> store.committed()  # {} when the control root does not exist yet
    """

    def ensure_tables(self) -> None:
        """Nothing: a table that does not exist reads as empty."""

    def _handle(self, table: str) -> Any:
        uri = self.uri(table)
        if table not in self._handles and not DeltaTable.is_deltatable(
            uri, storage_options=self.storage_options
        ):
            return _AbsentTable(uri)
        return super()._handle(table)

    def _refuse(self, table: str) -> NoReturn:
        raise ReadOnlyStoreError(
            f"Control table '{table}' under {self.root} was opened read-only; nothing was written.",
            fix="open the store with WatermarkStore(...) to change it.",
        )

    def _cas(self, table: str, decide_and_commit: Any) -> NoReturn:
        self._refuse(table)

    def _append(self, table: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._refuse(table)

    def maintain(self, *, vacuum_retention_hours: int = 168) -> NoReturn:
        """Refused: compaction writes."""
        self._refuse("*")


__all__ = ["ReadOnlyStoreError", "ReadOnlyWatermarkStore"]
