"""Fixtures of the deployment tier: the environment of a Dagster command-line process."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

DG = Path(sys.executable).with_name("dg")


@pytest.fixture
def dg_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a `dg` or `dagster` process (fresh homes, this checkout first on
    the path), and the file a JVM launch would write (its JAVA_HOME records launches)."""
    assert DG.exists(), f"{DG} is missing: install the test extras (pip install -e '.[test]')"
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    shutil.copy(REPO / "dagster.yaml", dagster_home / "dagster.yaml")
    launches = tmp_path / "java-launches.log"
    java = tmp_path / "java-home" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f'#!/bin/sh\necho "$*" >> "{launches}"\nexit 97\n')
    java.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WATERMARK_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(dagster_home),
        WATERMARK_HOME=str(tmp_path / "watermark_home"),
        # Spark's launcher runs $JAVA_HOME/bin/java before anything on PATH.
        JAVA_HOME=str(java.parent.parent),
        # This checkout's package, whatever the environment has installed.
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        NO_COLOR="1",
    )
    return env, launches
