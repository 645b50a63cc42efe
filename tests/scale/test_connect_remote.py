"""A remote Spark Connect server: the code location reaches a server started as its own
process (Delta's jars and SQL extension, no Delta Connect plugin) at ``sc://``, and runs
batches of every read mode there; a server without Delta is refused before any work.

The run processes are Connect clients only: they start no JVM of their own.
"""

from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.scale.scenario import Scenario
from tests.scale.spark_servers import connect_server, group_alive

pytestmark = [pytest.mark.scale, pytest.mark.e2e]

# Only session-level settings can be sent from a Connect client.
CLIENT_CONF = {"spark.sql.shuffle.partitions": "2"}


def test_batches_of_every_read_mode_run_on_a_remote_connect_server(
    tmp_path: Path, dagster_home: Path
) -> None:
    with connect_server(tmp_path) as (url, server):
        scenario = Scenario(tmp_path / "lake", {"spark_remote": url, "spark_conf": CLIENT_CONF})
        scenario.root.mkdir()
        scenario.run_rounds(dagster_home)
        # Each target was written through Spark's MERGE or WRITE plans on the server.
        ops = {h["operation"] for h in DeltaTable(scenario.path("target_changes_copy")).history()}
        assert "MERGE" in ops, ops
    assert not group_alive(server.process.pid)


def test_a_connect_server_without_delta_is_refused_before_any_work(
    tmp_path: Path, dagster_home: Path
) -> None:
    with connect_server(tmp_path, delta=False) as (url, server):
        scenario = Scenario(tmp_path / "lake", {"spark_remote": url, "spark_conf": CLIENT_CONF})
        scenario.root.mkdir()
        scenario.commit_round()
        proc = scenario.run_raw(dagster_home)
    assert not group_alive(server.process.pid)
    assert proc.returncode != 0, proc.stdout
    assert f"The Spark Connect server at {url} does not load Delta Lake" in proc.stderr
    assert "io.delta.sql.DeltaSparkSessionExtension" in proc.stderr
    for name in ("changes_copy", "events_copy", "dims_copy", "clicks_copy"):
        assert not DeltaTable.is_deltatable(scenario.path(f"target_{name}")), name
