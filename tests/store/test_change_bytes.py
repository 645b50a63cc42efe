"""The bytes a commit changed, as `auto` strategy reads them from the Delta log (no Spark):
a commit with change data counts its change files, not the whole files it rewrote; an
append counts what it added; a compaction counts nothing. Tables written by delta-rs."""

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from watermark_dagster.observe.change_rows import commit_change_bytes
from watermark_dagster.observe.log import DeltaLog


def _sizes(actions: list[dict], kind: str) -> int:
    return sum(a[kind]["size"] for a in actions if kind in a)


def test_a_commit_with_change_data_counts_its_change_files_not_the_rewritten_files(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "t")
    rows = pa.table(
        {"id": pa.array(range(2000), pa.int64()), "v": pa.array([1] * 2000, pa.int64())}
    )
    write_deltalake(path, rows, configuration={"delta.enableChangeDataFeed": "true"})
    table = DeltaTable(path)
    table.update(predicate="id = 5", updates={"v": "2"})  # rewrites the file, one row changed
    write_deltalake(path, rows.slice(0, 10), mode="append")
    write_deltalake(path, rows.slice(0, 10), mode="append")
    DeltaTable(path).optimize.compact()  # dataChange: false
    log = DeltaLog(path)
    update, append, compaction = (log.actions(v) or [] for v in (1, 2, 4))

    assert _sizes(update, "cdc") > 0
    assert commit_change_bytes(update) == _sizes(update, "cdc")
    assert commit_change_bytes(update) < _sizes(update, "add")  # not the rewritten file
    assert commit_change_bytes(append) == _sizes(append, "add") > 0
    assert _sizes(compaction, "add") > 0
    assert commit_change_bytes(compaction) == 0
