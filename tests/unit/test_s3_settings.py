"""Spark's settings for tables on S3 (runtime/storage.py): s3a for s3:// and s3a://, the
endpoint and region delta-rs reads, each table's storage options per bucket, credentials
from the environment, and hadoop-aws only for a location that needs it."""

import pytest

from watermark_dagster.errors import ConfigurationError
from watermark_dagster.runtime import spark as spark_module
from watermark_dagster.runtime.storage import (
    S3A_IMPL_KEY,
    hadoop_version,
    needs_s3_jars,
    s3_packages,
    spark_s3_settings,
)

ENV = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1"}


def test_no_table_on_s3_means_no_settings_and_no_hadoop_aws() -> None:
    settings = spark_s3_settings([("upstream 'a'", "/lake/a", None)], environ=ENV)
    assert settings == {}
    assert not needs_s3_jars(settings)


@pytest.mark.parametrize("uri", ["s3://lake/a", "s3a://lake/a", "S3://lake/a"])
def test_s3_and_s3a_paths_go_through_s3a_with_the_environment_endpoint(uri: str) -> None:
    settings = spark_s3_settings([("upstream 'a'", uri, None)], environ=ENV)
    assert settings["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert settings[S3A_IMPL_KEY] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert settings["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert settings["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert settings["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    provider = settings["spark.hadoop.fs.s3a.aws.credentials.provider"]
    assert "EnvironmentVariableCredentialsProvider" in provider
    assert needs_s3_jars(settings)
    # No credential is written into the settings: they are read from the environment.
    assert not any(k.endswith(("access.key", "secret.key", "session.token")) for k in settings)


def test_without_an_endpoint_aws_s3_is_used_with_virtual_hosts() -> None:
    settings = spark_s3_settings([("t", "s3://lake/a", None)], environ={})
    assert not any(k.endswith(("endpoint", "path.style.access")) for k in settings)


def test_storage_options_become_per_bucket_s3a_settings() -> None:
    options = {
        "AWS_ENDPOINT_URL": "https://minio.internal:9000",
        "aws_region": "us-east-2",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "example-secret",
        "AWS_ALLOW_HTTP": "true",  # delta-rs only
        "conditional_put": "etag",  # delta-rs only
        "fs.s3a.connection.maximum": "64",
    }
    settings = spark_s3_settings([("upstream 'a'", "s3://raw/a", options)], environ={})
    bucket = "spark.hadoop.fs.s3a.bucket.raw."
    assert {k.removeprefix(bucket): v for k, v in settings.items() if k.startswith(bucket)} == {
        "endpoint": "https://minio.internal:9000",
        "path.style.access": "true",
        "connection.ssl.enabled": "true",
        "endpoint.region": "us-east-2",
        "access.key": "AKIAEXAMPLE",
        "secret.key": "example-secret",
        "connection.maximum": "64",
    }


def test_two_tables_of_one_bucket_with_different_options_are_refused() -> None:
    with pytest.raises(ConfigurationError) as refused:
        spark_s3_settings(
            [
                ("upstream 'a'", "s3://raw/a", {"AWS_REGION": "us-east-1"}),
                ("upstream 'b'", "s3://raw/b", {"AWS_REGION": "us-east-2"}),
            ],
            environ={},
        )
    message = str(refused.value)
    assert "upstream 'a' and upstream 'b'" in message
    assert "bucket 'raw'" in message
    assert "fs.s3a.bucket.raw.endpoint.region" in message


def test_hadoop_aws_matches_pysparks_hadoop_client() -> None:
    assert hadoop_version() == "3.5.0"  # PySpark 4.2.0 ships hadoop-client 3.5.0
    assert s3_packages() == ["org.apache.hadoop:hadoop-aws:3.5.0"]


def test_the_s3_jar_list_is_remembered_apart_from_deltas(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WATERMARK_JARS_CACHE", str(tmp_path))
    jar = tmp_path / "x.jar"
    jar.write_text("")
    delta = f"file://{tmp_path}/io.delta_delta-spark_4.2_2.13-4.4.0.jar"
    aws = f"file://{tmp_path}/org.apache.hadoop_hadoop-aws-3.5.0.jar"
    for name in (delta, aws):
        open(name.removeprefix("file://"), "w").close()
    extra = s3_packages()
    spark_module._remember_delta_jars(delta, extra)  # no hadoop-aws resolved: not remembered
    assert spark_module.cached_delta_jars(extra) is None
    spark_module._remember_delta_jars(f"{delta},{aws}", extra)
    assert spark_module.cached_delta_jars(extra) == [delta, aws]
    assert spark_module.cached_delta_jars() is None  # Delta's own list is another file
    assert spark_module._jars_cache_file(extra).name.endswith("+hadoop-aws-3.5.0.jars")
