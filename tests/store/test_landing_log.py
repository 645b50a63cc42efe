"""A landing upstream's file log on real delta-rs tables: each file numbered once, numbers
without gaps under concurrent looks, changed files refused, looks that read no row."""

import json
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from deltalake import DeltaTable

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.errors import LandingFileChangedError, UpstreamUnavailableError
from watermark_dagster.observe.landing import check_unchanged
from watermark_dagster.observe.landing_files import list_files
from watermark_dagster.observe.landing_log import FileLog
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import look_before_planning, plan_next
from watermark_dagster.store import WatermarkStore


def _landing(folder: Path, **settings: object) -> LandingUpstream:
    chosen: dict = {"format": "csv", "settle_seconds": 0, **settings}
    return LandingUpstream(name="drops", path=str(folder), **chosen)


def _write(folder: Path, name: str, text: str = "1,2\n", mtime: float | None = None) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_files_are_numbered_once_and_new_means_not_logged(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    _write(folder, "b.csv", mtime=2_000)
    _write(folder, "a.csv", mtime=3_000)
    _write(folder, "_SUCCESS")
    _write(folder, ".hidden.csv")
    _write(folder, "notes.txt")
    _write(folder, "deeper/d.csv", mtime=1_500)  # `*` stops at `/`
    upstream = _landing(folder, pattern="*.csv")
    observer = Observer()
    assert observer.observe(upstream, floor=0).latest_version == 2
    log = observer.file_log(upstream)
    state = log.state()
    assert state is not None
    # Older modification times first; hidden files, markers and other patterns never.
    assert {p: f.ordinal for p, f in state.by_path.items()} == {"b.csv": 1, "a.csv": 2}
    # Looked at again: nothing new is logged, and no row of the log is read.
    read = log.rows_read
    assert observer.observe(upstream, floor=0).latest_version == 2
    assert log.rows_read == read
    # A file copied in with an older mtime than everything logged is new all the same
    # (under a pattern whose `**` takes folders).
    deep = _landing(folder, pattern="**/*.csv")
    _write(folder, "late/c.csv", mtime=1_000)
    assert observer.observe(deep, floor=0).latest_version == 4
    assert [f.path for f in FileLog(deep).files_in(VersionRange(2, 4))] == [
        "a.csv",
        "late/c.csv",
        "deeper/d.csv",
    ]


def test_concurrent_looks_give_each_file_one_number_without_gaps(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    for i in range(40):
        _write(folder, f"f{i:02d}.csv")
    upstream = _landing(folder)
    listed = list_files(upstream)
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def look(part: int) -> None:
        try:
            start.wait()
            # Overlapping halves: every file is offered by two racers.
            FileLog(upstream).register(listed[part * 10 : part * 10 + 20], floor=0)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=look, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    state = FileLog(upstream).state()
    assert state is not None
    assert sorted(f.ordinal for f in state.by_path.values()) == list(range(1, 41))
    assert set(state.by_path) == {f.path for f in listed}


def test_a_changed_file_is_refused_naming_it_and_both_records(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    a = _write(folder, "a.csv", "1,2\n", mtime=5_000)
    upstream = _landing(folder)
    Observer().observe(upstream, floor=0)
    _write(folder, "a.csv", "1,2\n3,4\n", mtime=5_000)
    with pytest.raises(LandingFileChangedError) as raised:
        Observer().observe(upstream, floor=0)
    text = str(raised.value)
    assert "Upstream 'drops': landing file 'a.csv' (file 1) changed" in text
    assert "recorded: size 4, mtime 1970-01-01T01:23:20+00:00; now: size 8" in text
    assert raised.value.upstream == "drops"
    assert raised.value.fix is not None
    assert "new file name" in raised.value.fix
    logged = FileLog(upstream).files_in(VersionRange(1, 1))
    a.unlink()
    with pytest.raises(LandingFileChangedError, match=r"'a.csv' \(file 1\) disappeared"):
        check_unchanged(upstream, logged, loaded=False)


def test_unsettled_files_wait_and_an_empty_folder_is_unavailable(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    upstream = _landing(folder, settle_seconds=60)
    with pytest.raises(UpstreamUnavailableError, match="no file has landed"):
        Observer().observe(upstream, floor=0)
    _write(folder, "fresh.csv")
    _write(folder, "done.csv", mtime=time.time() - 120)
    assert Observer().observe(upstream, floor=0).latest_version == 1
    missing = _landing(tmp_path / "nowhere")
    with pytest.raises(UpstreamUnavailableError, match="does not exist"):
        Observer().observe(missing, floor=0)


def test_ten_thousand_files_are_pinned_by_one_plan_as_a_range(tmp_path: Path) -> None:
    """10,000 files land; one plan pins them all as the range [0, 10000] (its batch row a
    few hundred bytes), the first look of a process reads the log once and later looks
    with nothing new read no row of it."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(10_000):
        (folder / f"part-{i:05d}.json").write_text(f'{{"id": {i}}}\n')
    upstream = _landing(folder, format="json", file_schema="id BIGINT")
    registry = Registry(
        upstreams=[upstream],
        pipelines=[
            Pipeline(
                name="drops_copy",
                upstreams=("drops",),
                target=str(tmp_path / "copy"),
                keys=("id",),
                transform=lambda batch: batch["drops"].changes,
            )
        ],
    )
    store = WatermarkStore(tmp_path / "control")
    observer = Observer()
    look = look_before_planning(registry, observer, store, actor="test")
    batch, created = plan_next(store, look, actor="test")
    assert created
    assert batch is not None
    assert batch.inputs["drops"].range == VersionRange(0, 10_000)
    rows = DeltaTable(str(tmp_path / "control" / "batches")).to_pyarrow_table().to_pylist()
    [row] = [r for r in rows if r["upstream"] == "drops"]
    assert len(json.dumps(row, default=str)) < 1_000
    log = observer.file_log(upstream)
    assert log.rows_read == 0  # a new log: the files were appended, none read back
    fresh = Observer()
    fresh.observe(upstream, floor=0)
    assert fresh.file_log(upstream).rows_read == 10_000  # a new process reads it once
    fresh.observe(upstream, floor=0)
    assert fresh.file_log(upstream).rows_read == 10_000  # then nothing while it is unchanged
    pinned = FileLog(upstream).files_in(VersionRange(0, 10_000))
    assert len(pinned) == 10_000
    assert [f.ordinal for f in pinned] == list(range(1, 10_001))


def test_a_logged_file_under_a_new_path_is_a_move_and_is_refused(tmp_path: Path) -> None:
    """Known by path + size + modification time: a new path with a vanished logged file's
    size and mtime is that file moved; nothing is logged. A copy (the logged file still
    there) is refused the same way; a file moved where the listing never looks is a removal."""
    folder = tmp_path / "in"
    a = _write(folder, "a.csv", "1,2\n", mtime=5_000)
    upstream = _landing(folder)
    assert Observer().observe(upstream, floor=0).latest_version == 1
    (folder / "archive").mkdir()
    a.rename(folder / "archive" / "a.csv")
    _write(folder, "b.csv", "3,4\n")
    with pytest.raises(LandingFileChangedError) as raised:
        Observer().observe(upstream, floor=0)
    text = str(raised.value)
    assert "landing file 'archive/a.csv' has the size (4) and modification time" in text
    assert "of 'a.csv' (file 1), which is gone from its logged path: it was moved" in text
    assert raised.value.fix is not None
    assert "move it back to 'a.csv'" in raised.value.fix
    assert "starting with '_'" in raised.value.fix
    state = FileLog(upstream).state()
    assert state is not None
    assert set(state.by_path) == {"a.csv"}  # b.csv waits with it: nothing logged

    # Archived under a `_` prefix: never listed, so the logged file is simply gone.
    (folder / "_archive").mkdir()
    (folder / "archive" / "a.csv").rename(folder / "_archive" / "a.csv")
    assert Observer().observe(upstream, floor=0).latest_version == 2
    # A copy that keeps the mtime while the logged file is still there (`cp -p`, or a move
    # done as copy then delete, seen halfway) holds rows loaded already: refused too.
    copy = _write(folder, "copy.csv", "3,4\n")
    b_mtime = (folder / "b.csv").stat().st_mtime_ns
    os.utime(copy, ns=(b_mtime, b_mtime))
    with pytest.raises(LandingFileChangedError) as raised:
        Observer().observe(upstream, floor=0)
    assert "of 'b.csv' (file 2), which is still there: it was copied" in str(raised.value)
    assert raised.value.fix is not None
    assert raised.value.fix.startswith("remove the copy")
    # Given its own modification time, it is new content: logged as a new file.
    os.utime(copy, ns=(b_mtime + 1_000, b_mtime + 1_000))
    assert Observer().observe(upstream, floor=0).latest_version == 3


def test_only_a_look_that_knows_the_roots_pins_numbers_files(tmp_path: Path) -> None:
    """A Dagster observation or a health check (no floor) shows new files as they would be
    numbered and logs nothing; the coordinator's look (a floor) logs them."""
    folder = tmp_path / "in"
    _write(folder, "a.csv", mtime=1_000)
    upstream = _landing(folder)
    assert Observer().observe(upstream).latest_version == 1
    assert not (folder / "_watermark_files").exists()
    assert Observer().observe(upstream, floor=0).latest_version == 1
    assert FileLog(upstream).state(create=False) is not None


def test_a_file_log_behind_what_the_root_pinned_numbers_nothing(tmp_path: Path) -> None:
    """A log put back from an older copy holds fewer files than the root committed: a look
    and a registration both refuse it, naming the log and both numbers; nothing is logged."""
    folder = tmp_path / "in"
    _write(folder, "a.csv", mtime=1_000)
    upstream = _landing(folder)
    assert Observer().observe(upstream, floor=0).latest_version == 1
    _write(folder, "z.csv", mtime=2_000)
    log = FileLog(upstream)
    version = DeltaTable(upstream.log_location).version()
    with pytest.raises(UpstreamUnavailableError, match=r"holds files 1\.\.1, but .* up to 3"):
        Observer().observe(upstream, floor=3)
    with pytest.raises(UpstreamUnavailableError, match="_watermark_files"):
        log.register(list_files(upstream), floor=3)
    assert DeltaTable(upstream.log_location).version() == version
    assert Observer().observe(upstream, floor=1).latest_version == 2  # at the floor: numbered


def test_a_file_log_written_before_digests_gains_the_column(tmp_path: Path) -> None:
    """A log an older release wrote has no ``digest`` column: it is read as it is, and the
    next files logged add the column (NULL for the old files)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from watermark_dagster.observe.landing_log import LOG_SCHEMA

    folder = tmp_path / "in"
    _write(folder, "a.csv", mtime=1_000)
    upstream = _landing(folder)
    old = pa.schema([f for f in LOG_SCHEMA if f.name != "digest"])
    row = {"ordinal": 1, "path": "a.csv", "size": 4, "mtime_ns": 1_000 * 10**9}
    write_deltalake(
        upstream.log_location,
        pa.Table.from_pylist([{**row, "logged_at": datetime.now(UTC)}], schema=old),
        name="watermark_files_drops",
    )
    assert Observer().observe(upstream, floor=1).latest_version == 1
    _write(folder, "b.csv", mtime=2_000)
    assert Observer().observe(upstream, floor=1).latest_version == 2
    names = {f.name for f in DeltaTable(upstream.log_location).schema().fields}
    assert "digest" in names
    assert [f.path for f in FileLog(upstream).files_in(VersionRange(1, 2))] == ["a.csv", "b.csv"]


def test_a_file_removed_between_listing_and_digest_is_left_for_the_next_look(
    tmp_path: Path,
) -> None:
    from watermark_dagster.observe.landing_files import with_digests

    folder = tmp_path / "in"
    _write(folder, "a.csv", mtime=1_000)
    _write(folder, "b.csv", "3,4\n", mtime=1_000)
    upstream = _landing(folder)
    listed = list_files(upstream)
    (folder / "a.csv").unlink()
    [kept] = with_digests(upstream, listed)
    assert kept.path == "b.csv"
    assert kept.digest is not None
