"""Spark settings a user can trust: defaults sized for the machine, every one overridable,
and a 2M-row first load that succeeds at the defaults."""

import json
from pathlib import Path

import pytest

from watermark_dagster.runtime.spark import (
    DELTA_CONF,
    default_driver_memory,
    local_cores,
    session_settings,
    spark_defaults,
)

GIB = 1024**3


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        pytest.param(2 * GIB, "1024m", id="small-machine-gets-spark-minimum"),
        pytest.param(8 * GIB, "2048m", id="quarter-of-ram"),
        pytest.param(24 * GIB, "4096m", id="capped"),
        pytest.param(256 * GIB, "4096m", id="large-machine-capped"),
    ],
)
def test_driver_memory_is_a_quarter_of_ram_between_1_and_4_gib(memory: int, expected: str) -> None:
    assert default_driver_memory(memory) == expected


@pytest.mark.parametrize(
    ("master", "cores"),
    [("local", 1), ("local[3]", 3), ("local[3,2]", 3), ("local[*]", None)],
)
def test_local_cores(master: str, cores: int | None) -> None:
    import os

    assert local_cores(master) == (cores or os.cpu_count())


def test_local_defaults_name_memory_shuffle_partitions_and_adaptive_execution() -> None:
    local = spark_defaults(master="local[3]")
    assert local["spark.driver.memory"] == default_driver_memory()
    assert local["spark.sql.shuffle.partitions"] == "6"
    assert local["spark.sql.adaptive.enabled"] == "true"
    assert local["spark.sql.adaptive.coalescePartitions.enabled"] == "true"
    assert spark_defaults(master="local[1]")["spark.sql.shuffle.partitions"] == "4"
    # A cluster sizes its own driver and keeps Spark's shuffle default, which adaptive
    # execution coalesces; a Connect client can only set session-level SQL settings.
    cluster = spark_defaults(master="spark://host:7077")
    assert "spark.driver.memory" not in cluster
    assert "spark.sql.shuffle.partitions" not in cluster
    assert cluster["spark.sql.adaptive.enabled"] == "true"
    assert spark_defaults(remote="sc://host:15002") == {"spark.sql.session.timeZone": "UTC"}


def test_user_settings_override_every_default() -> None:
    settings = session_settings(
        master="local[2]",
        conf={
            "spark.driver.memory": "8g",
            "spark.sql.shuffle.partitions": "64",
            "spark.sql.adaptive.enabled": "false",
        },
    )
    assert settings["spark.driver.memory"] == "8g"
    assert settings["spark.sql.shuffle.partitions"] == "64"
    assert settings["spark.sql.adaptive.enabled"] == "false"
    assert DELTA_CONF.items() <= settings.items()


def test_watermark_spark_conf_reaches_the_code_locations_resource(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from watermark_dagster.definitions import build_demo_definitions

    monkeypatch.setenv("WATERMARK_SPARK_CONF", json.dumps({"spark.driver.memory": "6g"}))
    resource = build_demo_definitions(tmp_path).resources["spark"]
    settings = session_settings(master=resource.master, conf=resource.conf)  # type: ignore[union-attr]
    assert settings["spark.driver.memory"] == "6g"


@pytest.mark.parametrize(
    ("text", "conflict"),
    [
        ("[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] Transaction conflict detected.", True),
        ("io.delta.exceptions.ConcurrentDeleteReadException: This transaction ...", True),
        ("[DELTA_METADATA_CHANGED] MetadataChangedException: The metadata ...", True),
        ("[DELTA_CONCURRENT_TRANSACTION] ConcurrentTransactionException: ...", True),
        ("[DELTA_TABLE_NOT_FOUND] Delta table `x` doesn't exist.", False),
        ("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column ... cannot be resolved.", False),
    ],
)
def test_only_delta_concurrent_modification_conflicts_are_written_again(
    text: str, conflict: bool
) -> None:
    from watermark_dagster.frames.delta import is_write_conflict

    assert is_write_conflict(RuntimeError(text)) is conflict


def test_a_python_location_without_spark_reads_the_spark_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build_location(registry, control_root=...)`` with no ``spark=`` honours
    WATERMARK_SPARK_MASTER, WATERMARK_SPARK_REMOTE and WATERMARK_SPARK_CONF as a registry
    file's location does; a resource given explicitly is kept as it is."""
    from watermark_dagster.dagster_defs.definitions import build_location
    from watermark_dagster.dagster_defs.resources import SparkSessionResource
    from watermark_dagster.demo import DemoPaths, build_demo_registry

    registry = build_demo_registry(DemoPaths(tmp_path))
    monkeypatch.setenv("WATERMARK_SPARK_MASTER", "local[3]")
    monkeypatch.setenv("WATERMARK_SPARK_CONF", json.dumps({"spark.driver.memory": "6g"}))
    location = build_location(registry, control_root=str(tmp_path / "control"))
    settings = location.spark_resource.settings()
    assert settings.master == "local[3]"
    assert settings.conf["spark.driver.memory"] == "6g"
    given = SparkSessionResource(master="local[1]")
    kept = build_location(registry, control_root=str(tmp_path / "control"), spark=given)
    assert kept.spark_resource.settings().master == "local[1]"
    assert "spark.driver.memory" not in kept.spark_resource.settings().conf
