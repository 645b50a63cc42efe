"""A landing folder of 10,000 small files loaded by one batch, with real Spark, Delta and
Dagster (minutes on a loaded machine, hence the scale tier; the pinning itself is covered
without Spark in tests/store/test_landing_log.py)."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import SparkSession

from tests.support.lakes import registry_from
from tests.support.landing import landing_spec
from tests.support.spark_lake import Lake, batch_metadata, open_lake
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.observe.observer import Observer

pytestmark = [pytest.mark.spark, pytest.mark.scale, pytest.mark.e2e]


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


def test_ten_thousand_small_files_in_one_batch(lake: Lake) -> None:
    """10,000 files pinned by one batch: the plan records a range of two numbers, not the
    file list, and a look with nothing new reads no row of the file log."""
    folder = lake.root / "landing"
    folder.mkdir()
    for i in range(10_000):
        (folder / f"part-{i:05d}.json").write_text(f'{{"id": {i}, "value": {i * 2}}}\n')
    spec = landing_spec(lake, folder, format="json", file_schema="id BIGINT, value BIGINT")
    [batch_id] = lake.run(spec).completed
    batch = lake.store.get_batch(batch_id)
    assert batch.inputs["drops"].range == VersionRange(0, 10_000)
    assert batch_metadata(lake, "drops_copy", batch_id)["drops/rows_read"] == 10_000
    assert lake.table("copy").count() == 10_000
    assert lake.table("copy").where("value != id * 2").count() == 0

    # What the plan row holds for the upstream: a range, a few hundred bytes in all.
    rows = RsDeltaTable(f"{spec['control_root']}/batches").to_pyarrow_table().to_pylist()
    [row] = [r for r in rows if r["batch_id"] == batch_id and r["upstream"] == "drops"]
    assert len(json.dumps(row, default=str)) < 1_000
    # What a sensor tick's look reads of the file log: nothing while it did not move.
    observer = Observer()
    upstream = registry_from(spec).upstreams["drops"]
    assert isinstance(upstream, LandingUpstream)
    assert observer.observe(upstream, floor=0).latest_version == 10_000
    log = observer.file_log(upstream)
    assert log.rows_read == 10_000  # the first look of a process reads the log once
    assert observer.observe(upstream, floor=0).latest_version == 10_000
    assert log.rows_read == 10_000  # the next looks read no row
