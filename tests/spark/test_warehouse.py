"""A warehouse target against a real PostgreSQL (Debian's, started for the module): the
seeds' last stage, database -> lake -> warehouse, through the real sensors, with real
Spark, Delta and Dagster.

The chain: ``orders`` in the database, extracted by its extraction stage into a Delta
table (``orders_db_lake``), which ``orders_wh`` loads into ``wh.orders`` in the same
server. After every batch the warehouse table equals a full read of the lake table (a
recompute), and its state row names the batch that loaded it.
"""

import json
import signal
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetCheckKey, AssetKey
from pyspark.sql import SparkSession

from tests.support.databases import Database, postgres
from tests.support.lakes import defs_from, registry_from
from tests.support.ports import free_port
from tests.support.spark_lake import Lake, batch_metadata, open_lake
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.secrets import EnvRef
from watermark_dagster.config.warehouse import PostgresTarget
from watermark_dagster.core.faults import ENV as FAULTS_ENV
from watermark_dagster.core.observations import TargetState
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.core.records import BatchKind, BatchStatus, CheckpointStatus, TargetMark
from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
from watermark_dagster.errors import (
    BatchStateError,
    ConfigurationError,
    RetryableError,
    TargetBoundElsewhereError,
    TerminalError,
)
from watermark_dagster.observe import database_state
from watermark_dagster.observe import warehouse_sql as sql
from watermark_dagster.observe.log import latest_local_version
from watermark_dagster.observe.warehouse_state import (
    LOAD_SECONDS,
    WarehouseLooks,
    connected,
    read_state,
)
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.operations.verify import verify_pipeline
from watermark_dagster.write.warehouse import write_warehouse
from watermark_dagster.write.warehouse_fences import (
    fence_warehouse,
    stage_name,
    warehouse_evidence,
)

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
    """Id -> value of the warehouse table, failing on a duplicated id."""
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


def _state(spec: dict[str, Any]) -> Any:
    target = registry_from(spec).pipelines["orders_wh"].warehouse
    assert target is not None
    return read_state(target, "orders_wh")


