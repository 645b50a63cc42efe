"""Landing-folder upstreams with real Spark, Delta and Dagster: each file is loaded once.

Each location is driven by the real coordinator and finalizer sensors (HeadlessRunner);
the target is compared with a full read of every file after each batch.
"""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.conftest import REPO
from tests.support.lakes import defs_from, location_path, registry_from, write_spec
from tests.support.landing import all_files, landing_spec, write_csv
from tests.support.spark_lake import Lake, batch_metadata, open_lake
from watermark_dagster.core.faults import ENV as FAULTS_ENV
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.core.records import BatchStatus
from watermark_dagster.dagster_defs.headless import HeadlessRunner
from watermark_dagster.errors import LandingFileChangedError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import finalize_batch
from watermark_dagster.operations.run_pipeline import execute_pipeline

pytestmark = pytest.mark.spark


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


def test_new_files_are_loaded_once_batch_after_batch(lake: Lake) -> None:
    folder = lake.root / "landing"
    write_csv(folder, "a.csv", [(1, 10), (2, 20)])
    write_csv(folder, "b.csv", [(3, 30)])
    spec = landing_spec(lake, folder)
    [b1] = lake.run(spec).completed
    assert lake.rows("copy") == all_files(lake, folder)
    first = lake.store.get_batch(b1).inputs["drops"]
    assert (first.mode, first.range) == (ReadMode.SNAPSHOT, VersionRange(0, 2))

    # A file copied in with an old modification time is new all the same.
    write_csv(folder, "old/c.csv", [(4, 40)], mtime=1_000_000)
    write_csv(folder, "d.csv", [(5, 50), (1, 11)])
    [b2] = lake.run(spec).completed
    second = lake.store.get_batch(b2).inputs["drops"]
    assert (second.mode, second.range) == (ReadMode.APPEND_ONLY, VersionRange(3, 4))
    meta = batch_metadata(lake, "drops_copy", b2)
    assert (meta["drops/files_read"], meta["drops/rows_read"]) == (2, 3)
    assert lake.rows("copy") == all_files(lake, folder)
    assert lake.run(spec).completed == []  # nothing new: no batch
    assert lake.store.get_batch(b2).status is BatchStatus.COMPLETED
    assert lake.store.committed_versions()["drops"] == 4

    # --show-files: every file with its batch, size, mtime and status, as text and JSON.
    listed = lake.cli(spec, "get", "-t", "drops", "--show-files", "--json")
    assert listed.returncode == 0, listed.stderr
    files = json.loads(listed.stdout)["files"]
    assert [(f["batch_id"], f["number"], f["file"], f["status"]) for f in files] == [
        (b1, 1, "a.csv", "loaded"),
        (b1, 2, "b.csv", "loaded"),
        (b2, 3, "old/c.csv", "loaded"),
        (b2, 4, "d.csv", "loaded"),
    ]
    c_file = folder / "old" / "c.csv"
    assert files[2]["size"] == c_file.stat().st_size
    assert files[2]["mtime"].startswith("1970-01-12T13:46:40")
    text = lake.cli(spec, "get", "-t", "drops", "--show-files")
    assert text.returncode == 0, text.stderr
    assert "files (4)" in text.stdout
    line = next(ln for ln in text.stdout.splitlines() if "old/c.csv" in ln)
    assert b2 in line
    assert "loaded" in line
    assert str(c_file.stat().st_size) in line


