"""Spark Connect as the engine: a real local Connect server (the server class PySpark ships,
with Delta's jars but without Delta's Connect plugin, which is not published for Spark 4.2),
a client in its own process.

Every read mode works through the project's read path; the session is refused before any
batch work, naming the missing plugin, because target writes use Delta's DeltaTable API.
"""

import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from watermark_dagster.runtime.spark import DELTA_CONF, cached_delta_jars

pytestmark = pytest.mark.spark

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server on a loopback port, with Delta's jars and SQL extension."""
    import pyspark

    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    jars = cached_delta_jars()
    delta = importlib.metadata.version("delta-spark")
    jar_args = (
        ["--conf", f"spark.jars={','.join(jars)}"]
        if jars
        else ["--packages", f"io.delta:delta-spark_4.2_2.13:{delta}"]
    )
    conf = {
        **DELTA_CONF,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "1g",
    }
    argv = [
        str(Path(pyspark.__file__).parent / "bin" / "spark-submit"),
        "--class",
        SERVER_CLASS,
        "--master",
        "local[2]",
        *jar_args,
        *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")],
        "spark-internal",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while "Spark Connect server started" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def probe(connect_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("connect-probe")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.connect_probe", str(root), connect_server],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("mode", "rows", "snapshot", "files"),
    [
        ("CDF", 4, 6, None),  # versions 1..2: two inserts each; the table as of 2
        ("APPEND_ONLY", 4, 6, 2),  # only the two files versions 1..2 added
        ("SNAPSHOT", 4, 4, None),  # the table as of version 1
        ("TIMESTAMP", 10, 10, None),  # every row of the parquet folder
    ],
)
def test_every_read_mode_works_over_spark_connect(
    probe: dict, mode: str, rows: int, snapshot: int, files: int | None
) -> None:
    assert probe[mode] == {"rows": rows, "net": rows, "snapshot": snapshot, "files_read": files}


def test_a_server_without_delta_connect_is_refused_before_any_work(probe: dict) -> None:
    message = probe["session"]
    assert message.startswith("refused: "), message
    assert "no Delta Connect plugin" in message
    assert "io.delta:delta-connect-server" in message
    assert "DeltaRelationPlugin" in message
    assert "WATERMARK_SPARK_REMOTE" in message
