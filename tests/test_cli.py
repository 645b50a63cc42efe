"""The `watermark` console script, run in a subprocess against real control tables.

The demo code location is pointed at upstream tables written with delta-rs (no JVM); the
commands here only read, so a rejected command must leave every control table as it was.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.demo import DemoPaths
from watermark_dagster.store import BatchStatus, WatermarkStore

SCRIPT = Path(sys.executable).with_name("watermark")
PIPELINES = {
    "orders_enriched": ["orders", "customers"],
    "customer_payments": ["customers", "payments"],
}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    paths = DemoPaths(tmp_path / "wm")
    for name, commits in (("customers", 2), ("orders", 3), ("payments", 1)):
        for i in range(commits):
            write_deltalake(
                paths.upstream(name), pa.table({"id": pa.array([i], pa.int64())}), mode="append"
            )
    store = WatermarkStore(paths.control_root)
    batch, _ = store.create_batch(
        [
            UpstreamPosition(n, v, None)
            for n, v in (("customers", 1), ("orders", 2), ("payments", 0))
        ],
        PIPELINES,
        actor="test",
    )
    assert batch is not None
    for upstream in batch.ranged_upstreams:
        store.advance(batch, upstream, actor="test")
    store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="test")
    write_deltalake(
        paths.upstream("orders"), pa.table({"id": pa.array([9], pa.int64())}), mode="append"
    )
    return paths.home


def watermark(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WATERMARK_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    return subprocess.run(
        [str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _versions(home: Path) -> dict[str, int]:
    store = WatermarkStore(DemoPaths(home).control_root)
    return {
        t: store.table_version(t)
        for t in ("batches", "committed_watermarks", "pipeline_checkpoints", "history")
    }


def test_list_shows_committed_latest_and_lag(home: Path) -> None:
    out = watermark(home, "list", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["upstream"]: r for r in json.loads(out.stdout)}
    assert (rows["orders"]["committed"], rows["orders"]["latest"], rows["orders"]["lag"]) == (
        2,
        3,
        1,
    )
    assert rows["payments"]["lag"] == 0
    table = watermark(home, "list")
    assert table.stdout.splitlines()[0].split() == [
        "upstream",
        "committed",
        "latest",
        "lag",
        "open",
        "batch",
        "last",
        "change",
    ]


def test_get_with_history(home: Path) -> None:
    out = watermark(home, "get", "-t", "orders", "--history", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert (got["committed"], got["batch_id"], got["how"]) == (2, "b000001", "AUTO")
    assert [(h["event"], h["new_value"]) for h in got["history"]] == [("WATERMARK_ADVANCED", "2")]


def test_batches_and_batch(home: Path) -> None:
    out = watermark(home, "batches", "--status", "completed", "--json")
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert row["ranges"] == {"customers": "[0, 1]", "orders": "[0, 2]", "payments": "[0, 0]"}
    detail = json.loads(watermark(home, "batch", "b000001", "--json").stdout)
    assert all(u["advanced"] for u in detail["upstreams"])
    assert detail["status"] == "COMPLETED"


def test_plan_dry_run_writes_nothing(home: Path) -> None:
    before = _versions(home)
    out = watermark(home, "plan", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    ranges = {u["upstream"]: u["range"] for u in plan["upstreams"]}
    assert ranges == {"orders": "[3, 3]", "customers": "NOOP", "payments": "NOOP"}
    assert plan["pipelines"] == ["orders_enriched"] and plan["would_plan"]
    assert _versions(home) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["get", "-t", "ordrs"], "unknown upstream 'ordrs'"),
        (["get", "-t", "orders; DROP TABLE x"], "unknown upstream 'orders; DROP TABLE x'"),
        (["batches", "--status", "DONE"], "unknown --status 'DONE'"),
        (["batches", "--limit", "0"], "--limit must be 1 or more"),
        (["batches", "--limit", "many"], "invalid int value: 'many'"),
        (["batch", "42"], "'42' is not a batch id"),
        (["batch", "b999999"], "No batch 'b999999'"),
        (["plan"], "add --dry-run"),
    ],
    ids=[
        "unknown-table",
        "sql-in-name",
        "bad-status",
        "zero-limit",
        "non-numeric-limit",
        "bad-batch-id",
        "missing-batch",
        "plan-without-dry-run",
    ],
)
def test_bad_input_is_refused_clearly_and_writes_nothing(
    home: Path, args: list[str], message: str
) -> None:
    before = _versions(home)
    out = watermark(home, *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr
    assert _versions(home) == before
