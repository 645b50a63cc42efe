"""Database upstreams against real servers: Debian's PostgreSQL and MariaDB, one server per
database for the module, each test on its own table, with real Spark, Delta and Dagster.

The chain is the one docs/database-upstreams.md sets up: the database table, extracted by
its extraction stage into a Delta table (``orders_db_lake``), which a downstream pipeline
copies. After every batch each target equals a full read of the source table.
"""

import json
import os
import signal
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from tests.support.databases import SERVERS, Database
from tests.support.lakes import defs_from, registry_from
from tests.support.spark_lake import Lake, batch_metadata, open_lake
from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.core.faults import ENV as FAULTS_ENV
from watermark_dagster.core.ranges import CursorWindow, ReadMode, VersionRange
from watermark_dagster.core.records import BatchStatus, CheckpointStatus
from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
from watermark_dagster.observe.log import latest_local_version
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.read.cursor import pin_end, read_source, window_rows

pytestmark = pytest.mark.spark

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TABLE = "orders"


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request: pytest.FixtureRequest) -> Iterator[Database]:
    with SERVERS[request.param]() as database:
        yield database


@pytest.fixture
def shop(server: Database, monkeypatch: pytest.MonkeyPatch) -> Database:
    """``orders`` created afresh, indexed on its position; credentials in the environment."""
    server.sql(
        f"DROP TABLE IF EXISTS {TABLE}; "
        f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, value bigint, "
        f"updated_at {server.timestamp_type} NOT NULL, deleted boolean NOT NULL DEFAULT false); "
        f"CREATE INDEX orders_position ON {TABLE} (updated_at, id)"
    )
    monkeypatch.setenv("SHOP_USER", "watermark")
    monkeypatch.setenv("SHOP_PASSWORD", server.password)
    return server


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


def _at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%d %H:%M:%S.%f")


def _upsert(db: Database, rows: list[tuple[int, int, float]]) -> None:
    """Insert or update (id, value, minutes after T0) rows."""
    for i, value, minutes in rows:
        db.sql(f"DELETE FROM {TABLE} WHERE id = {i}")
        db.sql(
            f"INSERT INTO {TABLE} (id, value, updated_at) VALUES ({i}, {value}, '{_at(minutes)}')"
        )


def _live(db: Database) -> dict[int, int]:
    """A full read of the source: id -> value of the rows not flagged deleted."""
    rows = db.sql(f"SELECT id, value FROM {TABLE} WHERE NOT deleted")
    return {int(i): int(v) for i, v in rows}


def _upstream(db: Database, **settings: Any) -> dict[str, Any]:
    return {
        "name": "orders_db",
        "kind": "database",
        "url": db.url,
        "source_table": f"{db.schema}.{TABLE}",
        "cursor": "updated_at",
        "tie_break": ["id"],
        "user": {"env": "SHOP_USER"},
        "password": {"env": "SHOP_PASSWORD"},
        "soft_delete": "deleted",
        "fetch_size": 2,
        **settings,
    }


def _spec(lake: Lake, db: Database, **settings: Any) -> dict[str, Any]:
    pipes = [
        {"stage": "orders_db", "target": lake.path("orders"), "keys": ["id"]},
        {
            "name": "orders_copy",
            "upstreams": ["orders_db_lake"],
            "target": lake.path("copy"),
            "transform": "copy",
        },
    ]
    return lake.spec([_upstream(db, **settings)], pipes)


def _run(
    lake: Lake, spec: dict[str, Any], batches: int | None = None, **kwargs: Any
) -> CycleReport:
    """Batches until idle (or ``batches`` of them): the first extracts, the next carries
    the lake's new version downstream; a look plans nothing once the table's greatest
    position is the one committed."""
    return HeadlessRunner(defs_from(spec), lake.instance).run_until_idle(
        max_batches=batches, **kwargs
    )


def _one_database_is_enough(db: Database) -> None:
    """Failures and crashes are the stages' own, the same for every database: they run on
    PostgreSQL only, which keeps the module's time small."""
    if db.kind != "postgresql":
        pytest.skip("run on PostgreSQL only: the stages fail and recover alike on any database")


