"""A folder of Delta tables driven by real Spark and the real sensors: the read-mode and
target-writing tests (tests/spark/test_read_modes.py, tests/spark/test_writes.py) build
their code locations from specs over it (tests/support/lakes.py) and read back what the
runs wrote."""

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance
from dagster._core.instance.ref import InstanceRef
from pyspark.sql import DataFrame, SparkSession

from tests.support.cli import SCRIPT
from tests.support.console import watermark_main as console_main
from tests.support.lakes import defs_from, location_defs, location_path, write_spec
from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
from watermark_dagster.store import WatermarkStore


@dataclass
class Lake:
    """The tables under ``root``, the Spark session that reads them and the Dagster instance
    their code locations run in."""

    root: Path
    spark: SparkSession
    instance: DagsterInstance

    @property
    def control_root(self) -> str:
        return str(self.root / "control")

    @property
    def store(self) -> WatermarkStore:
        return WatermarkStore(self.control_root)

    def path(self, name: str) -> str:
        return str(self.root / name)

    def spec(self, upstreams: list[dict], pipelines: list[dict]) -> dict[str, Any]:
        return {"control_root": self.control_root, "upstreams": upstreams, "pipelines": pipelines}

    def run(self, spec: dict[str, Any]) -> CycleReport:
        return HeadlessRunner(defs_from(spec), self.instance).run_until_idle()

    def table(self, name: str) -> DataFrame:
        return self.spark.read.format("delta").load(self.path(name))

    def rows(self, name: str) -> dict[int, Any]:
        """ID -> value of a table, failing on a duplicated id."""
        found = [(r["id"], r["value"]) for r in self.table(name).select("id", "value").collect()]
        ids = [i for i, _ in found]
        assert len(ids) == len(set(ids)), f"duplicated ids in {name}"
        return dict(found)

    def cli(
        self, spec: dict[str, Any], *args: str, process: bool = False
    ) -> subprocess.CompletedProcess:
        """``watermark ARGS`` on ``spec``'s code location: in this process, on the test's
        Spark session (:mod:`tests.support.console`), or as a process of its own with ``process``
        (a replay that runs: its executor stops the command's Spark session)."""
        spec_file = write_spec(self.root / "spec.json", spec)
        env = {
            **os.environ,
            "PYTHONPATH": location_path(spec_file),
            "DAGSTER_HOME": os.environ["DAGSTER_HOME"],
        }
        argv = [*args, "--defs", location_defs(spec_file)]
        if not process:
            return console_main(argv, env)
        return subprocess.run(
            [str(SCRIPT), *argv], env=env, capture_output=True, text=True, timeout=600
        )


@contextlib.contextmanager
def open_lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    """A :class:`Lake` in ``tmp_path`` on ``spark``, its instance in ``dagster_home`` (disposed
    on leaving)."""
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        yield Lake(tmp_path, spark, instance)
    finally:
        instance.dispose()


def id_frame(spark: SparkSession, ids: range, value: int = 1) -> DataFrame:
    """Rows (``id``, ``value`` = ``value * id``) for ``ids``, in one partition."""
    return spark.createDataFrame([(i, value * i) for i in ids], "id long, value long").coalesce(1)


def write_ids(
    spark: SparkSession, path: str, ids: range, *, cdf: bool, mode: str = "append"
) -> None:
    """Write :func:`id_frame` rows for ``ids`` to the Delta table at ``path`` (``mode``), with
    change data feed on when ``cdf``."""
    writer = id_frame(spark, ids).write.format("delta").mode(mode)
    if cdf:
        writer = writer.option("delta.enableChangeDataFeed", "true")
    writer.save(path)


def batch_metadata(lake: Lake, asset: str, batch_id: str) -> dict[str, Any]:
    """The metadata values of ``asset``'s materialization for the batch ``batch_id``."""
    records = lake.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[batch_id]), limit=1
    ).records
    assert records, f"no materialization of {asset} for {batch_id}"
    meta = records[0].asset_materialization.metadata  # type: ignore[union-attr]
    return {k: getattr(v, "value", v) for k, v in meta.items()}


def source_rows(lake: Lake, name: str) -> dict[int, Any]:
    """ID -> value of the table ``name`` of ``lake``."""
    return {r["id"]: r["value"] for r in lake.table(name).select("id", "value").collect()}
