"""A Spark standalone cluster: a master and two workers started from the installed PySpark
distribution on loopback; the code location points at ``spark://`` and runs several
batches of every read mode there, Delta's jars reaching the executors from the driver.
The cluster is stopped with no process left behind."""

import re
from pathlib import Path

import pytest

from tests.conftest import SPARK_TEST_CONF
from tests.scale.scenario import Scenario
from tests.scale.spark_servers import group_alive, standalone_cluster

pytestmark = [pytest.mark.scale, pytest.mark.e2e]


def cluster_conf(master_url: str) -> dict[str, str]:
    """What changes from the local defaults for a cluster: the driver's address the
    executors call back (loopback here), and the executors' size."""
    return {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.sql.shuffle.partitions": "2",
        # Each run's executors live as long as the run: as for the tests' short-lived
        # drivers, the quick JIT and the serial collector (tests/conftest.py).
        "spark.executor.extraJavaOptions": SPARK_TEST_CONF["spark.driver.extraJavaOptions"],
    }


def test_batches_of_every_read_mode_run_on_a_standalone_cluster(
    tmp_path: Path, dagster_home: Path
) -> None:
    with standalone_cluster(tmp_path / "cluster") as cluster:
        scenario = Scenario(
            tmp_path / "lake",
            {"spark_master": cluster.master_url, "spark_conf": cluster_conf(cluster.master_url)},
        )
        scenario.root.mkdir()
        scenario.run_rounds(dagster_home)
        # The work ran on the workers' executors, not in the driver: each worker launched
        # executors for the runs' applications, and those fetched Delta's jar.
        executor_logs = list((tmp_path / "cluster" / "work").glob("app-*/*/stderr"))
        assert executor_logs, "no executor ran on the workers"
        fetched = [p for p in executor_logs if re.search(r"Fetching .*delta-spark", p.read_text())]
        assert fetched, "no executor fetched Delta's jar"
        workers = {p.parent.parent.name for p in executor_logs}
        assert workers
    for server in cluster.servers:
        assert not group_alive(server.process.pid), server.name
