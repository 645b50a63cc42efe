"""Issue 64's independent attack on landing file logs (real delta-rs tables, no JVM): a
file log deleted rather than restored, empty files sharing a modification time."""

import os
import shutil
from pathlib import Path

import pytest

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.errors import LandingFileChangedError, LandingLogBehindError
from watermark_dagster.observe.landing_log import FileLog
from watermark_dagster.observe.observer import Observer


def _landing(folder: Path) -> LandingUpstream:
    return LandingUpstream(name="drops", path=str(folder), format="csv", settle_seconds=0)


def _write(folder: Path, name: str, text: str, mtime: int) -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def test_a_deleted_file_log_numbers_nothing_under_the_committed_watermark(
    tmp_path: Path,
) -> None:
    """Deleted (not put back), the log is no table at all: the look must still refuse to
    number the folder afresh under what the root committed, every time it looks."""
    folder = tmp_path / "in"
    _write(folder, "b.csv", "3,4\n", 2_000)
    _write(folder, "a.csv", "1,2\n", 1_000)
    upstream = _landing(folder)
    assert Observer().observe(upstream, floor=0).latest_version == 2
    shutil.rmtree(upstream.log_location)
    _write(folder, "c.csv", "5,6\n", 500)  # would take number 1 in a fresh log
    for _ in range(2):
        with pytest.raises(LandingLogBehindError, match="up to 2"):
            Observer().observe(upstream, floor=2)
    state = FileLog(upstream).state(create=False)
    assert state is None or state.latest == 0
    # A look that knows no floor (a Dagster observation) writes nothing either.
    Observer().observe(upstream)
    state = FileLog(upstream).state(create=False)
    assert state is None or state.latest == 0


def test_empty_files_sharing_a_modification_time_both_log(tmp_path: Path) -> None:
    """An empty file holds no row: one with a logged empty file's size and modification
    time (markers written in one tick, on a file system keeping coarse times) is no copy
    to refuse, and the folder does not stall."""
    folder = tmp_path / "in"
    _write(folder, "a.csv", "", 1_000)
    upstream = _landing(folder)
    assert Observer().observe(upstream, floor=0).latest_version == 1
    _write(folder, "b.csv", "", 1_000)
    _write(folder, "c.csv", "1,2\n", 3_000)
    assert Observer().observe(upstream, floor=1).latest_version == 3


def test_a_local_move_done_as_a_copy_with_a_new_mtime_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    _write(folder, "a.csv", "1,2\n3,4\n", 1_000)
    upstream = _landing(folder)
    assert Observer().observe(upstream, floor=0).latest_version == 1
    (folder / "archive").mkdir()
    shutil.copy(folder / "a.csv", folder / "archive" / "a.csv")  # a new modification time
    (folder / "a.csv").unlink()
    with pytest.raises(LandingFileChangedError, match="moved"):
        Observer().observe(upstream, floor=1)