def _restore(path: Path, content: bytes, mtime_ns: int) -> None:
    path.write_bytes(content)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_file_changed_after_loading_or_gone_before_it_is_loud(lake: Lake) -> None:
    folder = lake.root / "landing"
    a = write_csv(folder, "a.csv", [(1, 10)])
    spec = landing_spec(lake, folder)
    [b1] = lake.run(spec).completed
    before = lake.rows("copy")
    content, mtime_ns, size = a.read_bytes(), a.stat().st_mtime_ns, a.stat().st_size

    # Rewritten after it was loaded: the look refuses the upstream; nothing is planned.
    write_csv(folder, "a.csv", [(1, 99), (7, 70)])
    write_csv(folder, "b.csv", [(2, 20)])
    upstream = registry_from(spec).upstreams["drops"]
    with pytest.raises(LandingFileChangedError) as raised:
        Observer().observe(upstream, floor=0)
    message = str(raised.value)
    assert "Upstream 'drops'" in message
    assert "'a.csv'" in message
    assert f"recorded: size {size}" in message
    assert f"now: size {a.stat().st_size}" in message
    assert "Fix: put it back exactly as recorded" in message
    assert lake.run(spec).completed == []
    assert lake.rows("copy") == before
    listed = json.loads(lake.cli(spec, "get", "-t", "drops", "--json").stdout)
    assert "'a.csv'" in listed["unavailable"]
    _restore(a, content, mtime_ns)

    # Gone before its batch loaded it: the batch fails before anything is written, and
    # goes on once the file is back.
    c = write_csv(folder, "c.csv", [(3, 30)])
    Observer().observe(upstream, floor=0)  # logged: files 2 (b.csv) and 3 (c.csv)
    c_content, c_mtime = c.read_bytes(), c.stat().st_mtime_ns
    c.unlink()
    failed = lake.run(spec)
    assert failed.completed == [], failed
    assert failed.failed_runs, failed
    assert "LandingFileChangedError" in str(failed.failed_runs[0].error)
    assert "'c.csv' (file 3) disappeared" in str(failed.failed_runs[0].error)
    assert lake.rows("copy") == before
    open_batch = lake.store.open_batch()
    assert open_batch is not None
    assert open_batch.inputs["drops"].range == VersionRange(2, 3)
    _restore(c, c_content, c_mtime)
    retried = HeadlessRunner(defs_from(spec), lake.instance).run_until_idle(retry=True)
    assert retried.completed == [open_batch.batch_id], retried
    assert lake.rows("copy") == all_files(lake, folder) == {1: 10, 2: 20, 3: 30}
    assert b1 != open_batch.batch_id

    # A replay of that batch reads exactly its pinned files (not one landed since), and is
    # loud when one of them changed.
    write_csv(folder, "e.csv", [(2, 99)])
    Observer().observe(upstream, floor=0)  # logged as file 4
    registry = registry_from(spec)
    run = {"spark": lake.spark, "store": lake.store, "registry": registry}

    def replay() -> str:
        batch = lake.store.create_range_replay(
            "drops",
            VersionRange(2, 3),
            mode=ReadMode.APPEND_ONLY,
            pipelines=["drops_copy"],
            all_upstreams=["drops"],
            actor="test",
        )
        return batch.batch_id

    replayed = replay()
    outcome = execute_pipeline(**run, pipeline_name="drops_copy", batch_id=replayed)
    assert outcome.rows_read == 2  # b.csv and c.csv, not e.csv
    assert lake.rows("copy") == {1: 10, 2: 20, 3: 30}
    finalize_batch(lake.store, lake.store.get_batch(replayed), registry=registry, actor="test")
    write_csv(folder, "b.csv", [(2, 22), (8, 80)])  # rewritten after it was loaded
    with pytest.raises(LandingFileChangedError, match=r"'b.csv' \(file 2\) changed"):
        execute_pipeline(**run, pipeline_name="drops_copy", batch_id=replay())
    assert lake.rows("copy") == {1: 10, 2: 20, 3: 30}


def test_a_run_killed_after_its_write_is_retried_and_loads_each_file_once(lake: Lake) -> None:
    """A real process running the batch is SIGKILLed right after its append committed and
    before its checkpoint; the retry (the next ticks, here) must not append the files'
    rows a second time, and the next batch takes only the files that came after."""
    folder = lake.root / "landing"
    write_csv(folder, "a.csv", [(1, 10), (2, 20)])
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
    [first] = lake.run(spec).completed
    write_csv(folder, "b.csv", [(3, 30)])
    write_csv(folder, "c.csv", [(4, 40), (5, 50)])
    spec_file = write_spec(lake.root / "spec.json", spec)
    child = subprocess.run(
        [sys.executable, "-m", "tests.crash.test_crashes", "cycle", str(spec_file)],
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": location_path(spec_file),
            FAULTS_ENV: "after_target_commit@drops_log",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    killed = lake.store.open_batch()
    assert killed is not None
    assert killed.inputs["drops"].range == VersionRange(2, 3)
    assert lake.table("log").count() == 5  # the killed run's append is in the target

    write_csv(folder, "d.csv", [(6, 60)])  # lands while the batch is open
    report = lake.run(spec)
    assert report.completed[0] == killed.batch_id, report
    ids = [r["id"] for r in lake.table("log").select("id").collect()]
    assert sorted(ids) == [1, 2, 3, 4, 5, 6]  # every file's rows exactly once
    assert lake.store.committed_versions()["drops"] == 4
    ranges = [lake.store.get_batch(b).inputs["drops"].range for b in report.completed]
    assert ranges == [VersionRange(2, 3), VersionRange(4, 4)]
    assert first not in report.completed
