"""`watermark verify` with real Spark: after a demo batch, then after a target row is
changed and another deleted (the CLI's no-JVM tests are in tests/dagster/test_cli.py)."""

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import SCRIPT, control_versions, home_env
from watermark_dagster.demo import DemoPaths

# A story of the console script in its own processes: the e2e tier's (pyproject.toml).
pytestmark = pytest.mark.e2e


@pytest.mark.spark
def test_verify_finds_a_changed_target_row(spark, tmp_path: Path, dagster_home: Path) -> None:
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    from tests.conftest import SPARK_TEST_CONF
    from watermark_dagster.dagster_defs.definitions import build_definitions
    from watermark_dagster.dagster_defs.headless import HeadlessRunner
    from watermark_dagster.dagster_defs.resources import SparkSessionResource
    from watermark_dagster.demo import build_demo_registry, seed

    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    defs = build_definitions(
        build_demo_registry(paths),
        control_root=paths.control_root,
        spark=SparkSessionResource(master="local[2]", conf=SPARK_TEST_CONF),
    )
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        assert HeadlessRunner(defs, instance).run_until_idle().completed == ["b000001"]
    finally:
        instance.dispose()
    env = home_env(
        paths.home,
        DAGSTER_HOME=str(dagster_home),
        WATERMARK_SPARK_MASTER="local[1]",
        WATERMARK_SPARK_CONF=json.dumps(SPARK_TEST_CONF),
    )

    def verify() -> tuple[int, dict]:
        out = subprocess.run(
            [str(SCRIPT), "verify", "-p", "orders_enriched", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        assert out.returncode in (0, 1), out.stderr[-3000:]
        return out.returncode, json.loads(out.stdout)

    before = control_versions(paths.home)
    rc, report = verify()
    assert rc == 0, report
    assert report["equal"], report
    assert report["versions"] == {"orders": 0, "customers": 0}
    assert report["target_rows"] == report["recompute_rows"] > 2
    assert report["target_checksum"] == report["recompute_checksum"]

    # Change one target row and delete another, behind the pipeline's back (with Spark:
    # the target is clustered, a table feature delta-rs does not write).
    from delta.tables import DeltaTable as SparkDeltaTable

    target = SparkDeltaTable.forPath(spark, paths.target("orders_enriched"))
    ids = sorted(r["order_id"] for r in target.toDF().select("order_id").collect())
    first, second = ids[:2]
    target.update(f"order_id = {first}", {"customer_name": "'tampered'"})
    target.delete(f"order_id = {second}")
    rc, report = verify()
    assert rc == 1
    assert not report["equal"]
    assert (report["target_rows"], report["recompute_rows"]) == (
        report["recompute_rows"] - 1,
        report["recompute_rows"],
    )
    assert (report["only_in_target"], report["only_in_recompute"]) == (1, 2)
    assert report["example_keys"]["only_in_target"] == [{"order_id": first}]
    assert sorted(k["order_id"] for k in report["example_keys"]["only_in_recompute"]) == [
        first,
        second,
    ]
    assert control_versions(paths.home) == before  # verify reads only
