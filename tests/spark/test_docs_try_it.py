"""docs/database-upstreams.md's "Try it", run as written: its code location saved as
``shop_location.py`` in an empty folder, its SQL run against a real PostgreSQL, and its
``watermark run`` and ``watermark list`` lines run from that folder, relative target paths
(``.lake/orders``) and all.

Two things differ from a reader's machine, and only them: the server is this test's own
(its port and account in the JDBC URL and the credential variables), and the rows are
changed by this test between the two runs as the page tells the reader to.
"""

import os
import re
import shlex
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.support.cli import SCRIPT
from tests.support.databases import Database, postgres

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

PAGE = Path(__file__).parents[2] / "docs" / "database-upstreams.md"
DOCS_URL = "jdbc:postgresql://127.0.0.1:5432/shop"


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def _commands(script: str) -> list[list[str]]:
    """The ``watermark`` lines of a bash block, comments cut, as argument lists."""
    lines = [line for line in script.splitlines() if line.startswith("watermark ")]
    return [shlex.split(line, comments=True) for line in lines]


def _totals(spark: SparkSession, folder: Path) -> dict[int, Decimal]:
    rows = spark.read.format("delta").load(str(folder / ".lake" / "customer_totals")).collect()
    return {int(r["customer_id"]): r["total"] for r in rows}


@pytest.fixture(scope="module")
def server() -> "Database":
    with postgres() as database:
        yield database  # pyright: ignore[reportReturnType]


def test_the_database_guides_try_it_runs_as_written(
    spark: SparkSession, server: Database, tmp_path: Path, dagster_home: Path
) -> None:
    section = _section(PAGE.read_text(), "Try it")
    (location,) = _blocks(section, "python")
    (shell,) = _blocks(section, "bash")
    assert DOCS_URL in location
    (tmp_path / "shop_location.py").write_text(location.replace(DOCS_URL, server.url))
    (create,) = re.findall(r'psql "[^"]*" -c "(.*?)"', shell, flags=re.S)
    server.sql(create)
    # The session's own settings (the test JVMs' Spark options) kept; no home of its own.
    env = {k: v for k, v in os.environ.items() if k != "WATERMARK_HOME"}
    env.update(
        PATH=f"{SCRIPT.parent}:{env.get('PATH', '/usr/bin:/bin')}",
        DAGSTER_HOME=str(dagster_home),
        SHOP_DB_USER=server.user,
        SHOP_DB_PASSWORD=server.password,
    )
    commands = _commands(shell)
    assert [c[:2] for c in commands] == [["watermark", "run"], ["watermark", "list"]]

    def run(words: list[str]) -> str:
        done = subprocess.run(
            words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{shlex.join(words)}:\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        return done.stdout

    for words in commands:
        run(words)
    assert _totals(spark, tmp_path) == {7: Decimal("14.50"), 8: Decimal("12.00")}
    # "update or insert rows (setting updated_at = now()), run again, and only they are read"
    server.sql(
        "UPDATE orders SET amount = 5, updated_at = now() WHERE id = 2; "
        "INSERT INTO orders (id, customer_id, amount) VALUES (4, 9, 1)"
    )
    run(commands[0])
    assert _totals(spark, tmp_path) == {
        7: Decimal("15.50"),
        8: Decimal("12.00"),
        9: Decimal("1.00"),
    }
    listed = run(commands[1])
    for stage in ("orders_db", "orders_db_lake", "customer_totals"):
        assert stage in listed
