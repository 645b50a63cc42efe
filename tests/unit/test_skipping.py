"""When a MERGE condition carries intervals of the changed keys rather than one min..max
range (no JVM): the rule of ``write/skipping.intervals_skip_more`` over a target's add actions
as delta-rs reads them from the log. What Delta then skips is proven with Spark in
``tests/spark/test_writes.py``."""

import datetime
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from watermark_dagster.write.skipping import intervals_skip_more
from watermark_dagster.write.summary import intervals


def _files(path: Path, ranges: list[range]) -> pa.Table:
    """A Delta table with one data file per range of ids, and its add actions."""
    for ids in ranges:
        rows = pa.table({"id": pa.array(list(ids), pa.int64()), "name": [f"n{i}" for i in ids]})
        write_deltalake(str(path), rows, mode="append")
    return pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))


def test_intervals_are_used_only_where_they_skip_files_the_range_reads(tmp_path: Path) -> None:
    files = _files(tmp_path / "t", [range(i * 1000, (i + 1) * 1000) for i in range(5)])

    def pays(values: list[int]) -> bool:
        return intervals_skip_more(files, "id", intervals(values, 32), (min(values), max(values)))

    assert pays([5, 6, 4_990])  # the range reads all five files, the intervals two
    assert not pays([100, 101, 102])  # one file either way
    assert not pays(list(range(0, 5_000, 250)))  # every file holds a changed key
    assert not pays([999, 1_000, 1_999, 2_000])  # on the files' edges: both read two


def test_missing_or_other_statistics_keep_the_one_range(tmp_path: Path) -> None:
    files = _files(tmp_path / "t", [range(0, 10), range(100, 110)])
    spans = [(1, 1), (105, 105)]
    assert intervals_skip_more(files, "id", spans, (1, 105)) is False  # both read both files
    assert intervals_skip_more(files, "missing", spans, (1, 105)) is False  # no statistics
    # Values of another type than the statistics (a date against ids): never guessed.
    day = datetime.date(2026, 1, 1)
    assert intervals_skip_more(files, "id", [(day, day)], (day, day)) is False
    dropped = files.drop_columns(["min.id"])
    assert intervals_skip_more(dropped, "id", spans, (1, 105)) is False
