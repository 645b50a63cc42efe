"""SparkSessionResource takes ``spark_config`` as dagster-pyspark's resources do, without a
JVM: what reaches the session builder is checked through ``settings()`` and the runtime's
``session_settings`` (what ``build_spark_session`` applies), and through a real run whose
resource is configured from run config.
"""

from pathlib import Path

import pytest
from dagster import DagsterInstance, Definitions, asset, define_asset_job

from watermark_dagster.dagster_defs.resources import (
    SparkSessionResource,
    SparkSettings,
)
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.runtime.spark import DELTA_CONF, session_settings


def test_flat_and_nested_keys_as_dagster_pyspark_reads_them() -> None:
    resource = SparkSessionResource(
        spark_config={
            "spark.sql.shuffle.partitions": 3,
            "spark": {"driver": {"memory": "6g"}, "sql": {"adaptive": {"enabled": False}}},
        }
    )
    settings = resource.settings()
    assert settings.conf == {
        "spark.sql.shuffle.partitions": "3",
        "spark.driver.memory": "6g",
        "spark.sql.adaptive.enabled": "false",
    }
    built = session_settings(master=settings.master, conf=settings.conf)
    assert built["spark.driver.memory"] == "6g"  # over the machine-sized default
    assert built["spark.sql.adaptive.enabled"] == "false"
    assert DELTA_CONF.items() <= built.items()  # Delta stays configured


def test_master_remote_and_app_name_can_come_from_spark_config() -> None:
    """A dagster-pyspark configuration names the master as ``spark.master``: it becomes
    the session's master (so the local defaults follow it) instead of a stray setting."""
    settings = SparkSessionResource(
        spark_config={"spark.master": "spark://host:7077", "spark.app.name": "nightly"}
    ).settings()
    assert settings == SparkSettings(
        master="spark://host:7077", remote=None, app_name="nightly", conf={}
    )
    built = session_settings(master=settings.master, conf=settings.conf)
    assert "spark.driver.memory" not in built  # a cluster sizes its own driver

    connect = SparkSessionResource(spark_config={"spark.remote": "sc://host:15002"}).settings()
    assert connect.remote == "sc://host:15002"
    assert connect.conf == {}


def test_the_former_conf_field_still_works_and_merges() -> None:
    settings = SparkSessionResource(
        master="local[2]",
        conf={"spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "2"},
        spark_config={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "true"},
    ).settings()
    assert settings.master == "local[2]"
    assert settings.conf == {
        "spark.driver.memory": "2g",
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "true",
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param(
            {
                "conf": {"spark.driver.memory": "2g"},
                "spark_config": {"spark": {"driver": {"memory": "4g"}}},
            },
            "sets spark.driver.memory twice: '2g' in conf and '4g' in spark_config",
            id="conf-and-spark_config-disagree",
        ),
        pytest.param(
            {"master": "local[2]", "spark_config": {"spark.master": "local[4]"}},
            "has master='local[2]' but spark_config sets it to 'local[4]'",
            id="master-field-and-key-disagree",
        ),
        pytest.param(
            {"app_name": "a", "spark_config": {"spark.app.name": "b"}},
            "has app_name='a' but spark_config sets it to 'b'",
            id="app-name-field-and-key-disagree",
        ),
    ],
)
def test_contradictions_are_refused_when_the_resource_is_built(fields: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SparkSessionResource(**fields)


def test_run_config_configures_it_and_a_step_that_never_asks_starts_no_jvm(
    tmp_path: Path, dagster_home: Path
) -> None:
    """``spark_config`` from run config (as the launchpad sends it, nested keys included)
    reaches the resource in the run; the session stays unbuilt until asked for."""
    seen: dict[str, object] = {}

    @asset
    def reads_settings(spark: SparkSessionResource) -> None:
        seen["settings"] = spark.settings()
        # This resource built no session (the process may hold another test's JVM).
        seen["built"] = spark._session is not None

    job = define_asset_job("settings_job", selection=[reads_settings])
    defs = Definitions(
        assets=[reads_settings],
        jobs=[job],
        resources={"spark": SparkSessionResource.configure_at_launch()},
    )
    run_config = {
        "resources": {
            "spark": {
                "config": {
                    "spark_config": {"spark": {"master": "local[1]", "driver": {"memory": "1g"}}}
                }
            }
        }
    }
    with DagsterInstance.get() as instance:
        result = defs.resolve_job_def("settings_job").execute_in_process(
            instance=instance, run_config=run_config
        )
    assert result.success
    assert seen["settings"] == SparkSettings(
        master="local[1]",
        remote=None,
        app_name="watermark-dagster",
        conf={"spark.driver.memory": "1g"},
    )
    assert seen["built"] is False
