"""The Postgres example of docs/instance.md, as written, against a real PostgreSQL server.

The test starts Debian's PostgreSQL server on a free loopback port (tests/support/databases.py:
its own cluster in a temporary folder, run by an unprivileged account when the tests run as
root), writes the shipped dagster.yaml plus that page's `storage:` block into a fresh
DAGSTER_HOME, runs the demo's first batch through `watermark demo` (one Spark session), and
then finds the runs and the pipelines' materializations in the database, through a
DagsterInstance and with plain SQL. The server is stopped at the end and no process of it is left.

Without the server binaries the test is skipped on a developer's machine and fails under CI
(`.ci/run` installs Debian's `postgresql` package).
"""

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, DagsterInstance, DagsterRunStatus

from tests.conftest import REPO, SPARK_TEST_CONF
from tests.support import databases
from tests.support.cli import SCRIPT
from tests.support.databases import Database
from watermark_dagster.definitions import build_demo_location

DOCS_MARKER = (
    "<!-- tests/deploy/test_postgres.py runs this block against a real PostgreSQL server -->"
)
DB_NAME = "dagster"


def _docs_block() -> str:
    """The YAML block docs/instance.md shows right after its marker comment."""
    text = (REPO / "docs" / "instance.md").read_text()
    assert DOCS_MARKER in text, "docs/instance.md's Postgres example lost its marker"
    after = text.split(DOCS_MARKER, 1)[1]
    match = re.match(r"\s*```yaml\n(.*?)```", after, re.DOTALL)
    assert match, "no ```yaml block right after docs/instance.md's Postgres marker"
    return match.group(1)


def _shipped_comment_block() -> str:
    """The commented-out `storage:` block at the end of the shipped dagster.yaml."""
    lines = (REPO / "dagster.yaml").read_text().splitlines()
    start = lines.index("# storage:")
    return "\n".join(line.removeprefix("#").removeprefix(" ") for line in lines[start:]) + "\n"


@pytest.fixture
def postgres() -> Iterator[Database]:
    """A PostgreSQL server on 127.0.0.1 with a database for Dagster; stopped afterwards."""
    with databases.postgres(DB_NAME) as server:
        yield server


def test_readme_example_matches_the_shipped_comment() -> None:
    readme = yaml.safe_load(_docs_block())
    assert readme == yaml.safe_load(_shipped_comment_block())
    db = readme["storage"]["postgres"]["postgres_db"]
    assert db["scheme"] == "postgresql+psycopg2"
    assert db["password"] == {"env": "DAGSTER_PG_PASSWORD"}


@pytest.mark.postgres
@pytest.mark.spark  # the demo batch runs on Spark
@pytest.mark.e2e  # a deployment's story: the e2e tier's (pyproject.toml)
def test_readme_postgres_example_stores_a_demo_batch(
    postgres: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg2

    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    config = (REPO / "dagster.yaml").read_text() + "\n" + _docs_block()
    (dagster_home / "dagster.yaml").write_text(config)
    assert postgres.password not in config  # the password comes from the environment
    watermark_home = tmp_path / "watermark_home"

    env = {k: v for k, v in os.environ.items() if not k.startswith(("WATERMARK_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(dagster_home),
        WATERMARK_HOME=str(watermark_home),
        DAGSTER_PG_HOST=postgres.host,
        DAGSTER_PG_PORT=str(postgres.port),
        DAGSTER_PG_USER=postgres.user,
        DAGSTER_PG_PASSWORD=postgres.password,
        DAGSTER_PG_DB=DB_NAME,
        # The tests' small-data and quick-JVM Spark settings (tests/conftest.py).
        WATERMARK_SPARK_CONF=json.dumps(SPARK_TEST_CONF),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    done = subprocess.run(
        [str(SCRIPT), "demo", "--rounds", "0", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert json.loads(done.stdout)["completed"], done.stdout
    # Nothing went to SQLite under DAGSTER_HOME.
    assert not list(dagster_home.rglob("*.db")), list(dagster_home.rglob("*.db"))

    pipelines = set(build_demo_location(watermark_home).registry.pipelines)
    assert pipelines
    for key in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("DAGSTER_PG_DB", DB_NAME)
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        runs = instance.get_runs()
        assert runs
        assert {r.status for r in runs} == {DagsterRunStatus.SUCCESS}
        for pipeline in pipelines:
            records = instance.fetch_materializations(AssetKey(pipeline), limit=5).records
            assert records, f"no materialization of {pipeline} in Postgres"
            assert {r.run_id for r in records} <= {r.run_id for r in runs}

    # The same rows, read with plain SQL from the server.
    with (
        psycopg2.connect(
            host=postgres.host,
            port=postgres.port,
            user=postgres.user,
            password=postgres.password,
            dbname=DB_NAME,
        ) as conn,
        conn.cursor() as cur,
    ):
        cur.execute("SELECT count(*) FROM runs WHERE status = 'SUCCESS'")
        (run_count,) = cur.fetchone() or (0,)
        cur.execute(
            "SELECT DISTINCT asset_key FROM event_logs "
            "WHERE dagster_event_type = 'ASSET_MATERIALIZATION'"
        )
        materialized = {json.loads(row[0])[-1] for row in cur.fetchall()}
    conn.close()
    assert run_count == len(runs)
    assert pipelines <= materialized
