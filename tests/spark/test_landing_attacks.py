"""Issue 64's independent attack on landing identity, end to end through ``watermark run``
with real Spark, Delta and Dagster: ways a file could be loaded twice, or never, or read
as another file, each a test."""

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.support.landing import landing_spec, write_csv
from tests.support.spark_lake import Lake, open_lake
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.observe.landing_log import FileLog

pytestmark = pytest.mark.spark


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


def _with_log(lake: Lake, folder: Path, **settings: object) -> dict:
    spec = landing_spec(lake, folder, **settings)
    spec["pipelines"].append(
        {
            "name": "drops_log",
            "upstreams": ["drops"],
            "target": lake.path("log"),
            "transform": "appended",
            "write": "append",
            "keys": [],
        }
    )
    return spec


def _run(lake: Lake, spec: dict) -> dict:
    out = lake.cli(spec, "run", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def _logged(folder: Path) -> dict[str, int]:
    upstream = LandingUpstream(name="drops", path=str(folder), format="csv")
    state = FileLog(upstream).state(create=False)
    assert state is not None
    return {p: f.ordinal for p, f in state.by_path.items()}


def _log_rows(lake: Lake) -> list[tuple[int, int]]:
    return sorted((r["id"], r["value"]) for r in lake.table("log").collect())


def test_names_with_spaces_percent_unicode_and_colons_read_their_own_file(lake: Lake) -> None:
    folder = lake.root / "landing"
    names = ["a b.csv", "a%20b.csv", "ü ñ.csv", "x%2Fy.csv", "c#d.csv", "e;f=g.csv", "h+i.csv"]
    for i, name in enumerate(names, start=1):
        write_csv(folder, name, [(i, i * 10)])
    spec = _with_log(lake, folder)
    _run(lake, spec)
    assert set(_logged(folder)) == set(names)
    assert _log_rows(lake) == [(i, i * 10) for i in range(1, len(names) + 1)]


def test_a_copy_kept_beside_its_original_then_the_original_removed_is_not_loaded_twice(
    lake: Lake,
) -> None:
    """An archive that copies (``cp -p``, a move across file systems, an object store's
    copy then delete) has a moment where both paths exist; a look in that moment must not
    log the copy as a new file."""
    folder = lake.root / "landing"
    a = write_csv(folder, "a.csv", [(1, 10), (2, 20)])
    spec = _with_log(lake, folder, pattern="**")
    _run(lake, spec)
    (folder / "archive").mkdir()
    shutil.copy2(a, folder / "archive" / "a.csv")  # same size and modification time
    lake.cli(spec, "run", "--json")  # a look while both exist
    a.unlink()
    lake.cli(spec, "run", "--json")
    assert _log_rows(lake) == [(1, 10), (2, 20)]


def test_names_with_a_backslash_or_a_newline_read_their_own_file(lake: Lake) -> None:
    folder = lake.root / "landing"
    names = ["a\\b.csv", "a\\*.csv", "c\nd.csv", "e'f\".csv"]
    for i, name in enumerate(names, start=1):
        write_csv(folder, name, [(i, i * 10)])
    spec = _with_log(lake, folder)
    _run(lake, spec)
    assert set(_logged(folder)) == set(names)
    assert _log_rows(lake) == [(i, i * 10) for i in range(1, len(names) + 1)]


def test_files_under_a_symlinked_folder_are_loaded_once(lake: Lake) -> None:
    """A landing folder whose subfolder (another disk's mount, say) or file is a symbolic
    link: Spark reads through links, so the listing must too, or their rows are never
    loaded, silently. A link to what the folder holds (``latest -> 2026-12-02``, a loop)
    names files listed under their own paths already, and is skipped."""
    folder = lake.root / "landing"
    elsewhere = lake.root / "elsewhere"
    write_csv(folder, "a.csv", [(1, 10)])
    write_csv(elsewhere / "disk", "x.csv", [(2, 20)])
    write_csv(elsewhere, "z.csv", [(3, 30)])
    (folder / "linked").symlink_to(elsewhere / "disk", target_is_directory=True)
    (folder / "z.csv").symlink_to(elsewhere / "z.csv")
    (elsewhere / "disk" / "loop").symlink_to(folder, target_is_directory=True)
    # Links to what the folder holds already: the same rows under a second path.
    write_csv(folder, "2026-12-02/b.csv", [(4, 40)])
    (folder / "latest").symlink_to(folder / "2026-12-02", target_is_directory=True)
    (folder / "latest.csv").symlink_to(folder / "a.csv")
    (folder / "dangling.csv").symlink_to(lake.root / "nothing.csv")
    spec = _with_log(lake, folder)
    _run(lake, spec)
    assert set(_logged(folder)) == {"a.csv", "2026-12-02/b.csv", "linked/x.csv", "z.csv"}
    assert _log_rows(lake) == [(1, 10), (2, 20), (3, 30), (4, 40)]
    assert lake.rows("copy") == {1: 10, 2: 20, 3: 30, 4: 40}


def test_a_file_log_restored_from_an_older_copy_loses_and_repeats_nothing(lake: Lake) -> None:
    folder = lake.root / "landing"
    log = folder / "_watermark_files"
    write_csv(folder, "a.csv", [(1, 10)], mtime=1_000)
    spec = _with_log(lake, folder)
    _run(lake, spec)
    copy = lake.root / "log_copy"
    shutil.copytree(log, copy)  # the log as of file 1
    write_csv(folder, "x.csv", [(2, 20)], mtime=3_000)
    _run(lake, spec)  # x.csv is file 2
    write_csv(folder, "y.csv", [(3, 30)], mtime=2_000)
    _run(lake, spec)  # y.csv (an older modification time, copied in late) is file 3
    assert _logged(folder) == {"a.csv": 1, "x.csv": 2, "y.csv": 3}
    shutil.rmtree(log)
    shutil.copytree(copy, log)  # restored: same table id, files 2 and 3 forgotten
    write_csv(folder, "z.csv", [(4, 40)], mtime=1_500)
    runs = [lake.cli(spec, "run", "--json") for _ in range(2)]
    if any(r.returncode for r in runs):  # refused: loudly, naming the log, nothing loaded
        said = "".join(r.stdout + r.stderr for r in runs)
        assert "_watermark_files" in said, said
        assert _log_rows(lake) == [(1, 10), (2, 20), (3, 30)]
    else:
        assert _log_rows(lake) == [(1, 10), (2, 20), (3, 30), (4, 40)]


def test_two_upstreams_over_one_folder_do_not_share_a_file_log(lake: Lake) -> None:
    """CSV and JSON files in one folder, read by two upstreams (``*.csv``, ``*.json``):
    both logs default to ``<folder>/_watermark_files``, so each upstream numbered its files
    in the other's log, and each batch read the other's files in its own format (exit
    0). Refused, naming the log and the fix; nothing is written."""
    folder = lake.root / "landing"
    write_csv(folder, "a.csv", [(1, 10)])
    (folder / "b.json").write_text('{"id": 2, "value": 20}\n')
    common = {"kind": "landing", "path": str(folder), "settle_seconds": 0}
    schema = "id BIGINT, value BIGINT"
    upstreams = [
        {"name": "csv_drops", "format": "csv", "pattern": "*.csv", "file_schema": schema},
        {"name": "json_drops", "format": "json", "pattern": "*.json", "file_schema": schema},
    ]
    pipes = [
        {
            "name": f"{u['name']}_log",
            "upstreams": [u["name"]],
            "target": lake.path(u["name"]),
            "transform": "appended",
            "write": "append",
            "keys": [],
        }
        for u in upstreams
    ]
    spec = lake.spec([{**common, **u} for u in upstreams], pipes)
    out = lake.cli(spec, "run", "--json")
    said = out.stdout + out.stderr
    written = {
        u["name"]: sorted(
            ((r["id"], r["value"]) for r in lake.table(u["name"]).collect()), key=repr
        )
        for u in upstreams
        if Path(lake.path(u["name"])).exists()
    }
    if out.returncode == 0:
        assert written == {"csv_drops": [(1, 10)], "json_drops": [(2, 20)]}, said
    else:
        assert "_watermark_files" in said, said
        assert "files_log" in said, said
        for rows in written.values():
            assert rows in ([(1, 10)], [(2, 20)]), written