def _assert_chain(lake: Lake, db: Database) -> None:
    expected = _live(db)
    assert lake.rows("orders") == expected
    assert lake.rows("copy") == expected


def test_the_chain_follows_the_table_exactly_once(lake: Lake, shop: Database) -> None:
    db = shop
    spec = _spec(lake, db, reconcile_every=1, partitions=2)
    # First load; ids 4 and 5 share the cursor value the first window ends at.
    _upsert(db, [(1, 10, 1), (2, 20, 2), (3, 30, 3), (4, 40, 5), (5, 50, 5)])
    [b1] = _run(lake, spec, batches=1).completed
    assert lake.rows("orders") == _live(db)
    assert batch_metadata(lake, "orders_db_extract", b1)["orders_db/rows_read"] == 5
    first = lake.store.get_batch(b1).inputs["orders_db"].window
    assert first is not None
    assert first.end == (int((T0 + timedelta(minutes=5)).timestamp() * 1_000_000), 5)

    # In one window: an update, an insert sharing the boundary's cursor value with a
    # greater key (only the tie-break puts it here), a soft delete and a hard delete (found
    # by the reconciliation, every batch here), and a late row committed below the
    # committed position, which no window holds (the documented limit: lag_seconds covers
    # slow writers; touching the row brings it in).
    _upsert(db, [(1, 11, 6), (6, 60, 5), (8, 80, 4)])
    db.sql(f"UPDATE {TABLE} SET deleted = true, updated_at = '{_at(7)}' WHERE id = 2")
    db.sql(f"DELETE FROM {TABLE} WHERE id = 3")
    [b2] = _run(lake, spec, batches=1).completed
    assert batch_metadata(lake, "orders_db_extract", b2)["orders_db/rows_read"] == 3
    assert lake.rows("orders") == {k: v for k, v in _live(db).items() if k != 8}
    second = latest_local_version(lake.path("orders"))
    db.sql(f"UPDATE {TABLE} SET updated_at = '{_at(9)}' WHERE id = 8")
    _run(lake, spec)
    _assert_chain(lake, db)

    # Nothing changed: the look at the table (one indexed query, no JVM) plans nothing.
    idle = _run(lake, spec)
    assert (idle.completed, idle.runs) == ([], []), idle

    # `watermark list` shows each stage: its watermark, state and the last batch's rows.
    out = lake.cli(spec, "list", "--json")
    assert out.returncode == 0, out.stderr
    listed = {r["upstream"]: r for r in json.loads(out.stdout)}
    assert listed["orders_db"]["committed"][1] is not None
    assert listed["orders_db_lake"]["committed"] == listed["orders_db_lake"]["latest"]
    assert {r["state"] for r in listed.values()} == {"ok"}
    assert set(listed["orders_db"]["rows"]) == {"orders_db_extract"}
    assert set(listed["orders_db_lake"]["rows"]) == {"orders_copy"}

    # The database keeps no history: an old window is replayed from the lake stage, whose
    # versions are what the extraction wrote. A version-guarded replay of an old range
    # into the downstream target leaves the newer rows.
    registry = registry_from(spec)
    before = lake.rows("copy")
    replay = lake.store.create_range_replay(
        "orders_db_lake",
        VersionRange(second, second),
        mode=ReadMode.CDF,
        pipelines=["orders_copy"],
        all_upstreams=["orders_db_lake"],
        actor="test",
        reason="replay of an old window",
    )
    outcome = execute_pipeline(
        spark=lake.spark,
        store=lake.store,
        registry=registry,
        pipeline_name="orders_copy",
        batch_id=replay.batch_id,
    )
    assert outcome.rows_read > 0
    assert lake.rows("copy") == before
    # Read again from the database, the first window holds only the rows still in it.
    upstream = registry.upstreams["orders_db"]
    assert isinstance(upstream, DatabaseUpstream)
    again = window_rows(lake.spark, upstream, first).select("id").collect()
    assert sorted(r["id"] for r in again) == [4, 5]

    # Credentials are nowhere in Dagster's storage (runs, event log, plans) nor the
    # control tables.
    password = db.password.encode()
    for folder in (Path(os.environ["DAGSTER_HOME"]), lake.root):
        for path in folder.rglob("*"):
            if path.is_file():
                assert password not in path.read_bytes(), path


