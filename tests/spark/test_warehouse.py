"""A warehouse target against a real PostgreSQL (Debian's, started for the module): the
seeds' last stage, database -> lake -> warehouse, through the real sensors, with real
Spark, Delta and Dagster.

The chain: ``orders`` in the database, extracted by its extraction stage into a Delta
table (``orders_db_lake``), which ``orders_wh`` loads into ``wh.orders`` in the same
server. After every batch the warehouse table equals a full read of the lake table (a
recompute), and its state row names the batch that loaded it.
"""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests.support.databases import Database, postgres
from tests.support.lakes import defs_from, registry_from, write_spec
from tests.support.spark_lake import Lake, batch_metadata, open_lake
from watermark_dagster.core.faults import ENV as FAULTS_ENV
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.core.records import BatchKind, BatchStatus, CheckpointStatus
from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
from watermark_dagster.errors import ConfigurationError, TargetBoundElsewhereError
from watermark_dagster.observe.log import latest_local_version
from watermark_dagster.observe.warehouse_state import read_state
from watermark_dagster.operations.run_pipeline import execute_pipeline

pytestmark = pytest.mark.spark

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SOURCE = "orders"
WAREHOUSE = "wh.orders"


@pytest.fixture(scope="module")
def server() -> Iterator[Database]:
    with postgres() as database:
        yield database


@pytest.fixture
def db(server: Database, monkeypatch: pytest.MonkeyPatch) -> Database:
    """``orders`` created afresh and the warehouse schema emptied; credentials in the
    environment (the warehouse's under names of its own)."""
    server.sql(
        f"DROP TABLE IF EXISTS {SOURCE}; DROP SCHEMA IF EXISTS wh CASCADE; "
        f"CREATE TABLE {SOURCE} (id bigint PRIMARY KEY, value bigint, "
        "updated_at timestamp(6) NOT NULL, deleted boolean NOT NULL DEFAULT false)"
    )
    for name in ("SHOP_USER", "WH_USER"):
        monkeypatch.setenv(name, "watermark")
    for name in ("SHOP_PASSWORD", "WH_PASSWORD"):
        monkeypatch.setenv(name, server.password)
    return server


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


def _at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%d %H:%M:%S.%f")


def _upsert(db: Database, rows: list[tuple[int, int, float]]) -> None:
    """Insert or update (id, value, minutes after T0) rows."""
    values = ", ".join(f"({i}, {v}, '{_at(m)}')" for i, v, m in rows)
    db.sql(
        f"INSERT INTO {SOURCE} (id, value, updated_at) VALUES {values} ON CONFLICT (id) DO "
        "UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at, deleted = false"
    )


def _target(db: Database, **settings: Any) -> dict[str, Any]:
    return {
        "kind": "postgres",
        "url": db.url,
        "table": WAREHOUSE,
        "user": {"env": "WH_USER"},
        "password": {"env": "WH_PASSWORD"},
        **settings,
    }


def _spec(lake: Lake, db: Database, **target: Any) -> dict[str, Any]:
    upstream = {
        "name": "orders_db",
        "kind": "database",
        "url": db.url,
        "source_table": f"public.{SOURCE}",
        "cursor": "updated_at",
        "tie_break": ["id"],
        "user": {"env": "SHOP_USER"},
        "password": {"env": "SHOP_PASSWORD"},
        "soft_delete": "deleted",
    }
    pipes = [
        {"stage": "orders_db", "target": lake.path("orders"), "keys": ["id"]},
        {
            "name": "orders_wh",
            "upstreams": ["orders_db_lake"],
            "target": _target(db, **target),
            "transform": "copy",
        },
    ]
    return {**lake.spec([upstream], pipes), "max_attempts": 1}


def _run(lake: Lake, spec: dict[str, Any], batches: int | None = None) -> CycleReport:
    return HeadlessRunner(defs_from(spec), lake.instance).run_until_idle(max_batches=batches)


def _warehouse(db: Database) -> dict[int, int]:
    """id -> value of the warehouse table, failing on a duplicated id."""
    rows = db.sql("SELECT id, value FROM wh.orders")
    ids = [int(i) for i, _ in rows]
    assert len(ids) == len(set(ids)), "duplicated ids in the warehouse"
    return {int(i): int(v) for i, v in rows}


def _assert_loaded(lake: Lake, db: Database) -> None:
    """The warehouse equals a recompute from the lake (a full read of its table), and the
    lake equals the source."""
    lake_rows = lake.rows("orders")
    live = {int(i): int(v) for i, v in db.sql(f"SELECT id, value FROM {SOURCE} WHERE NOT deleted")}
    assert lake_rows == live
    assert _warehouse(db) == lake_rows


def test_the_chain_loads_the_warehouse_exactly_once(lake: Lake, db: Database) -> None:
    spec = _spec(lake, db)
    _upsert(db, [(1, 10, 1), (2, 20, 2), (3, 30, 3)])
    _run(lake, spec)
    _assert_loaded(lake, db)
    registry = registry_from(spec)
    target = registry.pipelines["orders_wh"].warehouse
    assert target is not None
    state = read_state(target, "orders_wh")
    assert state is not None and not state.fenced
    done = [b for b in lake.store.batches() if b.status is BatchStatus.COMPLETED]
    assert state.batch_id == max(done, key=lambda b: b.seq).batch_id

    # Updates, inserts and soft deletes, over several batches.
    _upsert(db, [(1, 11, 4), (4, 40, 5)])
    db.sql(f"UPDATE {SOURCE} SET deleted = true, updated_at = '{_at(6)}' WHERE id = 2")
    _run(lake, spec)
    _assert_loaded(lake, db)
    _upsert(db, [(5, 50, 7), (3, 33, 8)])
    _run(lake, spec)
    _assert_loaded(lake, db)
    meta = batch_metadata(lake, "orders_wh", read_state(target, "orders_wh").batch_id)  # type: ignore[union-attr]
    assert meta["rows_written"] == 2
