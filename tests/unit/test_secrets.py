"""Credentials in storage options and Spark settings: refused as literal text when the
registry or the code location loads (nothing written, no JVM), accepted as environment
references, which stay references in what Dagster records and are read at use.

The end-to-end proof that a referenced secret is used and stored nowhere is
``tests/spark/test_secrets.py``."""

import json
from pathlib import Path

import pytest
import yaml
from dagster import EnvVar

from watermark_dagster import EnvRef
from watermark_dagster.config.env import spark_conf
from watermark_dagster.config.pipeline import pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.secrets import is_credential, resolved_options
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.config.yaml_file import load_registry_file
from watermark_dagster.dagster_defs.definitions import build_location
from watermark_dagster.dagster_defs.resources import SparkSessionResource
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.runtime.storage import spark_s3_settings


def _registry(options: dict[str, object] | None = None, path: str = "/lake/up") -> Registry:
    @pipeline(upstreams=["up"], target="/lake/out", keys=["id"])
    def copy(batch):
        return batch["up"].changes

    return Registry(
        upstreams=[DeltaUpstream(name="up", path=path, storage_options=options)],  # type: ignore[arg-type]
        pipelines=[copy],
    )


@pytest.mark.parametrize(
    "key",
    [
        "AWS_SECRET_ACCESS_KEY",
        "aws_session_token",
        "AWS_ACCESS_KEY_ID",
        "azure_storage_account_key",
        "AZURE_CLIENT_SECRET",
        "sas_token",
        "google_service_account_key",
        "fs.s3a.secret.key",
    ],
)
def test_a_literal_credential_is_refused_naming_the_table_and_option(key: str) -> None:
    assert is_credential(key)
    with pytest.raises(ConfigurationError) as raised:
        DeltaUpstream(name="orders", path="s3://lake/orders", storage_options={key: "abc123"})
    message = str(raised.value)
    assert "Upstream 'orders'" in message
    assert key in message
    assert "{env: VARIABLE}" in message  # the fix
    assert "abc123" not in message  # nor is the value repeated


def test_a_pipeline_targets_literal_credential_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="Pipeline 'copy' target's storage option"):

        @pipeline(
            upstreams=["up"],
            target="s3://lake/out",
            keys=["id"],
            storage_options={"AWS_SECRET_ACCESS_KEY": "abc123"},
        )
        def copy(batch):
            return batch["up"].changes


@pytest.mark.parametrize("key", ["AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"])
def test_other_options_stay_literal(key: str) -> None:
    assert not is_credential(key)
    upstream = DeltaUpstream(name="up", path="s3://lake/up", storage_options={key: "x"})
    assert upstream.storage_options == {key: "x"}


def test_references_in_python_and_dagster_form_are_read_at_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream = DeltaUpstream(
        name="up",
        path="s3://lake/up",
        storage_options={
            "AWS_SECRET_ACCESS_KEY": EnvRef("LAKE_SECRET"),
            "AWS_SESSION_TOKEN": EnvVar("LAKE_TOKEN"),
        },
    )
    # Kept as references: nothing read when the registry loads.
    assert upstream.storage_options == {
        "AWS_SECRET_ACCESS_KEY": EnvRef("LAKE_SECRET"),
        "AWS_SESSION_TOKEN": EnvRef("LAKE_TOKEN"),
    }
    monkeypatch.setenv("LAKE_SECRET", "s1")
    monkeypatch.setenv("LAKE_TOKEN", "t1")
    assert resolved_options(upstream.storage_options) == {
        "AWS_SECRET_ACCESS_KEY": "s1",
        "AWS_SESSION_TOKEN": "t1",
    }
    monkeypatch.setenv("LAKE_SECRET", "s2")  # rotated: the next open reads the new value
    assert resolved_options(upstream.storage_options)["AWS_SECRET_ACCESS_KEY"] == "s2"  # type: ignore[index]
    monkeypatch.delenv("LAKE_TOKEN")
    with pytest.raises(ConfigurationError, match="reads environment variable LAKE_TOKEN"):
        resolved_options(upstream.storage_options, "Upstream 'up'")