class _Kept:
    """The test's session for ``verify_pipeline``, which stops its own session when done."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def __getattr__(self, name: str) -> Any:
        return getattr(self.spark, name)

    def stop(self) -> None:
        pass


def _verify(lake: Lake, spec: dict[str, Any]) -> Any:
    """``watermark verify -p orders_wh``'s operation, on the test's session."""
    return verify_pipeline(
        lake.store, registry_from(spec), "orders_wh", open_spark=lambda: _Kept(lake.spark)
    )


def _newest_done(lake: Lake) -> str:
    done = [b for b in lake.store.batches() if b.status is BatchStatus.COMPLETED]
    return max(done, key=lambda b: b.seq).batch_id


def test_the_chain_loads_the_warehouse_exactly_once(lake: Lake, db: Database) -> None:
    spec = _spec(lake, db)
    _upsert(db, [(1, 10, 1), (2, 20, 2), (3, 30, 3)])
    _run(lake, spec)
    _assert_loaded(lake, db)
    state = _state(spec)
    assert state is not None
    assert not state.fenced
    assert state.batch_id == _newest_done(lake)
    # The table the first load created: the output's columns, the position and batch
    # columns, and a primary key on the keys.
    columns = db.sql(
        "SELECT column_name, data_type FROM information_schema.columns WHERE "
        "table_schema = 'wh' AND table_name = 'orders' ORDER BY ordinal_position"
    )
    assert [c for c, _ in columns] == [
        "id",
        "value",
        "updated_at",
        "deleted",
        "_wm_seq",
        "_wm_batch_id",
    ]
    assert db.sql(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND "
        "a.attnum = ANY(i.indkey) WHERE i.indrelid = 'wh.orders'::regclass AND i.indisprimary"
    ) == [["id"]]

    # Updates, inserts, a soft delete and a hard delete, over several batches.
    _upsert(db, [(1, 11, 4), (4, 40, 5)])
    db.sql(f"UPDATE {SOURCE} SET deleted = true, updated_at = '{_at(6)}' WHERE id = 2")
    _run(lake, spec)
    _assert_loaded(lake, db)
    _upsert(db, [(5, 50, 7), (3, 33, 8)])
    _run(lake, spec)
    _assert_loaded(lake, db)
    state = _state(spec)
    assert state.batch_id == _newest_done(lake)
    meta = batch_metadata(lake, "orders_wh", state.batch_id)
    assert meta["rows_written"] == 2
    assert meta["target_version"] == state.position
    assert (state.rows_inserted, state.rows_updated, state.rows_deleted) == (1, 1, 0)

    # `watermark list` and `get` show the warehouse stage from its own state row; verify
    # compares its rows with a recompute from the lake.
    out = lake.cli(spec, "list", "--json")
    assert out.returncode == 0, out.stderr
    [row] = [r for r in json.loads(out.stdout) if r["upstream"] == "orders_db_lake"]
    [loaded] = row["warehouse"]
    assert (loaded["state"], loaded["batch_id"], loaded["table"]) == (
        "loaded",
        state.batch_id,
        WAREHOUSE,
    )
    lake_version = latest_local_version(lake.path("orders"))
    assert loaded["loaded_versions"] == {"orders_db_lake": lake_version}
    out = lake.cli(spec, "list")
    assert f"orders_wh: loaded {state.batch_id}" in out.stdout, out.stdout
    out = lake.cli(spec, "get", "-t", "orders_db_lake")
    assert "warehouse orders_wh" in out.stdout, out.stdout
    assert f"wh.orders: loaded {state.batch_id}" in out.stdout
    verified = _verify(lake, spec)
    assert verified.equal, verified
    assert verified.comparison.target_rows == len(lake.rows("orders"))

    # The warehouse lag check, run as the UI runs it: the warehouse holds the lake's newest.
    check = AssetCheckKey(AssetKey("orders_wh"), "watermark_warehouse_lag")
    assert HeadlessRunner(defs_from(spec), lake.instance).evaluate_checks([check], {})
    executions = lake.instance.event_log_storage.get_latest_asset_check_execution_by_key([check])
    evaluation = executions[check].evaluation
    assert evaluation is not None
    assert evaluation.passed, evaluation.description
    assert evaluation.metadata["orders_db_lake/loaded_version"].value == lake_version

    # A replay of an old range of the lake stage re-reads it through the warehouse load,
    # version-guarded: the newer rows stay.
    before = _warehouse(db)
    replay = lake.store.create_range_replay(
        "orders_db_lake",
        VersionRange(1, 1),
        mode=ReadMode.CDF,
        pipelines=["orders_wh"],
        all_upstreams=["orders_db_lake"],
        actor="test",
        reason="replay of an old lake range",
    )
    outcome = execute_pipeline(
        spark=lake.spark,
        store=lake.store,
        registry=registry_from(spec),
        pipeline_name="orders_wh",
        batch_id=replay.batch_id,
    )
    assert outcome.rows_read > 0
    assert _warehouse(db) == before
    assert _state(spec).last_batch_id == replay.batch_id
    assert _state(spec).position == state.position  # a replay does not move the position

    # A backfill of the first batch's partition by hand replays it; nothing regresses.
    job = HeadlessRunner(defs_from(spec), lake.instance).defs.resolve_job_def("watermark_batch_job")
    loads = [
        b
        for b in lake.store.batches()
        if "orders_wh" in b.pipelines and "orders_wh" not in b.full_load
    ]
    first = min(loads, key=lambda b: b.seq).batch_id
    done = job.execute_in_process(
        instance=lake.instance, partition_key=first, asset_selection=[AssetKey("orders_wh")]
    )
    assert done.success
    assert [b for b in lake.store.batches() if b.kind is BatchKind.REPLAY][-1].order_seq
    assert _warehouse(db) == before

    # Another batch after the replays: loaded as usual, equal to a recompute.
    _upsert(db, [(6, 60, 9)])
    db.sql(f"DELETE FROM {SOURCE} WHERE id = 4")  # a hard delete: not seen without reconcile
    db.sql(f"UPDATE {SOURCE} SET deleted = true, updated_at = '{_at(10)}' WHERE id = 1")
    _run(lake, spec)
    assert _warehouse(db) == lake.rows("orders")
    assert _state(spec).batch_id == _newest_done(lake)

    # A row changed behind the pipeline's back: verify says the warehouse differs.
    db.sql("UPDATE wh.orders SET value = -1 WHERE id = 3")
    assert not _verify(lake, spec).equal

    # The password is in no record Dagster keeps, no file of the lake, no log.
    logs = [str(e) for r in lake.instance.get_runs() for e in lake.instance.all_logs(r.run_id)]
    assert logs
    assert not [line for line in logs if db.password in line]
    for path in Path(lake.root).rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            assert db.password.encode() not in path.read_bytes(), path


@pytest.mark.parametrize(
    "point", ["after_warehouse_stage", "before_warehouse_commit", "after_target_commit"]
)
def test_a_load_killed_at_each_point_is_applied_once(
    lake: Lake, db: Database, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL of a real run process: with the rows staged, inside the open transaction,
    and right after the commit before the checkpoint. The next cycle applies the batch
    exactly once: the table equals a recompute, its state row names the batch, and (after
    the commit) nothing is staged or applied again."""
    spec = _spec(lake, db)
    _upsert(db, [(1, 10, 1), (2, 20, 2)])
    _run(lake, spec)
    _upsert(db, [(2, 21, 3), (3, 30, 4)])
    _run(lake, spec, batches=1)  # the extraction's batch; the load is the next one
    monkeypatch.setenv(FAULTS_ENV, f"{point}@orders_wh")
    out = lake.cli(spec, "run", "--once", process=True)
    monkeypatch.delenv(FAULTS_ENV)
    assert out.returncode == 128 + signal.SIGKILL, out.stdout[-2000:] + out.stderr[-2000:]
    killed = lake.store.open_batch()
    assert killed is not None
    assert [c.status for c in lake.store.checkpoints(batch_id=killed.batch_id)] == [
        CheckpointStatus.RUNNING
    ]
    state = _state(spec)
    committed = point == "after_target_commit"
    assert (state.batch_id == killed.batch_id) is committed
    assert (_warehouse(db) == lake.rows("orders")) is committed
    _run(lake, spec)
    assert lake.store.get_batch(killed.batch_id).status is BatchStatus.COMPLETED
    _assert_loaded(lake, db)
    after = _state(spec)
    assert after.batch_id == killed.batch_id
    if committed:
        # Found applied by its state row: not loaded a second time.
        assert after.loaded_at == state.loaded_at
    # No staging table is left behind.
    assert not db.sql("SELECT relname FROM pg_class WHERE relname LIKE 'wm_stage_%'")


