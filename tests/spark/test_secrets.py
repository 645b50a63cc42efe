"""A credential given as an environment reference reaches the tables and the Spark session,
and is written nowhere Dagster keeps things, nor shown by Dagster's GraphQL API (the UI).

One batch runs headless (``watermark run``, its own process and JVM) from a registry file
whose upstream, target and control root reference the credential as ``{env: ...}``, with
a Spark setting that references it through ``WATERMARK_SPARK_CONF``. The pipeline's
transform writes a digest of the value its session holds, so the test sees that the
reference was resolved where it is used. Then Dagster's home (files and the
zlib-compressed blobs of its SQLite storage), the watermark home and the command's output
are searched for the secret the way the S3 test searches for its key, and a GraphQL
server over the same instance is asked for its resources, runs and assets.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from dagster_graphql.test.utils import (
    define_out_of_process_context,
    execute_dagster_graphql,
    infer_repository_selector,
)
from deltalake import write_deltalake

from tests.conftest import REPO
from tests.spark.secret_probe import PROBE_SETTING
from tests.support.leaks import blobs_holding, leaks
from watermark_dagster import definitions

pytestmark = pytest.mark.spark

# Distinctive: found anywhere, it leaked. The variable's name is expected in the snapshots.
SECRET = "wm-secret-7d3f19c04be2"
VARIABLE = "WM_TEST_LAKE_SECRET"


RESOURCES = """
query Resources($selector: RepositorySelector!) {
  allTopLevelResourceDetailsOrError(repositorySelector: $selector) {
    __typename
    ... on ResourceDetailsList { results { name configuredValues { key value type } } }
  }
}
"""
RUNS = """
query Runs {
  runsOrError {
    __typename ... on Runs { results { runId status runConfigYaml tags { key value } } }
  }
}
"""
ASSETS = """
query Assets {
  assetNodes { assetKey { path } description metadataEntries { label __typename } }
}
"""


@pytest.fixture
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A registry file whose tables and control root reference the secret, one upstream
    with three rows, and the environment of a code location that holds the secret."""
    write_deltalake(
        str(tmp_path / "orders"),
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "amount": [10.0, 20.0, 30.0]}),
    )
    secret_ref = {"AWS_SECRET_ACCESS_KEY": {"env": VARIABLE}, "AWS_REGION": "eu-west-1"}
    spec = {
        "control_root": str(tmp_path / "control"),
        "control_storage_options": secret_ref,
        "upstreams": {"orders": {"path": str(tmp_path / "orders"), "storage_options": secret_ref}},
        "pipelines": {
            "probed": {
                "upstreams": ["orders"],
                "target": str(tmp_path / "probed"),
                "keys": ["id"],
                "transform": "tests.spark.secret_probe:probe",
                "storage_options": secret_ref,
            }
        },
    }
    (tmp_path / "registry.yaml").write_text(yaml.safe_dump(spec))
    home = tmp_path / "home"
    (home / "dagster").mkdir(parents=True)
    shutil.copy(REPO / "dagster.yaml", home / "dagster" / "dagster.yaml")
    env = {
        VARIABLE: SECRET,
        "WATERMARK_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "WATERMARK_REGISTRY": str(tmp_path / "registry.yaml"),
        "WATERMARK_SPARK_MASTER": "local[1]",
        "WATERMARK_SPARK_CONF": json.dumps({PROBE_SETTING: {"env": VARIABLE}}),
        "PYTHONPATH": str(REPO),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return tmp_path


# The GraphQL context's requests run in asyncio.run.
@pytest.mark.filterwarnings("ignore:coroutine 'BaseEventLoop.shutdown_asyncgens':RuntimeWarning")
def test_a_referenced_credential_is_used_and_stored_nowhere(spark: Any, lake: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "watermark_dagster.cli", "run", "--json"],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(json.loads(run.stdout)["completed"]) == 1, run.stdout

    # Used: the session was built with the secret's value, and the tables opened with it.
    target = spark.read.format("delta").load(str(lake / "probed")).collect()
    assert sorted(r["id"] for r in target) == [1, 2, 3]
    assert {r["probe"] for r in target} == {hashlib.sha256(SECRET.encode()).hexdigest()}

    # Stored nowhere: Dagster's run and job snapshots, event logs, run storage, logs,
    # the control tables, the target's log, the command's output.
    home = lake / "home"
    assert leaks(home, SECRET) == []
    assert leaks(lake / "control", SECRET) == []
    assert leaks(lake / "probed", SECRET) == []
    assert SECRET not in run.stdout + run.stderr
    # ... while the reference itself is in the snapshots: the check above searched the
    # storage the resources' configuration is written to.
    assert blobs_holding(home / "dagster" / "history" / "runs.db", VARIABLE.encode())

    # Shown nowhere: the UI's GraphQL answers about resources, runs and assets.
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(os.environ["DAGSTER_HOME"]))
    try:
        with define_out_of_process_context(definitions.__file__, "defs", instance) as context:
            selector = infer_repository_selector(context)
            resources = execute_dagster_graphql(context, RESOURCES, {"selector": selector}).data
            runs = execute_dagster_graphql(context, RUNS).data
            assets = execute_dagster_graphql(context, ASSETS).data
    finally:
        instance.dispose()
    answers = json.dumps([resources, runs, assets])
    assert SECRET not in answers
    details = resources["allTopLevelResourceDetailsOrError"]["results"]
    store = next(r for r in details if r["name"] == "watermark_store")
    spark = next(r for r in details if r["name"] == "spark")
    shown = json.dumps([store["configuredValues"], spark["configuredValues"]])
    assert VARIABLE in shown, shown  # the UI shows which variable, not its value
    assert len(runs["runsOrError"]["results"]) == 1
