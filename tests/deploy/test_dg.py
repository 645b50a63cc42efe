"""`dg check defs` and `dg list defs` accept the project as it is shipped ([tool.dg] in
pyproject.toml), run as a user runs them: the `dg` console script in the project root, on a
fresh DAGSTER_HOME and WATERMARK_HOME, with a JAVA_HOME that records any JVM launch (loading
the code location must start none).
"""

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from watermark_dagster.definitions import build_demo_location

DG = Path(sys.executable).with_name("dg")


def _dg(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DG), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_dg_check_defs_passes_without_a_jvm(dg_env: tuple[dict[str, str], Path]) -> None:
    env, launches = dg_env
    done = _dg(env, "check", "defs")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All definitions loaded successfully." in done.stdout
    assert not launches.exists(), f"loading the code location started a JVM: {launches.read_text()}"


def test_dg_list_defs_lists_pipelines_upstreams_sensors_and_checks(
    dg_env: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, launches = dg_env
    done = _dg(env, "list", "defs", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not launches.exists(), f"loading the code location started a JVM: {launches.read_text()}"
    listed = json.loads(done.stdout)

    # What workspace.yaml's code location defines, built here (no JVM) on the same demo.
    location = build_demo_location(tmp_path / "expected_home")
    defs = location.definitions
    registry = location.registry
    pipelines = set(registry.pipelines)
    upstreams = set(registry.upstreams)
    assert pipelines
    assert upstreams

    assets = {a["asset_key"] for a in listed["assets"]}
    assert pipelines | upstreams <= assets
    assert assets == {spec.key.to_user_string() for spec in defs.resolve_all_asset_specs()}

    checks = {c["key"] for c in listed["asset_checks"]}
    expected_checks = {
        f"{key.asset_key.to_user_string()}:{key.name}"
        for key in defs.resolve_asset_graph().asset_check_keys
    }
    assert expected_checks
    assert checks == expected_checks

    sensors = {s["name"] for s in listed["sensors"]}
    assert {"watermark_coordinator", "watermark_finalizer"} <= sensors
    assert sensors == {s.name for s in defs.sensors or []}
