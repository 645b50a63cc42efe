"""The code location served as a gRPC code server, as a deployment runs it
(`dagster code-server start`): it starts without a JVM, answers Dagster's health check, and a
Dagster client reaches its jobs and sensors over gRPC. The process group is gone after."""

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO
from tests.scale.spark_servers import free_port, group_alive, start
from watermark_dagster.dagster_defs.definitions import BATCH_JOB
from watermark_dagster.dagster_defs.names import RETENTION_JOB
from watermark_dagster.dagster_defs.sensors import COORDINATOR, FINALIZER

DAGSTER = Path(sys.executable).with_name("dagster")
START_TIMEOUT_SECONDS = 180


def _dagster(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DAGSTER), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_the_code_location_serves_over_grpc_without_a_jvm(
    dg_env: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, launches = dg_env
    port = free_port()
    argv = ["code-server", "start", "-m", "watermark_dagster.definitions", "-a", "defs"]
    argv += ["-h", "127.0.0.1", "-p", str(port)]
    log = tmp_path / "code-server.log"
    server = start("code server", [str(DAGSTER), *argv], log, env, REPO, inherit=False)
    grpc = ["--grpc-host", "127.0.0.1", "--grpc-port", str(port)]
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while _dagster(
            env, "api", "grpc-health-check", "-h", "127.0.0.1", "-p", str(port)
        ).returncode:
            assert server.process.poll() is None, server.tail()
            assert time.monotonic() < deadline, server.tail()
            time.sleep(1)
        jobs = _dagster(env, "job", "list", *grpc)
        assert jobs.returncode == 0, jobs.stderr[-3000:]
        for name in (BATCH_JOB, RETENTION_JOB):
            assert name in jobs.stdout, jobs.stdout
        sensors = _dagster(env, "sensor", "list", *grpc)
        assert sensors.returncode == 0, sensors.stderr[-3000:]
        for name in (COORDINATOR, FINALIZER):
            assert name in sensors.stdout, sensors.stdout
    finally:
        server.stop()
    assert not group_alive(server.process.pid)
    assert not launches.exists(), launches.read_text()
