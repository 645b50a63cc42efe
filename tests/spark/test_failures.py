"""How a run that fails is told apart: an error no retry can mend fails its batch once.

Spark's analyzer refusing a pipeline's query (a column that is not there) refuses again on
every attempt, so it is terminal like our own refusals: one attempt although three are
allowed, one message with the fix and no stack trace, nothing written, and the same open
batch resumed with `watermark run --retry` once the transform is fixed.
"""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.support.lakes import defs_from
from tests.support.spark_lake import Lake, open_lake, source_rows, write_ids
from watermark_dagster.dagster_defs.headless import HeadlessRunner
from watermark_dagster.observe.log import latest_local_version

pytestmark = pytest.mark.spark


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


def test_a_query_spark_refuses_fails_its_batch_once(lake: Lake) -> None:
    src = lake.path("events")
    write_ids(lake.spark, src, range(0, 20), cdf=True)
    pipe = {"name": "events_copy", "upstreams": ["events"], "target": lake.path("copy")}
    spec = lake.spec([{"name": "events", "path": src}], [{**pipe, "transform": "copy"}])
    assert lake.run(spec).completed
    write_ids(lake.spark, src, range(20, 25), cdf=True)
    before = latest_local_version(lake.path("copy"))

    spec = {**spec, "pipelines": [{**pipe, "transform": "misspelled"}], "max_attempts": 3}
    failed = lake.cli(spec, "run", "--json")
    assert failed.returncode == 1, failed.stderr
    outcome = json.loads(failed.stdout)
    assert len(outcome["runs"]) == 1, outcome["runs"]
    assert "QueryRefusedError" in outcome["runs"][0]["error"]
    assert "valeu" in outcome["stuck"]
    assert "watermark run --retry" in outcome["stuck"]
    assert "not retried" in outcome["stuck"]
    assert "Traceback" not in failed.stderr, failed.stderr
    assert latest_local_version(lake.path("copy")) == before

    spec = {**spec, "pipelines": [{**pipe, "transform": "copy"}]}
    resumed = HeadlessRunner(defs_from(spec), lake.instance).run_until_idle(retry=True)
    assert len(resumed.completed) == 1, resumed
    assert not resumed.failed_runs, resumed
    assert lake.rows("copy") == source_rows(lake, "events")
