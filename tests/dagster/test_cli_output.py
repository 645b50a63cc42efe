"""What the console script prints must not mislead: each case runs the real `watermark`
script in a subprocess against real control tables and Delta tables written with delta-rs
(the `--once` case runs pipelines with Spark).

Covered: cursor windows in `batches`; a preview in a fresh home that creates nothing and
says why nothing can be planned; cursor positions in `plan --dry-run`; stuck batches and
whole errors in `batch`; a pipeline added later shown as a SNAPSHOT of its upstreams;
planned ranges whose commits are already gone; the actor without `$USER`; `run --once`.
"""

import json
import os
import pwd
import socket
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from tests.support.blocked import RESET
from tests.support.cli import SCRIPT, on_terminal
from tests.support.lakes import location_defs, location_path, write_spec
from tests.support.spec_lake import commit_rows, up_copy_lake
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.core.ranges import ReadMode
from watermark_dagster.core.records import BatchStatus, CheckpointStatus
from watermark_dagster.demo import DemoPaths
from watermark_dagster.read.unreadable import unreadable
from watermark_dagster.store import WatermarkStore


def _advance_all(store: WatermarkStore, batch: Any) -> None:
    for upstream in batch.ranged_upstreams:
        store.advance(batch, upstream, actor="test")
    store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="test")


# ------------------------------------------------------------------ cursor upstreams


def test_batches_and_plan_show_a_cursor_upstreams_window_and_position(
    tmp_path: Path, dagster_home: Path
) -> None:
    clicks = tmp_path / "clicks"
    clicks.mkdir()
    pq.write_table(
        pa.table({"ts": pa.array([1, 2], pa.int64()), "id": [1, 2]}), clicks / "a.parquet"
    )
    lake = up_copy_lake(
        tmp_path,
        dagster_home,
        upstreams=[{"name": "clicks", "path": str(clicks), "mode": "timestamp",
                    "format": "parquet", "cursor": "ts", "tie_break": ["id"]}],
        pipelines=[{"name": "clicks_copy", "upstreams": ["clicks"],
                    "target": str(tmp_path / "t"), "transform": "copy"}],
    )  # fmt: skip
    store = lake.store
    batch, _ = store.create_batch(
        [UpstreamPosition("clicks", -1, None, mode=ReadMode.TIMESTAMP)],
        {"clicks_copy": ["clicks"]},
        actor="test",
    )
    assert batch is not None
    end = ("2026-01-01T00:05:00+00:00", 2000)
    store.pin_window(batch.batch_id, "clicks", end)
    _advance_all(store, store.get_batch(batch.batch_id))

    [row] = lake.json("batches")
    assert row["ranges"] == {"clicks": "(-inf .. 2026-01-01T00:05:00+00:00, 2000]"}
    text = lake.cli("batches")
    assert "clicks=(-inf .. 2026-01-01T00:05:00+00:00, 2000]" in text.stdout, text.stdout
    assert "NOOP" not in text.stdout

    # `plan --dry-run` shows the committed position `watermark list` shows, no version.
    listed = {r["upstream"]: r for r in lake.json("list")}
    [planned] = lake.json("plan", "--dry-run")["upstreams"]
    assert planned["committed"] == listed["clicks"]["committed"] == list(end)
    assert planned["latest"] is None
    assert planned["range"].startswith("(2026-01-01T00:05:00+00:00, 2000 .. ")
    plan = lake.cli("plan", "--dry-run")
    [line] = [x for x in plan.stdout.splitlines() if x.startswith("clicks")]
    assert "2026-01-01T00:05:00+00:00, 2000" in line
    assert "none" not in line
    assert "-1" not in line


# ------------------------------------------------------------------ plan --dry-run


