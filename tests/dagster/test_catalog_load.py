"""Catalog names when a code location loads, the locations a plan records, and an upstream
whose table the load did not find; no JVM (resolution against a real metastore is in
tests/scale/test_catalog.py, against Spark's in-memory catalog in tests/spark/test_catalog.py)."""

from pathlib import Path

import pyarrow as pa
import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from deltalake import write_deltalake

from tests.support.lakes import defs_from, registry_from
from watermark_dagster.dagster_defs.headless import HeadlessRunner
from watermark_dagster.dagster_defs.sensors import COORDINATOR
from watermark_dagster.errors import ConfigurationError, UpstreamUnavailableError
from watermark_dagster.observe.observer import Observer, observe_registry
from watermark_dagster.observe.retention import check_retention
from watermark_dagster.store import WatermarkStore


def _spec(tmp_path: Path, upstream: dict) -> dict:
    return {
        "control_root": str(tmp_path / "control"),
        "spark_master": "no-such-master",  # any Spark start fails
        "upstreams": [upstream],
        "pipelines": [
            {"name": "up_copy", "upstreams": ["up"], "target": str(tmp_path / "up_copy"),
             "transform": "copy"},
        ],
    }  # fmt: skip


def test_a_catalog_that_cannot_be_reached_stops_the_load_naming_the_tables(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        defs_from(_spec(tmp_path, {"name": "up", "table": "lake.up"}))
    text = str(raised.value)
    assert text.startswith("Could not resolve the catalog tables `lake`.`up`: the Spark process")
    assert raised.value.fix is not None
    assert "WATERMARK_SPARK_CONF" in raised.value.fix
    assert not (tmp_path / "control").exists()  # nothing written


def test_a_plan_records_where_each_upstream_was_observed(
    tmp_path: Path, dagster_home: Path
) -> None:
    up = tmp_path / "up"
    write_deltalake(str(up), pa.table({"id": pa.array([1], pa.int64()), "value": [1]}))
    defs = defs_from(_spec(tmp_path, {"name": "up", "path": str(up)}))
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        assert HeadlessRunner(defs, instance).tick(COORDINATOR).run_requests
    finally:
        instance.dispose()
    batch = WatermarkStore(str(tmp_path / "control")).open_batch()
    assert batch is not None
    assert batch.locations == {"up": str(up)}


def test_an_upstream_table_missing_at_load_blocks_only_its_pipelines(tmp_path: Path) -> None:
    # What the load leaves when the catalog has no table `lake`.`up`: the name unresolved
    # (the Spark side: tests/spark/test_catalog.py).
    other = tmp_path / "other"
    write_deltalake(str(other), pa.table({"id": pa.array([1], pa.int64()), "value": [1]}))
    registry = registry_from(
        {
            "upstreams": [{"name": "up", "table": "lake.up"},
                          {"name": "other", "path": str(other)}],
            "pipelines": [
                {"name": "up_copy", "upstreams": ["up"], "target": str(tmp_path / "a"),
                 "transform": "copy"},
                {"name": "other_copy", "upstreams": ["other"], "target": str(tmp_path / "b"),
                 "transform": "copy"},
            ],
        }
    )  # fmt: skip
    look = observe_registry(registry, Observer(), {})
    assert set(look.runnable) == {"other_copy"}
    assert set(look.observed) == {"other"}
    error = look.errors["up"]
    assert error.startswith("Upstream 'up': catalog table `lake`.`up` does not exist"), error
    assert "Fix: create `lake`.`up`" in error
    assert "reload the code location" in error
    # The retention check says the same, not "at ''".
    with pytest.raises(UpstreamUnavailableError) as raised:
        check_retention(registry.upstreams["up"], committed=None)
    assert str(raised.value) == error
