"""The demo's pipelines end to end on S3 (moto's server on loopback): upstreams, targets
and the control root at s3:// URIs through a registry file, batches run headless by
``watermark run`` (Spark through s3a, delta-rs for the control tables and observation),
targets equal to a recompute, watermarks at the upstreams' latest versions, and the
credentials written nowhere. Each step runs in its own process (one JVM each)."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from tests.conftest import REPO, SPARK_TEST_CONF
from tests.scale.s3_demo import KEY_PATHS, KEYS, UPSTREAMS, S3DemoPaths
from tests.scale.s3server import S3Server, running_s3_server
from tests.support.leaks import leaks
from watermark_dagster.store import WatermarkStore

pytestmark = [pytest.mark.scale, pytest.mark.e2e]

# A secret no code path has any reason to copy: found anywhere, it leaked.
SECRET = "wm-s3-secret-4f1c9e7a2b"


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    with running_s3_server(tmp_path, secret_key=SECRET) as server:
        yield server


def _env(s3: S3Server, home: Path, registry: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WATERMARK_"))}
    env.update(s3.environ())  # the credentials: from the environment only
    env.update(
        PYTHONPATH=str(REPO),
        WATERMARK_HOME=str(home),
        DAGSTER_HOME=str(home / "dagster"),
        WATERMARK_REGISTRY=str(registry),
        WATERMARK_SPARK_MASTER="local[1]",
        # The tests' small-data and quick-JVM settings (tests/conftest.py) for the run
        # processes too; the test's own steps (tests/scale/s3_demo.py) use them already.
        WATERMARK_SPARK_CONF=json.dumps(SPARK_TEST_CONF),
    )
    return env


def _step(args: list[str], env: dict[str, str], log: Path) -> str:
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    with log.open("a") as out:
        out.write(f"$ {' '.join(args)}\n{done.stdout}\n{done.stderr}\n")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _registry(path: Path, s3: S3Server, paths: S3DemoPaths) -> None:
    # Non-secret options only: the endpoint reaches delta-rs through storage_options (and
    # Spark through the per-bucket s3a settings they map to); the keys stay in the env.
    options = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ALLOW_HTTP": "true"}
    spec = {
        "control_root": paths.control_root,
        "control_storage_options": options,
        "upstreams": {
            name: {"path": paths.upstream(name), "storage_options": options}
            for name in ("customers", "orders", "payments")
        },
        "pipelines": {
            name: {
                # Declared, as in the README: key paths and the demo's full transform.
                "upstreams": KEY_PATHS[name],
                "target": paths.target(name),
                "keys": KEYS[name],
                "full": f"watermark_dagster.demo.pipelines:full_{name}",
                "storage_options": options,
            }
            for name in ("orders_enriched", "customer_payments")
        },
    }
    # A round commits three versions to orders (insert, update, delete): read 2 at a time,
    # one `watermark run` (one JVM) runs two batches.
    spec["upstreams"]["orders"]["max_versions_per_batch"] = 2
    path.write_text(yaml.safe_dump(spec))


def test_demo_pipelines_on_s3_run_headless_and_match_a_recompute(
    s3: S3Server, tmp_path: Path
) -> None:
    paths = S3DemoPaths(home=tmp_path, prefix=s3.uri("lake"))
    registry = tmp_path / "registry.yaml"
    _registry(registry, s3, paths)
    home = tmp_path / "home"
    env = _env(s3, home, registry)
    log = tmp_path / "steps.log"
    demo = [sys.executable, "-m", "tests.scale.s3_demo", paths.prefix]
    run = [sys.executable, "-m", "watermark_dagster.cli", "run", "--json"]

    _step([*demo, "seed"], env, log)
    first = json.loads(_step(run, env, log))
    _step([*demo, "rounds", "1"], env, log)
    second = json.loads(_step(run, env, log))
    assert len(first["completed"]) == 1
    assert len(second["completed"]) >= 2, second["completed"]

    checks = json.loads(_step([*demo, "verify"], env, log).strip().splitlines()[-1])
    assert [c["target"] for c in checks] == ["orders_enriched", "customer_payments"]
    assert all(c["ok"] and c["rows"] > 0 for c in checks), checks

    # Watermarks at the upstreams' latest versions, read back from the server.
    os.environ.update(s3.environ())
    try:
        store = WatermarkStore(paths.control_root)
        latest = {
            n: DeltaTable(paths.upstream(n)).version()
            for n in UPSTREAMS["orders_enriched"] + ["payments"]
        }
        assert store.committed_versions() == latest
        # Everything lives on the server: nothing of the lake or control root on disk.
        keys = s3.keys("lake/")
        assert any(k.startswith("lake/control/committed_watermarks/_delta_log/") for k in keys)
        assert any(k.startswith("lake/demo/targets/orders_enriched/_delta_log/") for k in keys)

        # The secret key is written nowhere: control tables' rows and logs, history,
        # targets' and upstreams' logs, Dagster's run and event records, log files.
        rows = [
            WatermarkStore(paths.control_root).history(),
            [b.__dict__ for b in store.batches()],
            store.checkpoints(),
        ]
        assert SECRET not in repr(rows)
        in_bucket = [k for k in keys if "/_delta_log/" in k and SECRET.encode() in s3.read(k)]
        assert in_bucket == []
    finally:
        for key in s3.environ():
            os.environ.pop(key, None)
    assert leaks(home, SECRET) == []
    assert SECRET not in log.read_text()
    assert SECRET not in registry.read_text()