def _pipeline(db: Database, **target: Any) -> Pipeline:
    return Pipeline(
        name="orders_wh",
        upstreams=("orders",),
        warehouse=PostgresTarget(
            url=target.pop("url", db.url),
            table=WAREHOUSE,
            user=EnvRef("WH_USER"),
            password=EnvRef("WH_PASSWORD"),
            **target,
        ),
        keys=("id",),
        transform=lambda batch: batch["orders"].changes,
    )


def _load(spark: SparkSession, pipeline: Pipeline, rows: list[tuple], seq: int, **kw: Any) -> Any:
    frame = spark.createDataFrame(rows, "id long, value long")
    return write_warehouse(
        spark,
        frame,
        pipeline,
        batch_id=f"b{seq:06d}",
        write_seq=seq,
        full_load=False,
        root=kw.pop("root", "root-a"),
        **kw,
    )


def _nothing_written(db: Database) -> None:
    """No staging table left, and the warehouse table (if any) empty."""
    assert not db.sql("SELECT relname FROM pg_class WHERE relname LIKE 'wm_stage_%'")
    exists = db.sql("SELECT 1 FROM pg_tables WHERE schemaname = 'wh' AND tablename = 'orders'")
    assert not exists or db.sql("SELECT count(*) FROM wh.orders") == [["0"]]


