"""Catalog names when a code location loads, and the locations a plan records; no JVM
(resolution against a real metastore is in tests/scale/test_catalog.py)."""

from pathlib import Path

import pyarrow as pa
import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from deltalake import write_deltalake

from tests.lakes import defs_from
from watermark_dagster.dagster_defs.headless import HeadlessRunner
from watermark_dagster.dagster_defs.sensors import COORDINATOR
from watermark_dagster.errors import ConfigurationError
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
