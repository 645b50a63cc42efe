"""The probe the no-JVM tests rely on (tests/support/java_shim.py) sees a real JVM start."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.java_shim import java_shim, shim_env


@pytest.mark.spark  # starts a JVM on purpose: the shim must see it
def test_the_java_shim_sees_a_spark_session_start(tmp_path: Path) -> None:
    """The probe the other tests rely on: a session started under the shim is recorded."""
    java_home, launches = java_shim(tmp_path)
    code = (
        "from watermark_dagster.runtime.spark import build_spark_session\n"
        "build_spark_session(master='local[1]').stop()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        env=shim_env(tmp_path, java_home),
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert launches.exists()
    assert "SparkSubmit" in launches.read_text()