@pytest.mark.parametrize("load", ["copy", "jdbc"])
def test_both_loads_apply_the_same_changes_once(
    spark: SparkSession, db: Database, load: str
) -> None:
    """COPY from the driver and Spark's JDBC writer stage the same rows; a retry of a
    committed batch changes nothing; an older batch does not overwrite a newer one's rows
    (the ``_wm_seq`` guard) and a replay inserts no key the table lacks."""
    pipeline = _pipeline(db, load=load)
    first = _load(spark, pipeline, [(1, 10), (2, 20), (3, 30)], 1)
    assert (first.rows_inserted, first.created) == (3, True)
    again = _load(spark, pipeline, [(1, 10), (2, 20), (3, 30)], 1, retried=True)
    assert again.already_applied
    rows = spark.createDataFrame(
        [(2, 21, "upsert"), (3, None, "delete"), (4, 40, "upsert")],
        "id long, value long, _change_type string",
    )
    second = write_warehouse(
        spark, rows, pipeline, batch_id="b000002", write_seq=2, full_load=False, root="root-a"
    )
    assert (second.rows_inserted, second.rows_updated, second.rows_deleted) == (1, 1, 1)
    assert _warehouse(db) == {1: 10, 2: 21, 4: 40}
    # A replay of batch 1's position: rows batch 2 wrote stay, no deleted key returns.
    replay = _load(spark, pipeline, [(2, 99), (3, 99), (1, 11)], 1, replay=True)
    assert (replay.rows_inserted, replay.rows_updated) == (0, 1)
    assert _warehouse(db) == {1: 11, 2: 21, 4: 40}
    state = read_state(pipeline.warehouse, "orders_wh")  # type: ignore[arg-type]
    assert (state.position, state.batch_id, state.last_batch_id) == (2, "b000002", "b000001")
    # The coordinator's recovery reads the same row; a position the row held already when
    # the batch's first attempt began is an earlier life's (a restored root issues batch ids
    # again), never this batch's load.
    assert warehouse_evidence(pipeline, "b000002", 2, "root-a") is not None
    assert warehouse_evidence(pipeline, "b000002", 2, "root-a", first=TargetMark(2, 2)) is None
    assert warehouse_evidence(pipeline, "b000002", 2, "root-b") is None


