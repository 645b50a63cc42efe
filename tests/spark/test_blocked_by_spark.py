"""A table recreated by Spark's CREATE OR REPLACE TABLE ... AS SELECT is blocked like one
recreated by delta-rs (tests/dagster/test_blocked_upstreams.py), and so is a next range
whose change files Spark's VACUUM removed (delta-rs' VACUUM keeps change files)."""

import os
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.dagster.test_blocked_upstreams import RESET, Lake, blocked_lake
from watermark_dagster.errors import recreated_fix
from watermark_dagster.read.tables import next_range_fix


@pytest.fixture
def lake(tmp_path: Path, dagster_home: Path) -> Lake:
    """Two upstreams, each read by one pipeline; a first batch already applied."""
    return blocked_lake(tmp_path, dagster_home)


@pytest.mark.spark
def test_create_or_replace_table_is_blocked(spark, lake: Lake) -> None:
    """Spark's CREATE OR REPLACE keeps the path and the version numbers going (the new
    table's first version is 3) but gives the table a new id and drops its change feed."""
    spark.sql(
        f"CREATE OR REPLACE TABLE delta.`{lake.up}` USING delta AS "
        "SELECT id, id * 2 AS value FROM range(3)"
    )
    assert DeltaTable(str(lake.up)).version() == 3
    rows = {r["upstream"]: r for r in lake.json("list")}
    assert "its table id is" in rows["up"]["blocked"]
    assert rows["up"]["fix"] == recreated_fix("up")
    plan = lake.json("plan", "--dry-run")
    assert "up" in plan["blocked"]
    assert plan["pipelines"] == []
    run = lake.cli("run")
    assert run.returncode == 1, run.stdout + run.stderr
    assert RESET in run.stderr, run.stdout + run.stderr


@pytest.mark.spark
def test_a_next_range_whose_change_files_were_vacuumed_is_blocked_not_planned(
    spark, lake: Lake
) -> None:
    """Spark's VACUUM removed the change file of version 3 (an update of a CDF upstream)
    while no batch was open: the next range is refused at planning, BLOCKED with its fix,
    and the coordinator plans nothing."""
    DeltaTable(str(lake.up)).update(predicate="id = 1", updates={"value": "-1"})  # v3
    [change_file] = os.listdir(lake.up / "_change_data")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{lake.up}` RETAIN 0 HOURS")
    finally:
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "true")
    assert not os.listdir(lake.up / "_change_data")
    latest = DeltaTable(str(lake.up)).version()  # VACUUM's own commits come after v3
    fix = next_range_fix("up", "delta.deletedFileRetentionDuration")
    batches_before = len(lake.store.batches())

    plan = lake.json("plan", "--dry-run")
    held = plan["blocked"]["up"]
    assert f"the change files of commits 3 of its next range [3, {latest}]" in held["reason"]
    assert f"missing file: _change_data/{change_file}" in held["reason"]
    assert "VACUUM" in held["reason"]
    assert (held["fix"], plan["pipelines"]) == (fix, [])
    up = {r["upstream"]: r for r in lake.json("list")}["up"]
    assert (up["state"], up["blocked"], up["fix"]) == ("blocked", held["reason"], fix)

    run = lake.cli("run")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "BLOCKED: upstream up cannot read its next range" in run.stderr
    assert len(lake.store.batches()) == batches_before
