"""`watermark run --once` runs one batch and `watermark run` the rest, with real Spark."""

import json
from pathlib import Path

import pytest

from tests.support.spec_lake import commit_rows, up_copy_lake

# A story of the console script in its own processes: the e2e tier's (pyproject.toml).
pytestmark = pytest.mark.e2e


@pytest.mark.spark
def test_run_once_runs_one_batch_and_run_runs_until_idle(
    spark, tmp_path: Path, dagster_home: Path
) -> None:
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    from tests.support.lakes import defs_from
    from watermark_dagster.dagster_defs.assets import ENGINE_TAG
    from watermark_dagster.dagster_defs.headless import HeadlessRunner

    lake = up_copy_lake(tmp_path, dagster_home, spark_master="local[1]")
    lake.spec["upstreams"][0]["max_versions_per_batch"] = 1
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:  # the first load, in this process
        assert len(HeadlessRunner(defs_from(lake.spec), instance).run_until_idle().completed) == 1
    finally:
        instance.dispose()
    for i in (3, 4, 5):
        commit_rows(tmp_path / "up", [i])  # versions 3, 4, 5: three batches of one version

    once = lake.cli("run", "--once", "--json")
    assert once.returncode == 0, once.stdout + once.stderr
    assert len(json.loads(once.stdout)["completed"]) == 1
    assert lake.store.committed_versions()["up"] == 3

    rest = lake.cli("run", "--json")
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert len(json.loads(rest.stdout)["completed"]) == 2
    assert lake.store.committed_versions()["up"] == 5
    # No engine for this home: every run used its own process's session, as its tag says.
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        tags = [r.tags.get(ENGINE_TAG) for r in instance.get_runs()]
    finally:
        instance.dispose()
    assert tags == ["process"] * 4, tags
