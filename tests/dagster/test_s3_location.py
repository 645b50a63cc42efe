"""A code location with tables on S3 gets Spark's s3a settings (and so hadoop-aws); one
without keeps its Spark resource as it was. No JVM, no server: the settings only."""

import pytest

from watermark_dagster.config.pipeline import pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.dagster_defs.definitions import build_location
from watermark_dagster.dagster_defs.resources import SparkSessionResource
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.runtime.storage import S3A_IMPL_KEY, needs_s3_jars


def _registry(up: str, target: str, options: dict[str, str] | None = None) -> Registry:
    @pipeline(upstreams=["up"], target=target, keys=["id"], storage_options=options)
    def copy(batch):
        return batch["up"].changes

    return Registry(
        upstreams=[DeltaUpstream(name="up", path=up, storage_options=options)], pipelines=[copy]
    )


def test_tables_on_s3_add_s3a_settings_under_the_users_conf(monkeypatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    options = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true"}
    spark = SparkSessionResource(
        master="local[1]", conf={"spark.hadoop.fs.s3a.endpoint.region": "us-east-1"}
    )
    location = build_location(
        _registry("s3://raw/up", "s3a://lake/out", options),
        control_root="/tmp/control-unused",
        spark=spark,
    )
    settings = location.spark_resource.settings()
    assert settings.master == "local[1]"
    conf = settings.conf
    assert needs_s3_jars(conf)
    assert conf["spark.hadoop.fs.s3.impl"] == conf[S3A_IMPL_KEY]
    assert conf["spark.hadoop.fs.s3a.bucket.raw.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.bucket.lake.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"  # the user's wins


def test_a_local_location_keeps_its_spark_resource() -> None:
    spark = SparkSessionResource(master="local[1]")
    location = build_location(
        _registry("/lake/up", "/lake/out"), control_root="/tmp/control-unused", spark=spark
    )
    assert location.spark_resource is spark
    assert not needs_s3_jars(location.spark_resource.settings().conf)


def test_one_bucket_with_two_endpoints_is_refused_when_the_definitions_load() -> None:
    @pipeline(
        upstreams=["up"],
        target="s3://raw/out",
        keys=["id"],
        storage_options={"AWS_ENDPOINT_URL": "http://b:9000"},
    )
    def copy(batch):
        return batch["up"].changes

    registry = Registry(
        upstreams=[
            DeltaUpstream(
                name="up", path="s3://raw/up", storage_options={"AWS_ENDPOINT_URL": "http://a:9000"}
            )
        ],
        pipelines=[copy],
    )
    with pytest.raises(ConfigurationError, match="upstream 'up' and pipeline 'copy' target"):
        build_location(registry, control_root="/tmp/control-unused")