def test_refusals_name_the_cause_and_write_nothing(
    spark: SparkSession, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = _pipeline(db)
    # A key column holding NULL.
    with pytest.raises(TerminalError, match=r"key \{'id': None\} is NULL"):
        _load(spark, pipeline, [(1, 10), (None, 20)], 1)
    _nothing_written(db)
    assert read_state(pipeline.warehouse, "orders_wh") is None  # type: ignore[arg-type]
    # Several rows of one key and no _commit_version.
    with pytest.raises(TerminalError, match="several rows for key"):
        _load(spark, pipeline, [(1, 10), (1, 11)], 1)
    _nothing_written(db)
    # A table whose columns do not match the output: named, with the fix.
    db.sql("DROP TABLE wh.orders; CREATE TABLE wh.orders (id bigint PRIMARY KEY, value text)")
    with pytest.raises(TerminalError) as refused:
        _load(spark, pipeline, [(1, 10)], 1)
    text = str(refused.value)
    assert "value is text, the output's is bigint" in text
    assert "_wm_seq (bigint) is missing" in text
    assert "ALTER TABLE wh.orders ADD COLUMN _wm_seq bigint" in text
    _nothing_written(db)
    # Keys without a primary key or unique index: a merge's upserts need one.
    db.sql(
        "DROP TABLE wh.orders; CREATE TABLE wh.orders (id bigint, value bigint, "
        "_wm_seq bigint NOT NULL, _wm_batch_id text)"
    )
    with pytest.raises(TerminalError, match=r"ADD PRIMARY KEY \(id\)"):
        _load(spark, pipeline, [(1, 10)], 1)
    _nothing_written(db)
    # Rows the state table records no load of: another load's, never taken over.
    db.sql(
        "ALTER TABLE wh.orders ADD PRIMARY KEY (id); INSERT INTO wh.orders VALUES (7, 70, 5, 'x')"
    )
    with pytest.raises(TargetBoundElsewhereError, match="records no load"):
        _load(spark, pipeline, [(1, 10)], 1)
    assert _warehouse(db) == {7: 70}
    db.sql("DROP SCHEMA wh CASCADE")

    # A load of another control root's table: refused before anything is staged.
    _load(spark, pipeline, [(1, 10)], 1)
    with pytest.raises(TargetBoundElsewhereError, match="control root root-a"):
        _load(spark, pipeline, [(2, 20)], 2, root="root-b")
    # This root ahead of the batch (restored from an older copy): refused.
    with pytest.raises(TargetBoundElsewhereError, match="earlier life"):
        _load(spark, pipeline, [(2, 20)], 1)
    # A forced change's fence: the fenced batch's late load does not land.
    fence = fence_warehouse(pipeline, "b000002", 2, "root-a")
    assert (fence.fenced, fence.new) == (2, True)
    with pytest.raises(BatchStateError, match="fenced"):
        _load(spark, pipeline, [(2, 20)], 2, retried=True)
    assert _warehouse(db) == {1: 10}
    assert _load(spark, pipeline, [(3, 30)], 3).rows_inserted == 1  # the next batch loads

    # A wrong password: refused, naming the variable, not the value; an unreachable
    # server: retryable. Neither shows the password.
    monkeypatch.setenv("WH_PASSWORD", "not-the-password")
    with pytest.raises(ConfigurationError, match=r"refused the credentials") as wrong:
        _load(spark, pipeline, [(4, 40)], 4)
    assert "$WH_PASSWORD" in str(wrong.value)
    assert "not-the-password" not in str(wrong.value)
    monkeypatch.setenv("WH_PASSWORD", db.password)
    closed = _pipeline(db, url=f"jdbc:postgresql://127.0.0.1:{free_port()}/shop")
    with pytest.raises(RetryableError, match="did not answer") as down:
        _load(spark, closed, [(4, 40)], 4)
    assert db.password not in str(down.value)
    assert _warehouse(db) == {1: 10, 3: 30}

    # The table dropped behind the pipeline's back while its state row records loads: a
    # batch of changes alone would lose every earlier row. Refused, and no empty table is
    # left to pass for a loaded one (the next plan's first-load rule sees it missing).
    db.sql("DROP TABLE wh.orders")
    with pytest.raises(TerminalError, match="is gone") as gone:
        _load(spark, pipeline, [(4, 40)], 4)
    assert "reset" in str(gone.value)
    assert not db.sql("SELECT 1 FROM pg_tables WHERE schemaname = 'wh' AND tablename = 'orders'")


def test_a_load_s_statements_outlive_the_connect_timeout(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pg8000 keeps its connect timeout as the socket's for every read: a load's upsert of
    a million rows took longer than it (benchmarks/warehouse.py). A load's connection gives
    each statement ``LOAD_SECONDS``; a state read keeps the connect timeout."""
    monkeypatch.setattr(database_state, "CONNECT_SECONDS", 1)
    target = _pipeline(db).warehouse
    assert target is not None
    with connected(target, pipeline="orders_wh", statement_seconds=LOAD_SECONDS) as connection:
        connection.cursor().execute("SELECT pg_sleep(1.5)")
    with (
        pytest.raises(TimeoutError),
        connected(target, pipeline="orders_wh") as connection,
    ):
        connection.cursor().execute("SELECT pg_sleep(1.5)")


def test_a_second_attempt_of_a_batch_waits_for_the_first(spark: SparkSession, db: Database) -> None:
    """Two attempts of one batch at once (a run taken for dead still loading, its retry
    beside it) share the batch's staging table: the second is refused as retryable while
    the first holds it, and writes nothing; once it ends, the batch loads."""
    pipeline = _pipeline(db)
    target = pipeline.warehouse
    assert target is not None
    staged = f'"wh"."{stage_name("orders_wh", "b000001")}"'
    with connected(target, pipeline="orders_wh") as other:
        other.autocommit = True
        other.cursor().execute(sql.try_lock_attempt(), (f"{staged}:b000001",))
        with pytest.raises(RetryableError, match="another attempt of batch b000001"):
            _load(spark, pipeline, [(1, 10)], 1)
        assert read_state(target, "orders_wh") is None
    assert _load(spark, pipeline, [(1, 10)], 1).rows_inserted == 1


def test_a_look_goes_on_with_a_table_seen_filled_while_the_warehouse_does_not_answer(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coordinator's first-load rule asks the warehouse whether the table is missing,
    empty or filled on each look. One it saw filled stays filled while the warehouse does
    not answer (the rest of the location keeps planning); one it never saw fails the look,
    naming the warehouse, since a missing table must be loaded in full."""
    pipeline = _pipeline(db)
    target = pipeline.warehouse
    assert target is not None
    looks, fresh = WarehouseLooks(), WarehouseLooks()
    assert looks.state(target, "orders_wh") is TargetState.MISSING
    db.sql(
        "CREATE SCHEMA wh; CREATE TABLE wh.orders (id bigint PRIMARY KEY, value bigint); "
        "INSERT INTO wh.orders VALUES (1, 10)"
    )
    assert looks.state(target, "orders_wh") is TargetState.FILLED
    monkeypatch.setenv("WH_PASSWORD", "not-the-password")  # the warehouse refuses now
    assert looks.state(target, "orders_wh") is TargetState.FILLED
    with pytest.raises(ConfigurationError, match="refused the credentials"):
        fresh.state(target, "orders_wh")


def test_append_and_overwrite_targets_load_each_batch_once(
    spark: SparkSession, db: Database
) -> None:
    """An append target gets each batch's rows once (a retry of a committed batch adds
    nothing; delete rows are refused, nothing written); an overwrite target holds exactly
    the last batch's rows."""
    appended = replace(_pipeline(db), write="append", keys=())
    _load(spark, appended, [(1, 10), (2, 20)], 1)
    _load(spark, appended, [(1, 11)], 2)
    assert _load(spark, appended, [(1, 11)], 2, retried=True).already_applied
    assert sorted(db.sql("SELECT id, value FROM wh.orders")) == [
        ["1", "10"],
        ["1", "11"],
        ["2", "20"],
    ]
    deletes = spark.createDataFrame([(3, 30, "delete")], "id long, value long, _change_type string")
    with pytest.raises(TerminalError, match="cannot delete"):
        write_warehouse(
            spark,
            deletes,
            appended,
            batch_id="b000003",
            write_seq=3,
            full_load=False,
            root="root-a",
        )
    assert len(db.sql("SELECT id FROM wh.orders")) == 3
    db.sql("DROP SCHEMA wh CASCADE")
    overwritten = replace(_pipeline(db), write="overwrite")
    _load(spark, overwritten, [(1, 10), (2, 20)], 1)
    result = _load(spark, overwritten, [(3, 30)], 2)
    assert (result.rows_inserted, result.rows_deleted) == (1, 2)
    assert _warehouse(db) == {3: 30}
