"""A table recreated by Spark's CREATE OR REPLACE TABLE ... AS SELECT is blocked like one
recreated by delta-rs (tests/dagster/test_blocked_upstreams.py)."""

from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.support.blocked import RESET, blocked_lake
from tests.support.spec_lake import Lake
from watermark_dagster.errors import recreated_fix


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