def test_a_registry_file_takes_env_references_and_refuses_literal_credentials(
    tmp_path: Path,
) -> None:
    def spec(secret: object) -> dict[str, object]:
        return {
            "control_storage_options": {"AWS_SECRET_ACCESS_KEY": {"env": "CONTROL_SECRET"}},
            "upstreams": {
                "up": {
                    "path": "s3://lake/up",
                    "storage_options": {"AWS_REGION": "eu-west-1", "AWS_SECRET_ACCESS_KEY": secret},
                }
            },
            "pipelines": {
                "copy": {
                    "upstreams": {"up": "id"},
                    "target": "s3://lake/out",
                    "keys": ["id"],
                    "sql": "SELECT id FROM up",
                }
            },
        }

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(spec({"env": "LAKE_SECRET"})))
    loaded = load_registry_file(good)
    assert loaded.registry.upstreams["up"].storage_options == {
        "AWS_REGION": "eu-west-1",
        "AWS_SECRET_ACCESS_KEY": EnvRef("LAKE_SECRET"),
    }
    assert loaded.control_storage_options == {"AWS_SECRET_ACCESS_KEY": EnvRef("CONTROL_SECRET")}

    literal = tmp_path / "literal.yaml"
    literal.write_text(yaml.safe_dump(spec("abc123")))
    with pytest.raises(ConfigurationError) as raised:
        load_registry_file(literal)
    assert "literal.yaml" in str(raised.value)
    assert "AWS_SECRET_ACCESS_KEY holds a credential as literal text" in str(raised.value)

    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(spec({"variable": "LAKE_SECRET"})))
    with pytest.raises(ConfigurationError, match=r"\{env: VARIABLE\}"):
        load_registry_file(wrong)


def test_the_control_roots_literal_credential_is_refused_when_the_location_loads() -> None:
    with pytest.raises(ConfigurationError, match="The control root's storage option"):
        build_location(
            _registry(),
            control_root="s3://lake/control",
            storage_options={"AWS_SECRET_ACCESS_KEY": "abc123"},
        )


def test_a_literal_credential_in_the_spark_settings_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spark = SparkSessionResource(conf={"spark.hadoop.fs.s3a.secret.key": "abc123"})
    with pytest.raises(ConfigurationError, match="spark.hadoop.fs.s3a.secret.key"):
        build_location(_registry(), control_root="/lake/control", spark=spark)

    # WATERMARK_SPARK_CONF: a reference is kept as one; a nested object that is not one
    # is refused.
    monkeypatch.setenv(
        "WATERMARK_SPARK_CONF", json.dumps({"spark.hadoop.fs.s3a.secret.key": {"env": "S"}})
    )
    assert spark_conf() == {"spark.hadoop.fs.s3a.secret.key": EnvRef("S")}
    monkeypatch.setenv("WATERMARK_SPARK_CONF", json.dumps({"a": {"b": "c"}}))
    with pytest.raises(ConfigurationError, match="neither a value nor an environment reference"):
        spark_conf()


def test_credential_references_become_dagster_env_vars_in_the_spark_resource() -> None:
    registry = _registry(
        {"AWS_SECRET_ACCESS_KEY": EnvRef("LAKE_SECRET"), "AWS_ENDPOINT_URL": "http://s3:9000"},
        path="s3://raw/up",
    )
    settings = spark_s3_settings(
        [("upstream 'up'", "s3://raw/up", registry.upstreams["up"].storage_options)]
    )
    assert settings["spark.hadoop.fs.s3a.bucket.raw.secret.key"] == EnvRef("LAKE_SECRET")
    assert settings["spark.hadoop.fs.s3a.bucket.raw.endpoint"] == "http://s3:9000"

    location = build_location(registry, control_root="/lake/control")
    held = location.spark_resource.conf["spark.hadoop.fs.s3a.bucket.raw.secret.key"]
    # Dagster's EnvVar: its job snapshots record {"env": "LAKE_SECRET"}, never the value.
    assert isinstance(held, EnvVar)
    assert held.env_var_name == "LAKE_SECRET"