def test_plan_in_a_fresh_home_creates_nothing_and_says_why_nothing_is_planned(
    tmp_path: Path,
) -> None:
    home = tmp_path / "fresh"
    env = {**os.environ, "WATERMARK_HOME": str(home), "DAGSTER_HOME": str(tmp_path / "dh")}
    env.pop("WATERMARK_REGISTRY", None)

    def plan(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(SCRIPT), "plan", "--dry-run", *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    out = plan()
    assert out.returncode == 0, out.stderr
    # The demo location's upstreams do not exist yet: the reason is on stdout, above the
    # rows of the upstreams that block the plan.
    assert "no upstream has new versions" not in out.stdout
    assert "nothing can be planned for ['customer_payments', 'orders_enriched']" in out.stdout
    for name in ("customers", "orders", "payments"):
        assert f"UNAVAILABLE {name}: Upstream '{name}'" in out.stdout
        assert any(line.split()[:1] == [name] for line in out.stdout.splitlines())
    assert "not a readable Delta table" in out.stdout
    got = json.loads(plan("--json").stdout)
    assert set(got["unavailable"]) == {"customers", "orders", "payments"}
    assert not Path(DemoPaths(home).control_root).exists()


def test_plan_blocks_a_next_range_whose_commits_are_gone(
    tmp_path: Path, dagster_home: Path
) -> None:
    """No batch is open and log cleanup removed commits 2..3 of the next range: the preview
    shows the upstream BLOCKED, as the coordinator would leave it (see
    tests/dagster/test_blocked_upstreams.py), with a fix that abandons no batch."""
    lake = up_copy_lake(tmp_path, dagster_home, commits=6)
    commit_rows(tmp_path / "up_copy", [0])  # a target that exists: no first load
    store = lake.store
    batch, _ = store.create_batch([UpstreamPosition("up", 1, None)], {"up_copy": ["up"]}, actor="t")
    assert batch is not None
    _advance_all(store, batch)
    # Log cleanup: a checkpoint at the latest version, older commit files removed.
    DeltaTable(str(tmp_path / "up")).create_checkpoint()
    for version in range(4):
        (tmp_path / "up" / "_delta_log" / f"{version:020d}.json").unlink()

    got = lake.json("plan", "--dry-run")
    assert not got["would_plan"]
    assert "warnings" not in got
    held = got["blocked"]["up"]
    assert "commits 2..3 of its next range [2, 5]" in held["reason"]
    assert held["fix"].startswith("run `watermark reset -t up`: ")
    assert "open batch" not in held["fix"]


# ------------------------------------------------------------------ pipelines added later


def test_a_pipeline_added_later_reads_its_upstreams_as_a_snapshot(
    tmp_path: Path, dagster_home: Path
) -> None:
    lake = up_copy_lake(tmp_path, dagster_home)
    commit_rows(tmp_path / "up_copy", [0])
    store = lake.store
    batch, _ = store.create_batch([UpstreamPosition("up", 2, None)], {"up_copy": ["up"]}, actor="t")
    assert batch is not None
    _advance_all(store, batch)
    lake.spec["pipelines"].append(
        {
            "name": "up_new",
            "upstreams": ["up"],
            "target": str(tmp_path / "new"),
            "transform": "copy",
        }
    )

    got = lake.json("plan", "--dry-run")
    assert (got["pipelines"], got["full_load"]) == (["up_new"], ["up_new"])
    [up] = got["upstreams"]
    assert (up["mode"], up["range"], up["snapshot_for"]) == ("NOOP", "NOOP", ["up_new"])
    assert "SNAPSHOT @2 for up_new" in lake.cli("plan", "--dry-run").stdout

    planned, _ = store.create_batch(
        [UpstreamPosition("up", 2, None)],
        {"up_copy": ["up"], "up_new": ["up"]},
        actor="t",
        bootstrap=["up_new"],
    )
    assert planned is not None
    assert planned.full_load == ("up_new",)
    detail = lake.json("batch", planned.batch_id)
    assert [(u["mode"], u["snapshot_for"]) for u in detail["upstreams"]] == [("NOOP", ["up_new"])]
    assert "SNAPSHOT @2 for up_new" in lake.cli("batch", planned.batch_id).stdout
    [row] = [r for r in lake.json("batches") if r["batch_id"] == planned.batch_id]
    assert row["full_load"] == ["up_new"]


# ------------------------------------------------------------------ stuck batches and errors

LONG_ERROR = (
    "watermark_dagster.errors.UpstreamSchemaChangedError: Upstream 'up': the schema changed "
    "incompatibly inside the batch's range [3, 3]: column 'value' changed type from "
    '"long" to "string". Fix: adapt the pipelines reading it to the new schema, then run '
    f"{RESET} to reload from a snapshot."
)


def test_a_stuck_batch_shows_stuck_with_its_reason_fix_and_whole_error(
    tmp_path: Path, dagster_home: Path
) -> None:
    lake = up_copy_lake(tmp_path, dagster_home)
    store = lake.store
    batch, _ = store.create_batch([UpstreamPosition("up", 2, None)], {"up_copy": ["up"]}, actor="t")
    assert batch is not None
    attempt = store.begin_checkpoint("up_copy", batch.batch_id, run_id="r1")
    store.finish_checkpoint(
        "up_copy", batch.batch_id, attempt, CheckpointStatus.FAILED, error=LONG_ERROR
    )
    store.record(
        "BATCH_STUCK",
        actor="sensor:watermark_coordinator",
        batch_id=batch.batch_id,
        # The shape the coordinator records for a terminal failure.
        detail={
            "failed_runs": 1,
            "pipelines": ["up_copy"],
            "reason": "batch is stuck: ...",
            "terminal": True,
            "error": "UpstreamSchemaChangedError",
            "message": LONG_ERROR.split(": ", 1)[1],
        },
    )

    got = lake.json("batch", batch.batch_id)
    assert got["status"] == "STUCK"
    assert got["stuck"]["fix"] == LONG_ERROR.split(" Fix: ")[1]
    assert "changed type" in got["stuck"]["reason"]
    assert got["stuck"]["terminal"] is True
    assert [b["batch_id"] for b in lake.json("batches", "--status", "stuck")] == [batch.batch_id]

    # `list` and `get`, the first commands an operator runs, say STUCK, why, and the fix.
    fix = LONG_ERROR.split(" Fix: ")[1]
    [row] = lake.json("list")
    assert (row["state"], row["fix"], row["blocked"]) == ("stuck", fix, None)
    assert (row["stuck"]["batch_id"], row["stuck"]["pipelines"]) == (batch.batch_id, ["up_copy"])
    assert "changed type" in row["stuck"]["reason"]
    got = lake.json("get", "-t", "up")
    assert (got["state"], got["fix"], got["stuck"]) == ("stuck", fix, row["stuck"])
    listed = lake.cli("list").stdout
    assert f"{batch.batch_id} {batch.inputs['up'].describe()} STUCK" in listed, listed
    assert f"STUCK up: batch {batch.batch_id} (up_copy) is stuck since" in listed, listed
    assert f"fix: {fix}" in listed, listed
    shown = lake.cli("get", "-t", "up").stdout
    assert "STUCK" in shown, shown
    assert "changed type" in shown, shown
    assert fix in " ".join(shown.split()), shown
    # `plan --dry-run` does not promise a resume: the batch is stuck, and the fix is named.
    assert lake.json("plan", "--dry-run")["open_batch_stuck"]["fix"] == fix
    planned = lake.cli("plan", "--dry-run").stdout
    assert f"batch {batch.batch_id} is open and STUCK" in planned, planned
    assert "resumes it" not in planned, planned
    assert f"fix: {fix}" in planned, planned

    # Off a terminal nothing is cut: the fix command at the end of the error is there.
    text = lake.cli("batch", batch.batch_id)
    first = text.stdout.splitlines()[0]
    assert "STUCK" in first
    assert "PLANNED" not in first
    assert f"fix: adapt the pipelines reading it to the new schema, then run {RESET}" in (
        text.stdout
    )
    assert LONG_ERROR in text.stdout

    # On a terminal the row is cut to the width, and the whole error follows, wrapped.
    spec_file = write_spec(tmp_path / "spec.json", lake.spec)
    rc, screen, err = on_terminal(
        tmp_path,
        "batch",
        batch.batch_id,
        "--defs",
        location_defs(spec_file),
        stdout_tty=True,
        COLUMNS="100",
        NO_COLOR="1",
        DAGSTER_HOME=str(dagster_home),
        PYTHONPATH=location_path(spec_file),
    )
    assert rc == 0, err
    lines = screen.replace("\r", "").splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    assert any(line.endswith("…") and line.startswith("up_copy") for line in lines)
    assert LONG_ERROR in " ".join(" ".join(lines).split())

    # Re-executed after it was reported stuck: no longer given up on.
    again = store.begin_checkpoint("up_copy", batch.batch_id, run_id="r2")
    assert lake.json("batch", batch.batch_id)["status"] == "PLANNED"
    assert [(r["state"], r["stuck"], r["fix"]) for r in lake.json("list")] == [("ok", None, None)]
    # Stuck again, recorded without an error or a fix: the failed attempt's error says it.
    store.finish_checkpoint(
        "up_copy", batch.batch_id, again, CheckpointStatus.FAILED, error=LONG_ERROR
    )
    store.record(
        "BATCH_STUCK",
        actor="sensor:watermark_coordinator",
        batch_id=batch.batch_id,
        detail={"failed_runs": 2, "pipelines": ["up_copy"]},
    )
    stuck = lake.json("batch", batch.batch_id)["stuck"]
    assert stuck["fix"] == LONG_ERROR.split(" Fix: ")[1]
    assert stuck["reason"] == LONG_ERROR.split(" Fix: ")[0]


def test_an_unreadable_range_error_names_the_missing_file_without_py4j_noise() -> None:
    """The text Spark 4.1 raised for a CDF range whose change file VACUUM removed (recorded
    from a real run; test_read_modes runs the case end to end)."""
    spark_text = (
        "An error occurred while calling o68.count.\n"
        ": org.apache.spark.SparkException: [FAILED_READ_FILE.FILE_NOT_EXIST] Encountered "
        "error while reading file file:/lake/up/_change_data/cdc-00000-d9.c000.snappy.parquet."
        " File does not exist. It is possible the underlying files have been updated.\n"
        "You can explicitly invalidate the cache in Spark by running 'REFRESH TABLE tableName'"
        " command in SQL or by recreating the Dataset/DataFrame involved. SQLSTATE: KD001\n"
        "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.fileNotExistError("
        "QueryExecutionErrors.scala:902)\n"
    )
    error = unreadable(
        DeltaUpstream(name="up", path="/lake/up"), "CDF [1, 1]", RuntimeError(spark_text)
    )
    text = str(error)
    assert "An error occurred while calling" not in text
    assert "org.apache" not in text
    assert "missing file: file:/lake/up/_change_data/cdc-00000-d9.c000.snappy.parquet." in text
    assert "Spark: [FAILED_READ_FILE.FILE_NOT_EXIST]" in text
    assert RESET in text


# ------------------------------------------------------------------ the actor


def test_set_records_the_os_account_when_user_is_unset(tmp_path: Path, dagster_home: Path) -> None:
    lake = up_copy_lake(tmp_path, dagster_home)
    store = lake.store
    batch, _ = store.create_batch([UpstreamPosition("up", 2, None)], {"up_copy": ["up"]}, actor="t")
    assert batch is not None
    _advance_all(store, batch)
    spec_file = write_spec(tmp_path / "spec.json", lake.spec)
    env = {k: v for k, v in os.environ.items() if k not in ("USER", "LOGNAME", "USERNAME", "LNAME")}
    env.update({"PYTHONPATH": location_path(spec_file), "DAGSTER_HOME": str(dagster_home)})
    out = subprocess.run(
        [
            str(SCRIPT),
            "set",
            "-t",
            "up",
            "--version",
            "1",
            "--yes",
            "--defs",
            location_defs(spec_file),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # no controlling terminal, as under cron
    )
    assert out.returncode == 0, out.stderr
    account = pwd.getpwuid(os.getuid()).pw_name
    actor = f"{account}@{socket.gethostname()}"
    assert f"by {actor}" in out.stdout
    assert store.history(upstream="up")[-1]["actor"] == actor


# ------------------------------------------------------------------ run --once
