"""A batch run finalizes its own batch in its last step, and the finalizer sensor, the
backstop, repeating it changes nothing (settings.finalize "run", the default; "sensor"
leaves it to the sensor alone)."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests.support.lakes import defs_from, registry_from
from tests.support.spark_lake import Lake, open_lake, source_rows, write_ids
from watermark_dagster.core.records import BatchStatus
from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
from watermark_dagster.dagster_defs.names import COORDINATOR, FINALIZER
from watermark_dagster.operations.coordinate import finalize_batch
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.spark


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


def _two_copies(lake: Lake, **settings: Any) -> dict[str, Any]:
    for name in ("a", "b"):
        write_ids(lake.spark, lake.path(name), range(0, 10), cdf=True)
    upstreams = [{"name": n, "path": lake.path(n)} for n in ("a", "b")]
    pipelines = [
        {
            "name": f"{n}_copy",
            "upstreams": [n],
            "target": lake.path(f"{n}_copy"),
            "transform": "copy",
        }
        for n in ("a", "b")
    ]
    return {**lake.spec(upstreams, pipelines), **settings}


def _events(store: WatermarkStore, batch_id: str) -> list[str]:
    return sorted(h["event"] for h in store.history(batch_id=batch_id))


@pytest.mark.parametrize("where", ["run", "sensor"])
def test_the_batch_run_finalizes_its_batch_and_the_sensor_repeating_it_changes_nothing(
    lake: Lake, where: str
) -> None:
    spec = _two_copies(lake, finalize=where)
    assert lake.run(spec).completed == ["b000001"]  # the first loads
    for name in ("a", "b"):
        write_ids(lake.spark, lake.path(name), range(10, 15), cdf=True)
    runner = HeadlessRunner(defs_from(spec), lake.instance)
    requested = runner.tick(COORDINATOR)
    planned = lake.store.open_batch()
    assert planned is not None
    assert set(planned.pipelines) == {"a_copy", "b_copy"}
    report = CycleReport()
    runner.execute_requests(requested, report)  # the batch's run, and no sensor tick
    assert [r.success for r in report.runs] == [True]

    batch = lake.store.get_batch(planned.batch_id)
    if where == "sensor":  # left to the finalizer: the runs moved no watermark
        assert batch.status is BatchStatus.PLANNED
        assert lake.store.committed_versions() == {"a": 0, "b": 0}
        runner.tick(FINALIZER)
        batch = lake.store.get_batch(planned.batch_id)
    assert batch.status is BatchStatus.COMPLETED
    assert lake.store.committed_versions() == {"a": 1, "b": 1}
    events = _events(lake.store, planned.batch_id)
    assert events.count("WATERMARK_ADVANCED") == 2, events
    assert events.count("BATCH_COMPLETED") == 1, events

    # The finalizer's tick after it, and a twin that read the batch while it was open (a
    # sensor tick racing the run), find everything done and commit nothing.
    twin = WatermarkStore(lake.control_root)
    step = finalize_batch(twin, planned, registry=registry_from(spec), actor="sensor:twin")
    assert step.complete
    assert twin.scans.commits == 0
    runner.tick(FINALIZER)
    assert _events(lake.store, planned.batch_id) == events
    assert lake.store.committed_versions() == {"a": 1, "b": 1}
    for name in ("a", "b"):
        assert lake.rows(f"{name}_copy") == source_rows(lake, name)
