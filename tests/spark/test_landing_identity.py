"""A landing file's identity, end to end through ``watermark run`` with real Spark, Delta and
Dagster: read by its exact path (never as a glob), known by path + size + modification
time (a logged file that reappears under another path is a move, refused), and one order,
the file number, deciding which row wins for a key in every batch and every reload."""

import json
import os
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
    """The merge copy of ``landing_spec`` and an append pipeline of every row."""
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


def test_a_name_with_glob_characters_reads_its_own_file(lake: Lake) -> None:
    folder = lake.root / "landing"
    write_csv(folder, "a[1].csv", [(1, 10)])
    write_csv(folder, "a1.csv", [(2, 20)])
    write_csv(folder, "b{x,y}?*.csv", [(3, 30)])
    spec = _with_log(lake, folder)
    _run(lake, spec)
    assert set(_logged(folder)) == {"a[1].csv", "a1.csv", "b{x,y}?*.csv"}
    assert lake.rows("copy") == {1: 10, 2: 20, 3: 30}
    assert _log_rows(lake) == [(1, 10), (2, 20), (3, 30)]  # each row exactly once
    # Incrementally too: a new file whose name is a glob reads itself, not its neighbours.
    write_csv(folder, "c[12].csv", [(4, 40)])
    write_csv(folder, "c1.csv", [(5, 50)])
    _run(lake, spec)
    assert _log_rows(lake) == [(1, 10), (2, 20), (3, 30), (4, 40), (5, 50)]
    assert lake.rows("copy") == {1: 10, 2: 20, 3: 30, 4: 40, 5: 50}


def test_a_loaded_file_moved_inside_the_folder_is_refused_not_loaded_again(lake: Lake) -> None:
    folder = lake.root / "landing"
    a = write_csv(folder, "a.csv", [(1, 10), (2, 20)])
    spec = _with_log(lake, folder, pattern="**")
    _run(lake, spec)
    assert _log_rows(lake) == [(1, 10), (2, 20)]

    # Moved to an archive prefix the pattern takes: same size and modification time.
    (folder / "archive").mkdir()
    moved = folder / "archive" / "a.csv"
    os.rename(a, moved)
    write_csv(folder, "b.csv", [(3, 30)])
    out = lake.cli(spec, "run", "--json")
    shown = out.stdout + out.stderr
    assert "'archive/a.csv'" in shown, shown
    assert "'a.csv' (file 1)" in shown, shown
    assert "moved" in shown, shown
    assert "_" in shown.split("Fix:")[-1], shown
    assert _logged(folder) == {"a.csv": 1}  # nothing logged, not even b.csv
    assert _log_rows(lake) == [(1, 10), (2, 20)]

    # Moved out of what the folder lists (a `_` prefix): a removal, which is fine.
    (folder / "_archive").mkdir()
    os.rename(moved, folder / "_archive" / "a.csv")
    _run(lake, spec)
    assert _logged(folder) == {"a.csv": 1, "b.csv": 2}
    assert _log_rows(lake) == [(1, 10), (2, 20), (3, 30)]
    assert lake.rows("copy") == {1: 10, 2: 20, 3: 30}


def test_a_writer_renaming_a_logged_temp_file_is_refused(lake: Lake) -> None:
    folder = lake.root / "landing"
    tmp = write_csv(folder, "x.tmp", [(1, 10)])
    spec = _with_log(lake, folder, pattern="*")
    _run(lake, spec)  # x.tmp settled and was taken: the pattern takes every name
    assert _logged(folder) == {"x.tmp": 1}
    os.rename(tmp, folder / "x.csv")
    out = lake.cli(spec, "run", "--json")
    shown = out.stdout + out.stderr
    assert "'x.csv'" in shown, shown
    assert "'x.tmp' (file 1)" in shown, shown
    assert _logged(folder) == {"x.tmp": 1}
    assert _log_rows(lake) == [(1, 10)]


def test_the_file_number_decides_which_row_wins_in_a_batch_across_batches_and_after_reset(
    lake: Lake,
) -> None:
    """File 2 (``a.csv``, modified later) sorts before file 1 (``z.csv``) by path; its row
    wins however the files are batched."""
    one = lake.root / "one"
    write_csv(one, "z.csv", [(1, 1), (2, 1)], mtime=1_000)
    write_csv(one, "a.csv", [(1, 2)], mtime=2_000)
    spec = landing_spec(lake, one)
    _run(lake, spec)
    assert _logged(one) == {"z.csv": 1, "a.csv": 2}
    assert lake.rows("copy") == {1: 2, 2: 1}

    # The same files in two batches, then reloaded from the start by a reset.
    two = lake.root / "two"
    write_csv(two, "z.csv", [(1, 1), (2, 1)], mtime=1_000)
    spec = landing_spec(lake, two)
    spec["pipelines"][0]["target"] = lake.path("copy2")
    spec["control_root"] = str(lake.root / "control2")
    _run(lake, spec)
    write_csv(two, "a.csv", [(1, 2)], mtime=2_000)
    _run(lake, spec)
    assert _logged(two) == {"z.csv": 1, "a.csv": 2}
    assert lake.rows("copy2") == {1: 2, 2: 1}
    reset = lake.cli(spec, "reset", "-t", "drops", "--yes", "--reason", "reload")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    _run(lake, spec)
    assert lake.rows("copy2") == {1: 2, 2: 1}
