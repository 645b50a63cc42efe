"""Time in one zone: a database upstream's window pinned by one process and read by another
selects the same rows, whatever zone the hosts are in.

A JDBC read of a ``timestamp without time zone`` column, and the window's filter pushed to
the database, are rendered in the JVM's default zone. Every session the runtime builds runs
its JVMs in UTC (``watermark_dagster/runtime/spark.py``, ``in_utc``), so a run process on a
host in Europe/Paris reads exactly the rows a UTC host pinned; a JVM left in Paris reads an
hour more (repeated by the next window) and a JVM east of it skips them.
"""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests.conftest import SPARK_TEST_CONF
from tests.support.databases import Database, postgres
from tests.support.lakes import registry_from
from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.core.ranges import CursorWindow
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.read.cursor import pin_end, read_source, window_rows
from watermark_dagster.runtime.jdbc import JDBC_DRIVERS_KEY
from watermark_dagster.runtime.spark import session_settings

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

T0 = datetime(2026, 1, 15, tzinfo=UTC)  # winter: Europe/Paris is UTC+1
TABLE = "orders_tz"
ROOT = Path(__file__).resolve().parents[2]

# Run in a process of its own, whose host zone the test sets through TZ: the window's rows
# as a run process reads them, through the runtime's own session builder.
READER = """
import json, sys
from tests.support.lakes import registry_from
from watermark_dagster.core.ranges import CursorWindow
from watermark_dagster.read.cursor import window_rows
from watermark_dagster.runtime.spark import build_spark_session

given = json.loads(sys.stdin.read())
spark = build_spark_session(master="local[1]", conf=given["conf"])
upstream = registry_from(given["spec"]).upstreams["orders_db"]
window = CursorWindow(None, tuple(given["end"]))
ids = sorted(r["id"] for r in window_rows(spark, upstream, window).collect())
zone = spark._jvm.java.util.TimeZone.getDefault().getID()
print(json.dumps({"zone": zone, "ids": ids}))
"""


@pytest.fixture(scope="module")
def server() -> Iterator[Database]:
    with postgres() as database:
        yield database


def _spec(db: Database) -> dict[str, Any]:
    upstream = {
        "name": "orders_db",
        "kind": "database",
        "url": db.url,
        "source_table": f"{db.schema}.{TABLE}",
        "cursor": "updated_at",
        "tie_break": ["id"],
        "user": {"env": "SHOP_USER"},
        "password": {"env": "SHOP_PASSWORD"},
    }
    return {"upstreams": [upstream], "pipelines": []}


@pytest.fixture
def shop(server: Database, monkeypatch: pytest.MonkeyPatch) -> Database:
    """Rows 1-3 at 01:00, 02:00 and 03:00 (wall clock, no zone); credentials in the
    environment (the reading process inherits them)."""
    monkeypatch.setenv("SHOP_USER", "watermark")
    monkeypatch.setenv("SHOP_PASSWORD", server.password)
    server.sql(
        f"DROP TABLE IF EXISTS {TABLE}; "
        f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, updated_at timestamp(6) NOT NULL)"
    )
    _insert(server, {1: 60, 2: 120, 3: 180})
    return server


def _insert(db: Database, rows: dict[int, int]) -> None:
    """Rows ``id: minutes after T0``."""
    for i, minutes in rows.items():
        at = (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%d %H:%M:%S")
        db.sql(f"INSERT INTO {TABLE} (id, updated_at) VALUES ({i}, '{at}')")


def _read_in_zone(spec: dict[str, Any], end: tuple[int, ...], zone: str) -> dict[str, Any]:
    given = {"conf": {**SPARK_TEST_CONF, JDBC_DRIVERS_KEY: "true"}, "spec": spec, "end": end}
    env = {**os.environ, "TZ": zone, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", READER],
        input=json.dumps(given),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_window_pinned_in_utc_reads_the_same_rows_on_a_host_in_paris(
    spark: SparkSession, shop: Database
) -> None:
    spec = _spec(shop)
    upstream = registry_from(spec).upstreams["orders_db"]
    assert isinstance(upstream, DatabaseUpstream)
    jvm: Any = spark._jvm  # pyright: ignore[reportAttributeAccessIssue]
    assert jvm.java.util.TimeZone.getDefault().getID() == "UTC"  # the runtime's builder
    # Pinned here (UTC): the window ends at row 3, 03:00.
    now = T0 + timedelta(days=1)
    pinned = pin_end(read_source(spark, upstream), upstream, CursorWindow(None, None), now)
    assert pinned.end is not None
    assert pinned.end[1] == 3
    _insert(shop, {4: 210, 5: 300})  # 03:30 and 05:00, after the window was pinned
    window = CursorWindow(None, pinned.end)
    assert sorted(r["id"] for r in window_rows(spark, upstream, window).collect()) == [1, 2, 3]

    # Without the rule: the same JVM in Paris renders the end (03:00 UTC) as 04:00 and
    # reads row 4 (03:30) too, which the next window reads again.
    paris = jvm.java.util.TimeZone.getTimeZone("Europe/Paris")
    utc = jvm.java.util.TimeZone.getDefault()
    jvm.java.util.TimeZone.setDefault(paris)
    try:
        shifted = sorted(r["id"] for r in window_rows(spark, upstream, window).collect())
    finally:
        jvm.java.util.TimeZone.setDefault(utc)
    assert shifted == [1, 2, 3, 4]

    # A run process on a host in Paris, through the runtime's session builder: its JVM is
    # in UTC, and it reads exactly the pinned rows.
    read = _read_in_zone(spec, pinned.end, "Europe/Paris")
    assert read == {"zone": "UTC", "ids": [1, 2, 3]}


def test_settings_naming_another_zone_are_refused() -> None:
    settings = session_settings(
        master="spark://host:7077",
        conf={"spark.executor.extraJavaOptions": "-XX:+UseSerialGC"},
    )
    assert settings["spark.driver.extraJavaOptions"] == "-Duser.timezone=UTC"
    assert settings["spark.executor.extraJavaOptions"] == "-XX:+UseSerialGC -Duser.timezone=UTC"
    assert settings["spark.sql.session.timeZone"] == "UTC"
    with pytest.raises(ConfigurationError, match="Europe/Paris") as raised:
        session_settings(conf={"spark.driver.extraJavaOptions": "-Duser.timezone=Europe/Paris"})
    assert "remove -Duser.timezone" in (raised.value.fix or "")
    with pytest.raises(ConfigurationError, match="Asia/Tokyo"):
        session_settings(
            remote="sc://host:15002", conf={"spark.sql.session.timeZone": "Asia/Tokyo"}
        )
