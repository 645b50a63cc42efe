"""Issue 64's independent attack on database upstreams against a real PostgreSQL, with real
Spark, Delta and Dagster: positions a window could miss, each a test."""

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests.support.databases import SERVERS, Database
from tests.support.spark_lake import Lake, open_lake

pytestmark = pytest.mark.spark

TABLE = "orders"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LAG = 45  # seconds: longer than one batch takes from its look to the slow commit


@pytest.fixture(scope="module")
def server() -> Iterator[Database]:
    with SERVERS["postgresql"]() as database:
        yield database


@pytest.fixture
def shop(server: Database, monkeypatch: pytest.MonkeyPatch) -> Database:
    """``orders`` whose tie-break column ``seq`` may be NULL (the key is ``id``)."""
    server.sql(
        f"DROP TABLE IF EXISTS {TABLE}; "
        f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, seq bigint, value bigint, "
        f"updated_at {server.timestamp_type} NOT NULL, deleted boolean NOT NULL DEFAULT false)"
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


def _spec(lake: Lake, db: Database, *, tie_break: str) -> dict[str, Any]:
    """The database guide's chain: ``orders`` extracted by its stage, keyed by ``id``,
    its windows' ties broken by ``tie_break``."""
    upstream = {
        "name": "orders_db",
        "kind": "database",
        "url": db.url,
        "source_table": f"{db.schema}.{TABLE}",
        "cursor": "updated_at",
        "tie_break": [tie_break],
        "user": {"env": "SHOP_USER"},
        "password": {"env": "SHOP_PASSWORD"},
        "soft_delete": "deleted",
    }
    pipes = [{"stage": "orders_db", "target": lake.path("orders"), "keys": ["id"]}]
    return lake.spec([upstream], pipes)


def _insert(db: Database, rows: list[tuple[int, int | None, int, float]]) -> None:
    for i, seq, value, minutes in rows:
        shown = "NULL" if seq is None else str(seq)
        db.sql(
            f"INSERT INTO {TABLE} (id, seq, value, updated_at) "
            f"VALUES ({i}, {shown}, {value}, '{_at(minutes)}')"
        )


def test_a_row_whose_tie_break_key_is_null_at_a_boundary_is_loaded_or_refused(
    lake: Lake, shop: Database
) -> None:
    """A NULL tie-break value compares to nothing: a row sharing a window boundary's cursor
    value with a NULL tie-break is in neither window, and is counted nowhere."""
    db = shop
    spec = _spec(lake, db, tie_break="seq")
    _insert(db, [(1, 1, 10, 1), (2, None, 20, 1)])
    out = lake.cli(spec, "run")
    _insert(db, [(3, 3, 30, 2)])
    again = lake.cli(spec, "run")
    loaded = lake.rows("orders") if Path(lake.path("orders")).exists() else {}
    if loaded.get(2) != 20:  # not loaded: it must at least have been loud
        said = out.stdout + out.stderr + again.stdout + again.stderr
        assert out.returncode != 0 or again.returncode != 0, said
        assert "seq" in said, said


def test_a_text_tie_break_under_a_database_collation_loses_no_row(
    lake: Lake, shop: Database
) -> None:
    db = shop
    db.sql(f'ALTER TABLE {TABLE} ADD COLUMN code text COLLATE "en-US-x-icu"')
    for i, code in ((1, "a"), (2, "B")):  # binary: 'B' < 'a'; en-US: 'a' < 'B'
        db.sql(
            f"INSERT INTO {TABLE} (id, code, value, updated_at) "
            f"VALUES ({i}, '{code}', {i * 10}, '{_at(1)}')"
        )
    spec = _spec(lake, db, tie_break="code")
    for _ in range(2):
        out = lake.cli(spec, "run")
        assert out.returncode == 0, out.stdout + out.stderr
    assert lake.rows("orders") == {1: 10, 2: 20}


@pytest.mark.parametrize("lag", [0, LAG], ids=["without_a_lag", "with_a_lag"])
def test_an_id_cursor_loses_no_row_committed_out_of_order(
    lake: Lake, shop: Database, lag: int
) -> None:
    """A transaction takes id 1 and commits after id 2 was read. Without a lag, row 1 is in
    no window (the documented limit); with ``lag_seconds``, the window ends at the
    greatest id a look saw at least the lag ago, so id 2 is held back (counted, re-checked
    when the look that saw it passes the lag) and both load, once."""
    import pg8000.dbapi

    db = shop
    db.sql(
        f"DROP TABLE {TABLE}; CREATE TABLE {TABLE} (id bigint GENERATED ALWAYS AS IDENTITY "
        "PRIMARY KEY, value bigint, deleted boolean NOT NULL DEFAULT false)"
    )
    spec = _spec(lake, db, tie_break="id")
    spec["upstreams"][0]["cursor"] = "id"
    spec["upstreams"][0]["tie_break"] = []
    spec["upstreams"][0]["lag_seconds"] = lag
    slow = pg8000.dbapi.connect(
        user=db.user, password=db.password, host=db.host, port=db.port, database=db.database
    )
    try:
        cursor = slow.cursor()
        cursor.execute(f"INSERT INTO {TABLE} (value) VALUES (10)")  # takes id 1, not committed
        db.sql(f"INSERT INTO {TABLE} (value) VALUES (20)")  # id 2, committed first
        first = lake.cli(spec, "run", "--once")
        assert first.returncode == 0, first.stdout + first.stderr
        slow.commit()  # within the lag of the look that saw id 2
    finally:
        slow.close()
    if not lag:
        again = lake.cli(spec, "run")
        assert again.returncode == 0, again.stdout + again.stderr
        assert lake.rows("orders") == {2: 20}  # row 1 is in no window: docs, late rows
        return
    # The look that planned the first batch saw id 2 just now: nothing is read yet, and
    # the committed state says when to look again (the lag after that look).
    mark = lake.store.committed()["orders_db"]
    assert mark.committed_cursor in (None, ())
    assert mark.source_state is not None
    assert "|recheck@" in mark.source_state
    recheck = int(mark.source_state.rsplit("|recheck@", 1)[1])
    planned = lake.store.batches()[0].created_at
    assert recheck == (planned - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) + (
        LAG * 1_000_000
    )
    idle = lake.cli(spec, "run")  # before the recheck: nothing new, nothing planned
    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert len(lake.store.batches()) == 1
    assert _listed(lake, spec)["committed"] == []  # `watermark list`: nothing read yet
    while datetime.now(UTC).timestamp() * 1_000_000 < recheck:
        time.sleep(0.2)
    again = lake.cli(spec, "run")
    assert again.returncode == 0, again.stdout + again.stderr
    assert lake.rows("orders") == {1: 10, 2: 20}
    assert lake.store.committed()["orders_db"].committed_cursor == (2,)
    assert _listed(lake, spec)["committed"] == [2]


def _listed(lake: Lake, spec: dict[str, Any]) -> dict[str, Any]:
    """``watermark list --json``'s row of the database upstream."""
    out = lake.cli(spec, "list", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return {r["upstream"]: r for r in json.loads(out.stdout)}["orders_db"]


@pytest.fixture(scope="module")
def mariadb_server() -> Iterator[Database]:
    with SERVERS["mariadb"]() as database:
        yield database


def test_a_varchar_tie_break_under_mariadb_s_default_collation_loses_no_row(
    lake: Lake, mariadb_server: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = mariadb_server
    db.sql(
        f"DROP TABLE IF EXISTS {TABLE}; "
        f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, code varchar(10), value bigint, "
        f"updated_at {db.timestamp_type} NOT NULL, deleted boolean NOT NULL DEFAULT false)"
    )
    monkeypatch.setenv("SHOP_USER", "watermark")
    monkeypatch.setenv("SHOP_PASSWORD", db.password)
    for i, code in ((1, "a"), (2, "B")):  # binary: 'B' < 'a'; the collation: 'a' < 'B'
        db.sql(
            f"INSERT INTO {TABLE} (id, code, value, updated_at) "
            f"VALUES ({i}, '{code}', {i * 10}, '{_at(1)}')"
        )
    spec = _spec(lake, db, tie_break="code")
    for _ in range(2):
        out = lake.cli(spec, "run")
        assert out.returncode == 0, out.stdout + out.stderr
    assert lake.rows("orders") == {1: 10, 2: 20}


def test_values_equal_under_the_collation_are_on_one_side_of_every_boundary(
    lake: Lake, mariadb_server: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """'a' and 'A' at one cursor value are one position under a case-insensitive
    collation: loaded by the same window, and the look's state (its top position) is the
    same on every look, so no empty batch is planned after them, however many runs."""
    db = mariadb_server
    db.sql(
        f"DROP TABLE IF EXISTS {TABLE}; "
        f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, code varchar(10), value bigint, "
        f"updated_at {db.timestamp_type} NOT NULL, deleted boolean NOT NULL DEFAULT false)"
    )
    monkeypatch.setenv("SHOP_USER", "watermark")
    monkeypatch.setenv("SHOP_PASSWORD", db.password)
    for i, code in ((1, "A"), (2, "a"), (3, "b")):
        db.sql(
            f"INSERT INTO {TABLE} (id, code, value, updated_at) "
            f"VALUES ({i}, '{code}', {i * 10}, '{_at(1)}')"
        )
    spec = _spec(lake, db, tie_break="code")
    assert lake.cli(spec, "run").returncode == 0
    assert lake.rows("orders") == {1: 10, 2: 20, 3: 30}
    db.sql(f"DELETE FROM {TABLE} WHERE id = 3")  # 'a' and 'A' now tie at the top
    db.sql(f"UPDATE {TABLE} SET value = value + 1, updated_at = '{_at(2)}' WHERE id < 3")
    planned = len(lake.store.batches())
    out = lake.cli(spec, "run")
    assert out.returncode == 0, out.stdout + out.stderr
    assert lake.rows("orders") == {1: 11, 2: 21, 3: 30}
    assert len(lake.store.batches()) == planned + 1
    for _ in range(3):
        out = lake.cli(spec, "run")
        assert out.returncode == 0, out.stdout + out.stderr
    assert len(lake.store.batches()) == planned + 1


@pytest.mark.parametrize("column_type", ["timestamp(6)", "timestamptz"])
def test_a_window_pinned_by_the_database_is_in_utc_whatever_the_zones(
    lake: Lake, shop: Database, monkeypatch: pytest.MonkeyPatch, column_type: str
) -> None:
    """The end is pinned by the database through the look's driver: a cursor without a
    zone (UTC's wall clock) or with one, under a database whose sessions default to New
    York, pinned by a process whose host zone is Tokyo, is stored as µs since the epoch of
    the UTC instant, and Spark's window reads exactly the rows up to it."""
    import time

    from tests.support.lakes import registry_from
    from watermark_dagster.core.ranges import CursorWindow
    from watermark_dagster.read.cursor import pin_end, read_source, window_rows

    db = shop
    db.sql(f"ALTER TABLE {TABLE} ALTER COLUMN updated_at TYPE {column_type}")
    db.sql(f"ALTER DATABASE {db.database} SET TimeZone = 'America/New_York'")
    try:
        for i, minutes in ((1, 60), (2, 120)):
            stamp = (T0 + timedelta(minutes=minutes)).isoformat()
            db.sql(f"INSERT INTO {TABLE} (id, value, updated_at) VALUES ({i}, {i}, '{stamp}')")
        upstream = registry_from(_spec(lake, db, tie_break="id")).upstreams["orders_db"]
        monkeypatch.setenv("TZ", "Asia/Tokyo")
        time.tzset()
        now = T0 + timedelta(minutes=150)
        pinned = pin_end(read_source(lake.spark, upstream), upstream, CursorWindow(None), now)
        second = int((T0 + timedelta(minutes=120)).timestamp() * 1_000_000)
        assert pinned.end == (second, 2)
        stamp = (T0 + timedelta(minutes=121)).isoformat()
        db.sql(f"INSERT INTO {TABLE} (id, value, updated_at) VALUES (3, 3, '{stamp}')")
        window = CursorWindow(None, pinned.end)
        ids = sorted(r["id"] for r in window_rows(lake.spark, upstream, window).collect())
        assert ids == [1, 2]
        later = CursorWindow(pinned.end)
        again = pin_end(read_source(lake.spark, upstream), upstream, later, now)
        assert again.end == (second + 60_000_000, 3)
    finally:
        db.sql(f"ALTER DATABASE {db.database} RESET TimeZone")
        monkeypatch.delenv("TZ")
        time.tzset()


def test_the_fix_for_rows_without_a_cursor_never_skips_them(lake: Lake, shop: Database) -> None:
    """Rows that lost their cursor value after batches ran block the upstream; the fix
    said "give those rows a value (they then load)", and a row given its old value (its
    creation time, below the committed position) loaded nothing, exit 0. The fix says the
    value must be after the committed position."""
    db = shop
    db.sql(f"ALTER TABLE {TABLE} ALTER COLUMN updated_at DROP NOT NULL")
    spec = _spec(lake, db, tie_break="id")
    _insert(db, [(1, 1, 10, 1), (2, 2, 20, 2)])
    assert lake.cli(spec, "run").returncode == 0
    db.sql(f"INSERT INTO {TABLE} (id, value, updated_at) VALUES (3, 30, NULL)")
    blocked = lake.cli(spec, "run")
    said = " ".join((blocked.stdout + blocked.stderr).split())
    assert blocked.returncode != 0, said
    assert "after the committed position" in said, said
    assert "watermark get -t orders_db" in said, said
    db.sql(f"UPDATE {TABLE} SET updated_at = '{_at(3)}' WHERE id = 3")
    assert lake.cli(spec, "run").returncode == 0
    assert lake.rows("orders") == {1: 10, 2: 20, 3: 30}
