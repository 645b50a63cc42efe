"""Operating a landing upstream with real Spark, Delta and Dagster: replays of its batches,
``watermark set --timestamp``, an empty folder, and read-only looks that write nothing."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.support.landing import landing_spec, write_csv
from tests.support.spark_lake import Lake, open_lake

pytestmark = pytest.mark.spark

_TABLES = ("batches", "committed_watermarks", "pipeline_checkpoints", "history")


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


def _versions(lake: Lake) -> dict[str, int]:
    return {t: lake.store.table_version(t) for t in _TABLES}


def _append_spec(lake: Lake, folder: Path) -> dict:
    spec = landing_spec(lake, folder)
    spec["pipelines"] = [
        {
            "name": "drops_log",
            "upstreams": ["drops"],
            "target": lake.path("log"),
            "transform": "appended",
            "write": "append",
            "keys": [],
        }
    ]
    return spec


def test_a_merge_replay_reads_exactly_its_pinned_files(lake: Lake) -> None:
    folder = lake.root / "landing"
    write_csv(folder, "a.csv", [(1, 10)])
    write_csv(folder, "b.csv", [(2, 20)])
    spec = landing_spec(lake, folder)
    lake.run(spec)  # files 1-2
    write_csv(folder, "c.csv", [(3, 30)])
    lake.run(spec)  # file 3
    write_csv(folder, "d.csv", [(1, 11)])
    lake.run(spec)  # file 4: a newer row for id 1
    assert lake.rows("copy") == {1: 11, 2: 20, 3: 30}
    replay = ("replay", "-t", "drops", "--from-version", "1", "--to-version", "3")

    dry = lake.cli(spec, *replay, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "[1, 3]" in dry.stdout, dry.stdout

    done = lake.cli(spec, *replay, "--yes", "--json", process=True)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "COMPLETED", result
    assert [c["rows_read"] for c in result["checkpoints"]] == [3]  # a, b, c; not d
    assert lake.rows("copy") == {1: 11, 2: 20, 3: 30}  # file 4's newer row is kept
    assert lake.store.committed_versions()["drops"] == 4

    # A pinned file gone: the replay is refused before anything is recorded, naming it.
    (folder / "b.csv").unlink()
    versions = _versions(lake)
    gone = lake.cli(spec, *replay, "--yes")
    assert gone.returncode == 2, gone.stdout + gone.stderr
    assert "'b.csv' (file 2) disappeared" in gone.stderr, gone.stderr
    assert "log cleanup" not in gone.stderr
    assert _versions(lake) == versions


def test_an_append_pipeline_replay_is_refused_with_its_reason(lake: Lake) -> None:
    folder = lake.root / "landing"
    write_csv(folder, "a.csv", [(1, 10)])
    spec = _append_spec(lake, folder)
    lake.run(spec)
    versions = _versions(lake)
    out = lake.cli(spec, "replay", "-t", "drops", "--from-version", "1", "--to-version", "1")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "an append target has the rows already" in out.stderr, out.stderr
    assert "log cleanup" not in out.stderr
    assert _versions(lake) == versions
