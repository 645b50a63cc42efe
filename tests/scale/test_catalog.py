"""Upstreams and targets named by catalog table, in Spark's session catalog backed by an
embedded Hive metastore (PySpark's Hive 2.3 jars and Derby), end to end: the same spec and
transforms as the local suite (tests/support/lakes.py), only the configuration differs.

Every Spark process is a child (`watermark run`, the load-time resolution, the helper
below): embedded Derby admits one JVM at a time, and this test process starts none. The
metastore and warehouse live in the test's folder.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from tests.conftest import REPO, SPARK_TEST_CONF
from tests.support.cli import SCRIPT
from tests.support.lakes import defs_from, location_defs, location_path, write_spec
from watermark_dagster.dagster_defs.headless import HeadlessRunner
from watermark_dagster.dagster_defs.sensors import COORDINATOR
from watermark_dagster.store import WatermarkStore

pytestmark = [pytest.mark.scale, pytest.mark.e2e]


def catalog_conf(root: Path) -> dict[str, str]:
    """Spark settings of a session catalog on an embedded Hive metastore under ``root``."""
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(root / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={root / 'metastore_db'};create=true"
        ),
        # derby.log goes beside the metastore, not into the working directory.
        "spark.driver.extraJavaOptions": (
            f"{SPARK_TEST_CONF['spark.driver.extraJavaOptions']} -Dderby.system.home={root}"
        ),
    }


def _commit(path: Path, rows: dict[int, int], *, delete: list[int] = ()) -> None:
    """Upsert ``rows`` (id -> value) and delete ``delete``, in one commit each, with
    delta-rs (no JVM); the table has its change data feed on."""
    if not DeltaTable.is_deltatable(str(path)):
        write_deltalake(
            str(path),
            _rows(rows),
            configuration={"delta.enableChangeDataFeed": "true"},
        )
        return
    table = DeltaTable(str(path))
    if rows:
        (
            table.merge(_rows(rows), "t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
    for key in delete:
        table.delete(f"id = {int(key)}")


def _rows(rows: dict[int, int]) -> pa.Table:
    ids = sorted(rows)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "value": pa.array([rows[i] for i in ids], pa.int64()),
        }
    )


def _read(path: Path, sql: str = "SELECT id, value FROM t ORDER BY id") -> list[dict]:
    """A Delta table's rows through delta-rs's query engine (it applies the deletion
    vectors Spark's MERGE leaves in a target)."""
    found = QueryBuilder().register("t", DeltaTable(str(path))).execute(sql).read_all()
    return pa.table(found).to_pylist()


def _spark_child(root: Path, body: str) -> dict[str, Any]:
    """Run ``body`` in a child process with a Spark session (``spark``) on the test's
    metastore; it sets ``out``, a dict printed back as JSON."""
    script = textwrap.dedent(
        """
        import json, sys
        from watermark_dagster.runtime.spark import build_spark_session
        from watermark_dagster.read.catalog import register_table, table_location
        spark = build_spark_session(master="local[1]", conf=json.loads(sys.argv[1]))
        out = {}
        try:
        %s
        finally:
            spark.stop()
        print("OUT " + json.dumps(out))
        """
    ) % textwrap.indent(textwrap.dedent(body), "    ")
    conf = {**SPARK_TEST_CONF, **catalog_conf(root)}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(conf)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("OUT ")]
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines, done.stdout + done.stderr
    return json.loads(lines[-1][4:])


class CatalogLake:
    """The spec, its `watermark` command line and its control tables."""

    def __init__(self, root: Path, dagster_home: Path) -> None:
        self.root = root
        self.dagster_home = dagster_home
        self.spec: dict[str, Any] = {
            "control_root": str(root / "control"),
            "spark_master": "local[1]",
            "spark_conf": catalog_conf(root),
            "upstreams": [
                {"name": "up", "table": "lake.up"},
                # Three parts, the session catalog named.
                {"name": "other", "table": "spark_catalog.lake.other"},
            ],
            "pipelines": [
                # Not in the catalog yet: the first write creates and registers it.
                {"name": "up_copy", "upstreams": ["up"], "table": "lake.up_copy",
                 "transform": "copy"},
                {"name": "other_doubled", "upstreams": ["other"],
                 "target": str(root / "other_doubled"), "transform": "doubled"},
            ],
        }  # fmt: skip
        self.spec_file = write_spec(root / "spec.json", self.spec)

    @property
    def store(self) -> WatermarkStore:
        return WatermarkStore(self.spec["control_root"])

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "PYTHONPATH": location_path(self.spec_file),
            "DAGSTER_HOME": str(self.dagster_home),
        }
        return subprocess.run(
            [str(SCRIPT), *args, "--defs", location_defs(self.spec_file)],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
        )

    def run(self) -> dict[str, Any]:
        done = self.cli("run", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)