def test_a_failed_stage_leaves_its_neighbours_and_its_retry_resumes(
    lake: Lake, shop: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = shop
    _one_database_is_enough(db)
    # The extraction reads as a role of its own, which can be given less than all columns.
    monkeypatch.setenv("SHOP_USER", "extractor")
    db.sql(
        f"DROP ROLE IF EXISTS extractor; CREATE ROLE extractor LOGIN PASSWORD '{db.password}'; "
        f"GRANT SELECT ON {TABLE} TO extractor"
    )
    spec = _spec(lake, db)
    _upsert(db, [(1, 10, 1), (2, 20, 2)])
    _run(lake, spec, batches=1)
    assert lake.rows("orders") == _live(db)
    committed = lake.store.committed()
    written = latest_local_version(lake.path("orders"))

    # The extraction fails (its role may read the position columns only, so the look plans
    # the batch and the read is refused): the database's watermark stays where it was and
    # the lake stage gets no new version; the downstream pipeline applies what the lake
    # stage held before (its own stage, committed on its own).
    _upsert(db, [(3, 30, 3)])
    db.sql(
        f"REVOKE SELECT ON {TABLE} FROM extractor; "
        f"GRANT SELECT (id, updated_at) ON {TABLE} TO extractor"
    )
    report = _run(lake, spec, batches=1)
    assert not all(r.success for r in report.runs)
    failed = lake.store.open_batch()
    assert failed is not None
    assert lake.store.committed()["orders_db"] == committed["orders_db"]
    assert latest_local_version(lake.path("orders")) == written
    assert lake.rows("orders") == {1: 10, 2: 20}
    assert lake.rows("copy") == {1: 10, 2: 20}

    # Fixed, the retry runs the same batch. Its window was never pinned (the attempt
    # failed before reading), so the retry pins it, and a row committed meanwhile is in it.
    db.sql(f"GRANT SELECT ON {TABLE} TO extractor")
    _upsert(db, [(4, 40, 4)])
    report = _run(lake, spec, retry=True)
    assert report.completed[0] == failed.batch_id
    _assert_chain(lake, db)


def _plan(spark: SparkSession, make: Callable[[], DataFrame]) -> str:
    """The physical plan of the frame ``make`` builds, its scan's pushed filters whole."""
    spark.conf.set("spark.sql.maxMetadataStringLength", "100000")
    try:
        return make()._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.conf.unset("spark.sql.maxMetadataStringLength")


def test_windows_are_filtered_and_pinned_in_the_database(lake: Lake, shop: Database) -> None:
    """The window's bounds, tie-break included, are pushed to the database as its query's
    WHERE (an index on (updated_at, id) serves it); the end is pinned by the database."""
    db = shop
    _upsert(db, [(i, i * 10, i // 2) for i in range(1, 9)])
    upstream = registry_from(_spec(lake, db)).upstreams["orders_db"]
    assert isinstance(upstream, DatabaseUpstream)
    micros = int((T0 + timedelta(minutes=1)).timestamp() * 1_000_000)
    end = int((T0 + timedelta(minutes=3)).timestamp() * 1_000_000)
    window = CursorWindow((micros, 2), (end, 6))
    rows = window_rows(lake.spark, upstream, window)
    assert sorted(r["id"] for r in rows.collect()) == [3, 4, 5, 6]
    plan = _plan(lake.spark, lambda: window_rows(lake.spark, upstream, window))
    pushed = plan.split("PushedFilters: [", 1)[1].split("]", 1)[0]
    assert "GreaterThan(updated_at," in pushed, plan
    assert "EqualTo(updated_at," in pushed, plan
    assert "GreaterThan(id,2)" in pushed, plan
    assert "LessThan(id,6)" in pushed or "LessThanOrEqual(id,6)" in pushed, plan
    # Every comparison reached the database (marked * : no Filter above the scan).
    assert pushed.startswith("*IsNotNull(updated_at), *IsNotNull(id), *Or("), plan

    # The end is pinned by the database itself (the order that filters the window, and no
    # Spark job): the greatest position after the start.
    later = T0 + timedelta(days=1)
    pinned = pin_end(read_source(lake.spark, upstream), upstream, CursorWindow(window.start), later)
    assert pinned.end == (int((T0 + timedelta(minutes=4)).timestamp() * 1_000_000), 8)


@pytest.mark.parametrize("point", ["after_target_commit"])
def test_an_extraction_killed_between_its_write_and_its_checkpoint_recovers(
    lake: Lake, shop: Database, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL in a child process right after the extraction's target commit, before its
    checkpoint: the next cycle finds the commit that carries the batch's rows and finishes
    without a second data commit; the target equals the source."""
    db = shop
    _one_database_is_enough(db)
    spec = _spec(lake, db)
    _upsert(db, [(1, 10, 1), (2, 20, 2)])
    _run(lake, spec)
    _upsert(db, [(2, 21, 3), (3, 30, 4)])
    monkeypatch.setenv(FAULTS_ENV, f"{point}@orders_db_extract")
    out = lake.cli(spec, "run", "--once", process=True)
    monkeypatch.delenv(FAULTS_ENV)
    # The command's run worker was killed; the command says so and exits 128 + 9.
    assert out.returncode == 128 + signal.SIGKILL, out.stderr[-2000:]
    assert "killed by SIGKILL" in out.stderr
    killed = lake.store.open_batch()
    assert killed is not None
    assert [c.status for c in lake.store.checkpoints(batch_id=killed.batch_id)] == [
        CheckpointStatus.RUNNING
    ]
    _run(lake, spec, batches=3)
    assert lake.store.get_batch(killed.batch_id).status is BatchStatus.COMPLETED
    _assert_chain(lake, db)
    history = lake.spark.sql(f"DESCRIBE HISTORY delta.`{lake.path('orders')}`").collect()
    data_commits = [h for h in history if h["operation"] in ("MERGE", "WRITE")]
    assert len(data_commits) == 2  # the first load and the killed batch's merge, once


def _said(out: Any) -> str:
    """What a command printed, both streams, on one line per line."""
    return f"{out.stdout}\n{out.stderr}"


def test_rows_without_a_cursor_are_counted_and_block_until_told_how_to_treat_them(
    lake: Lake, shop: Database
) -> None:
    """Rows whose cursor is NULL are in no window. By default (``null_cursor: fail``) the
    upstream is blocked while any exist, naming the table, the count, the column and the
    fix, and nothing is written; with ``null_cursor: skip`` they are counted and shown
    (``watermark list``, the materialization) and nothing is loaded for them."""
    db = shop
    _one_database_is_enough(db)
    db.sql(f"ALTER TABLE {TABLE} ALTER COLUMN updated_at DROP NOT NULL")
    _upsert(db, [(1, 10, 1), (2, 20, 2)])
    db.sql(f"INSERT INTO {TABLE} (id, value, updated_at) VALUES (3, 30, NULL), (4, 40, NULL)")
    spec = _spec(lake, db)
    out = lake.cli(spec, "run")
    assert out.returncode != 0, _said(out)
    said = " ".join(_said(out).split())
    for words in (f"{db.schema}.{TABLE}", "2 row(s)", "updated_at", "null_cursor: skip"):
        assert words in said, said
    assert not Path(lake.path("orders")).exists()
    assert lake.store.committed().get("orders_db") is None
    listed = " ".join(_said(lake.cli(spec, "list")).split())
    assert "2 row(s)" in listed, listed
    assert "updated_at" in listed, listed

    spec = _spec(lake, db, null_cursor="skip")
    out = lake.cli(spec, "run")
    assert out.returncode == 0, _said(out)
    assert lake.rows("orders") == {1: 10, 2: 20}
    assert lake.rows("copy") == {1: 10, 2: 20}
    batch_id = lake.store.committed()["orders_db"].batch_id
    assert batch_id is not None
    meta = batch_metadata(lake, "orders_db_extract", batch_id)
    assert meta["orders_db/rows_without_cursor"] == 2, meta
    listed = json.loads(lake.cli(spec, "list", "--json").stdout)
    [row] = [r for r in listed if r["upstream"] == "orders_db"]
    assert row["rows_without_cursor"] == 2, row
    assert row["state"] == "ok", row
    shown = " ".join(_said(lake.cli(spec, "get", "-t", "orders_db")).split())
    assert "2 row(s)" in shown, shown
    # Given a cursor value, they load.
    db.sql(f"UPDATE {TABLE} SET updated_at = '{_at(5)}' WHERE updated_at IS NULL")
    assert lake.cli(spec, "run").returncode == 0
    _assert_chain(lake, db)


def test_a_renamed_dropped_or_retyped_source_column_blocks_the_upstream(
    lake: Lake, shop: Database
) -> None:
    """The table's columns are fingerprinted with each batch: a new column passes; a
    rename, a drop or a type change fails the batch before anything is written, naming the
    column and the fix (reset reloads the table as it now is)."""
    db = shop
    _one_database_is_enough(db)
    spec = _spec(lake, db)
    _upsert(db, [(1, 10, 1), (2, 20, 2)])
    assert lake.cli(spec, "run").returncode == 0
    db.sql(f"ALTER TABLE {TABLE} ADD COLUMN note text")
    _upsert(db, [(3, 30, 3)])
    out = lake.cli(spec, "run")
    assert out.returncode == 0, _said(out)
    _assert_chain(lake, db)

    written = latest_local_version(lake.path("orders"))
    for minutes, (change, column) in enumerate(
        (
            ("RENAME COLUMN value TO amount", "value"),
            ("ALTER COLUMN value TYPE numeric(12, 2)", "value"),
            ("DROP COLUMN note", "note"),
        ),
        start=9,
    ):
        db.sql(f"ALTER TABLE {TABLE} {change}")
        db.sql(f"UPDATE {TABLE} SET updated_at = '{_at(minutes)}' WHERE id = 1")
        out = lake.cli(spec, "run")
        said = " ".join(_said(out).split())
        assert out.returncode != 0, said
        assert f"'{column}'" in said, said
        assert "watermark reset -t orders_db" in said, said
        assert latest_local_version(lake.path("orders")) == written
        # Undone, the upstream reads on.
        undo = {
            "value": "RENAME COLUMN amount TO value"
            if "RENAME" in change
            else "ALTER COLUMN value TYPE bigint",
            "note": "ADD COLUMN note text",
        }[column]
        db.sql(f"ALTER TABLE {TABLE} {undo}")
        out = lake.cli(spec, "run", "--retry")
        assert out.returncode == 0, _said(out)
        _assert_chain(lake, db)
        written = latest_local_version(lake.path("orders"))


def test_a_refused_password_reads_as_a_sentence_never_the_drivers_fields(
    shop: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look's error is the server's own sentence (PostgreSQL: severity, SQLSTATE and
    message), never the driver's raw mapping and never the password."""
    from watermark_dagster.config.upstream_kinds import declare_upstream
    from watermark_dagster.errors import UpstreamUnavailableError
    from watermark_dagster.observe.observer import Observer

    db = shop
    settings = {k: v for k, v in _upstream(db).items() if k != "fetch_size"}
    upstream = declare_upstream(**settings)
    monkeypatch.setenv("SHOP_PASSWORD", "wr0ng-Pa55word")
    with pytest.raises(UpstreamUnavailableError) as refused:
        Observer().observe(upstream)
    text = str(refused.value)
    assert "wr0ng-Pa55word" not in text
    assert db.password not in text
    assert "{'S'" not in text, text
    assert "'C':" not in text, text
    if db.kind == "postgresql":
        # The user is masked like the password (both come from credential variables).
        assert 'FATAL 28P01: password authentication failed for user "***"' in text, text
    else:
        assert "1045: Access denied for user '***'" in text, text
