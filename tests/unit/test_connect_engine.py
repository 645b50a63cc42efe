"""The home's engine record and the settings its server starts with, without a JVM.

A listening loopback socket stands in for the server where only "does its port accept
connections" matters; tests/spark/test_engine.py runs the real server.
"""

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from watermark_dagster.dagster_defs.resources import SparkSessionResource
from watermark_dagster.errors import TerminalError, WatermarkError
from watermark_dagster.runtime.connect import (
    SERVER_CLASS,
    EngineRecord,
    EngineUnavailableError,
    live_engine,
    read_record,
    record_file,
    remove_record,
    server_argv,
    server_settings,
    wait_for_engine,
    write_record,
)
from watermark_dagster.runtime.spark import DELTA_CONF


@pytest.fixture
def listening() -> Iterator[int]:
    """A loopback port that accepts connections, as a started server's does."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _record(port: int, *, server_pid: int | None = None, pid: int | None = None) -> EngineRecord:
    return EngineRecord(
        url=f"sc://127.0.0.1:{port}",
        port=port,
        pid=pid or os.getpid(),
        server_pid=server_pid or os.getpid(),
        log="/somewhere/logs/spark-connect.log",
        started="2026-11-28T05:00:00+00:00",
    )


def _dead_pid() -> int:
    pid = 2**22 - 7  # above any pid the kernel hands out here (pid_max 4194304)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    return pid


def test_the_record_is_written_whole_and_removed_only_by_its_own_engine(
    tmp_path: Path, listening: int
) -> None:
    folder = tmp_path / "engine"
    assert read_record(folder) is None
    record = _record(listening)
    write_record(folder, record)
    assert read_record(folder) == record
    assert not list(folder.glob("*.tmp"))
    remove_record(folder, pid=os.getpid() + 1)  # another engine's stop leaves it
    assert read_record(folder) == record
    remove_record(folder, pid=os.getpid())
    assert read_record(folder) is None
    record_file(folder).write_text("{not json")
    assert read_record(folder) is None


def test_an_engine_is_live_only_while_its_server_runs_and_listens(
    tmp_path: Path, listening: int
) -> None:
    folder = tmp_path / "engine"
    write_record(folder, _record(listening))
    assert live_engine(folder) == _record(listening)
    write_record(folder, _record(listening, server_pid=_dead_pid()))
    assert live_engine(folder) is None  # its server died
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    write_record(folder, _record(port))
    assert live_engine(folder) is None  # nothing accepts on its port


def test_waiting_for_no_engine_fails_as_retryable_naming_the_record_and_the_fix(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "engine"
    with pytest.raises(EngineUnavailableError) as none:
        wait_for_engine(folder, timeout=0)
    assert f"no engine is recorded in {record_file(folder)}" in str(none.value)
    assert "watermark engine" in none.value.fix
    assert "WATERMARK_ENGINE=process" in none.value.fix
    assert isinstance(none.value, WatermarkError)
    assert not isinstance(none.value, TerminalError)  # the coordinator retries the run

    write_record(folder, _record(1, server_pid=_dead_pid()))
    with pytest.raises(EngineUnavailableError) as dead:
        wait_for_engine(folder, timeout=0)
    assert "is not answering; its log is /somewhere/logs/spark-connect.log" in str(dead.value)
    assert "Nothing was written" in str(dead.value)


def test_the_server_gets_the_location_settings_delta_and_a_loopback_port() -> None:
    master, settings = server_settings(
        master="local[2]",
        conf={"spark.sql.shuffle.partitions": "3", "spark.driver.memory": "2g"},
        port=15123,
    )
    assert master == "local[2]"
    for key, value in DELTA_CONF.items():
        assert settings[key] == value
    assert settings["spark.sql.shuffle.partitions"] == "3"
    assert settings["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert settings["spark.connect.grpc.binding.port"] == "15123"
    assert settings["spark.ui.enabled"] == "false"
    assert "delta-spark" in settings.get("spark.jars", "") + settings.get("spark.jars.packages", "")
    argv = server_argv(master=master, settings=settings)
    assert argv[argv.index("--class") + 1] == SERVER_CLASS
    assert argv[argv.index("--driver-memory") + 1] == "2g"  # a JVM option, not a --conf
    assert "spark.driver.memory=2g" not in argv
    assert argv[-1] == "spark-internal"
    # The defaults a run's own session would get: driver memory sized for the machine.
    _, defaults = server_settings(master="local[2]", conf={}, port=1)
    assert defaults["spark.driver.memory"].endswith(("m", "g"))
    assert defaults["spark.sql.shuffle.partitions"] == "4"


def test_the_resource_uses_the_engine_as_its_setting_says(tmp_path: Path, listening: int) -> None:
    folder = tmp_path / "engine"
    write_record(folder, _record(listening))
    assert SparkSessionResource(engine_folder=str(folder)).find_engine() == _record(listening)
    assert SparkSessionResource(engine="process", engine_folder=str(folder)).find_engine() is None
    assert SparkSessionResource(engine_folder=str(tmp_path / "none")).find_engine() is None
    resource = SparkSessionResource(engine="connect", engine_folder=str(tmp_path / "none"))
    assert resource.engine_label() == "process"  # no session yet
    remote = SparkSessionResource(remote="sc://spark:15002", engine_folder=str(folder))
    assert remote.engine_label() == "remote:sc://spark:15002"
