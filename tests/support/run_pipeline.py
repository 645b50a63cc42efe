"""Run one pipeline on one batch in this process: ``python -m tests.support.run_pipeline SPEC
PIPELINE BATCH``. The crash tests run it with WATERMARK_FAULTS set, so it is killed with
SIGKILL at the named point, as a worker would die."""

import json
import sys
from pathlib import Path

from tests.conftest import SPARK_TEST_CONF
from tests.support.lakes import registry_from
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.runtime.spark import build_spark_session
from watermark_dagster.store import WatermarkStore


def main(spec_file: str, pipeline: str, batch_id: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    spark = build_spark_session(master="local[2]", app_name="crash-child", conf=SPARK_TEST_CONF)
    execute_pipeline(
        spark=spark,
        store=WatermarkStore(spec["control_root"]),
        registry=registry_from(spec),
        pipeline_name=pipeline,
        batch_id=batch_id,
        run_id="crash-child",
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