def test_catalog_upstreams_and_targets_run_batches_and_a_recreated_upstream_is_refused(
    tmp_path: Path, dagster_home: Path
) -> None:
    ext = tmp_path / "external"
    up_rows = {i: i for i in range(1, 6)}
    other_rows = {i: 10 * i for i in range(1, 4)}
    _commit(ext / "up", up_rows)
    _commit(ext / "other", other_rows)
    # The upstreams are external tables registered in the metastore (a drop keeps their
    # files: without the run's check, a batch would read the dropped table silently).
    _spark_child(
        tmp_path,
        f"""
        spark.sql("CREATE SCHEMA lake")
        register_table(spark, ("lake", "up"), {str(ext / "up")!r})
        register_table(spark, ("lake", "other"), {str(ext / "other")!r})
        """,
    )
    lake = CatalogLake(tmp_path, dagster_home)

    # Batch 1: first loads; the target named lake.up_copy is created in the schema's folder.
    assert len(lake.run()["completed"]) == 1
    # Batch 2: an update, an insert and a delete (longer histories are the default suite's).
    for round_ in (1,):
        changes = {2: 20 * round_, 6 + round_: round_}
        up_rows.update(changes)
        _commit(ext / "up", changes, delete=[round_])
        up_rows.pop(round_)
        other_rows[round_ + 1] = -round_
        _commit(ext / "other", {round_ + 1: -round_})
        second = lake.run()
        assert len(second["completed"]) == 1

    created = tmp_path / "warehouse" / "lake.db" / "up_copy"
    assert _read(created) == [{"id": i, "value": v} for i, v in sorted(up_rows.items())]
    assert _read(tmp_path / "other_doubled") == [
        {"id": i, "value": 2 * v} for i, v in sorted(other_rows.items())
    ]
    latest = {
        "up": DeltaTable(str(ext / "up")).version(),
        "other": DeltaTable(str(ext / "other")).version(),
    }
    assert lake.store.committed_versions() == latest
    batches = lake.store.batches()
    assert len(batches) == 2
    assert {b.locations["up"] for b in batches} == {str(ext / "up")}

    # What `watermark list --json` prints: `run --json` ends with the same rows (one Hive
    # JVM fewer than asking `list`).
    listed = {r["upstream"]: r for r in second["upstreams"]}
    assert (listed["up"]["table"], listed["up"]["location"]) == ("lake.up", str(ext / "up"))
    assert listed["other"]["location"] == str(ext / "other")

    # A new commit, planned against the table at external/up ...
    _commit(ext / "up", {100: 100})
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        planned = HeadlessRunner(defs_from(lake.spec), instance).tick(COORDINATOR)
    finally:
        instance.dispose()
    assert planned.run_requests
    open_batch = lake.store.open_batch()
    assert open_batch is not None
    assert open_batch.locations["up"] == str(ext / "up")

    # ... then lake.up is dropped and recreated elsewhere before the batch runs.
    _commit(ext / "up2", {1: 1})
    found = _spark_child(
        tmp_path,
        f"""
        out["up_copy"] = table_location(spark, ("lake", "up_copy"))
        spark.sql("DROP TABLE lake.up")
        register_table(spark, ("lake", "up"), {str(ext / "up2")!r})
        """,
    )
    assert found["up_copy"] == str(created)  # the first write registered the target

    versions = {p: DeltaTable(str(p)).version() for p in (created, tmp_path / "other_doubled")}
    refused = lake.cli("run")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    text = " ".join((refused.stdout + refused.stderr).split())
    assert "Upstream 'up' (catalog table `lake`.`up`) was dropped and recreated" in text, text
    assert f"the batch uses it at {ext / 'up'}" in text
    assert f"the name now points at {ext / 'up2'}" in text
    assert "watermark reset -t up --force" in text
    # Nothing written, no watermark moved, the batch still open.
    assert {p: DeltaTable(str(p)).version() for p in versions} == versions
    assert lake.store.committed_versions() == latest
    still = lake.store.open_batch()
    assert still is not None
    assert still.batch_id == open_batch.batch_id
