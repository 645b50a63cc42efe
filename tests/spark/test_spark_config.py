"""``spark_config`` reaches the Spark session the resource builds (one local session)."""

import pytest
from dagster import build_init_resource_context

from tests.conftest import SPARK_TEST_CONF
from watermark_dagster.dagster_defs.resources import SparkSessionResource

pytestmark = pytest.mark.spark


def test_nested_spark_config_reaches_the_session() -> None:
    resource = SparkSessionResource(
        spark_config={
            "spark.master": "local[1]",
            **SPARK_TEST_CONF,
            # A setting of our own, so a session that already existed in this test process
            # (runtime settings still apply to it) proves the point as well as a new one.
            "spark": {"watermark": {"test": {"marker": "nested-ok"}}},
        }
    )
    with resource.yield_for_execution(build_init_resource_context()) as ready:
        session = ready.get_session()
        assert session.conf.get("spark.watermark.test.marker") == "nested-ok"
        # Delta is configured as with the former conf field.
        assert session.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
