"""Spark's settings for tables on S3: Hadoop's s3a file system for ``s3://`` and
``s3a://`` paths, configured like delta-rs is (endpoint, region, credentials from the
environment), and each table's ``storage_options`` as per-bucket ``fs.s3a`` settings.

Spark reaches S3 through ``hadoop-aws``, which must carry the version of the Hadoop client
PySpark ships (3.5.0 for PySpark 4.2.0) and brings the AWS SDK v2 bundle it declares:
:func:`s3_packages` names it, and the session builder resolves it with Delta's jars only
for a code location with a table or control root on S3 (:func:`spark_s3_settings` sets
:data:`S3A_IMPL_KEY`, which tells it so), so local users never download it.

Credentials are not written into any setting by default: the s3a credential chain reads
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN`` from the
environment of the process (as delta-rs does), or an instance profile. A table's credential
given as an environment reference (``{env: VARIABLE}``) becomes a per-bucket setting whose
value is that reference, which the Spark resource reads when it builds the session.
"""

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlparse

from watermark_dagster.config.secrets import (
    EnvRef,
    OptionValue,
    StorageOptions,
    is_credential,
    resolved_options,
)
from watermark_dagster.errors import ConfigurationError

S3_SCHEMES = ("s3", "s3a")
S3A_FILE_SYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
S3A_IMPL_KEY = "spark.hadoop.fs.s3a.impl"

# Hadoop's own chain, named so it is visible: keys set for a bucket (storage_options),
# temporary keys, the environment (AWS_ACCESS_KEY_ID, ...), an EC2/ECS instance role.
CREDENTIALS_PROVIDERS = ",".join(
    [
        "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
        "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
        "org.apache.hadoop.fs.s3a.auth.IAMInstanceCredentialsProvider",
    ]
)

# delta-rs storage option (lower case) -> the s3a setting it corresponds to.
_OPTION_TO_S3A = {
    "aws_access_key_id": "access.key",
    "access_key_id": "access.key",
    "aws_secret_access_key": "secret.key",
    "secret_access_key": "secret.key",
    "aws_session_token": "session.token",
    "session_token": "session.token",
    "aws_endpoint_url": "endpoint",
    "aws_endpoint": "endpoint",
    "endpoint": "endpoint",
    "aws_region": "endpoint.region",
    "region": "endpoint.region",
}


def is_s3(uri: str) -> bool:
    """Whether ``uri`` is an ``s3://`` or ``s3a://`` location."""
    return urlparse(uri).scheme.lower() in S3_SCHEMES


def _endpoint_settings(prefix: str, endpoint: str) -> dict[str, str]:
    """s3a settings for a custom endpoint (an S3-compatible service): path-style requests
    (its buckets are not DNS names) and TLS as the URL says."""
    return {
        f"{prefix}endpoint": endpoint,
        f"{prefix}path.style.access": "true",
        f"{prefix}connection.ssl.enabled": str(endpoint.lower().startswith("https")).lower(),
    }


def _bucket_settings(bucket: str, given: StorageOptions) -> dict[str, OptionValue]:
    """One table's storage options as per-bucket s3a settings (keys delta-rs alone uses,
    like ``AWS_ALLOW_HTTP``, have no s3a counterpart and are left out). A credential given
    as an environment reference stays one (Dagster records the Spark settings); any other
    reference is read now."""
    prefix = f"spark.hadoop.fs.s3a.bucket.{bucket}."
    credentials = {k: v for k, v in given.items() if isinstance(v, EnvRef) and is_credential(k)}
    plain = {k: v for k, v in given.items() if k not in credentials}
    options: dict[str, OptionValue] = {**(resolved_options(plain) or {}), **credentials}
    settings: dict[str, OptionValue] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower.startswith("fs.s3a."):
            settings[prefix + lower.removeprefix("fs.s3a.")] = value
            continue
        target = _OPTION_TO_S3A.get(lower)
        if target == "endpoint" and isinstance(value, str):
            settings.update(_endpoint_settings(prefix, value))
        elif target is not None:
            settings[prefix + target] = value
    virtual = {k.lower(): v for k, v in options.items()}.get("aws_virtual_hosted_style_request")
    if isinstance(virtual, str):
        hosted = virtual.strip().lower() in ("1", "true", "yes", "on")
        settings[prefix + "path.style.access"] = str(not hosted).lower()
    return settings


def spark_s3_settings(
    tables: Iterable[tuple[str, str, StorageOptions | None]],
    environ: Mapping[str, str] | None = None,
) -> dict[str, OptionValue]:
    """The Spark settings for the S3 tables among ``tables``; empty when none is on S3.

    Args:
        tables: ``(what, uri, storage_options)`` for every table Spark may touch; ``what``
            names it in errors (``upstream 'orders'``).
        environ: the environment the endpoint and region are read from (default: this
            process's), as delta-rs reads them: ``AWS_ENDPOINT_URL`` and ``AWS_REGION``.

    Raises:
        ConfigurationError: two tables in one bucket give one s3a setting two values.
    """
    env = os.environ if environ is None else environ
    on_s3 = [(what, uri, options) for what, uri, options in tables if is_s3(uri)]
    if not on_s3:
        return {}
    settings: dict[str, OptionValue] = {
        # s3:// paths too: Hadoop has no s3 file system of its own since 3.x.
        "spark.hadoop.fs.s3.impl": S3A_FILE_SYSTEM,
        S3A_IMPL_KEY: S3A_FILE_SYSTEM,
        "spark.hadoop.fs.s3a.aws.credentials.provider": CREDENTIALS_PROVIDERS,
    }
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        settings.update(_endpoint_settings("spark.hadoop.fs.s3a.", endpoint))
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        settings["spark.hadoop.fs.s3a.endpoint.region"] = region
    given_by: dict[str, str] = {}
    for what, uri, options in on_s3:
        bucket = urlparse(uri).netloc
        for key, value in _bucket_settings(bucket, options or {}).items():
            if key in given_by and settings[key] != value:
                raise ConfigurationError(
                    f"{given_by[key]} and {what} are both in bucket '{bucket}' but their "
                    f"storage_options give Spark's {key.removeprefix('spark.hadoop.')} two "
                    "values; Spark configures s3a per bucket.",
                    fix="give the tables of one bucket the same storage_options (or keep the "
                    "shared ones, like credentials, in the environment).",
                )
            settings[key] = value
            given_by.setdefault(key, what)
    return settings


def hadoop_version() -> str:
    """The Hadoop client version PySpark ships (``hadoop-client-api-X.jar`` in its jars)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    found = sorted(jars.glob("hadoop-client-api-*.jar"))
    if not found:
        raise ConfigurationError(
            f"No hadoop-client-api jar in {jars}: cannot tell which hadoop-aws to use for S3.",
            fix="install the full pyspark package (not pyspark-client), or name the jars in "
            "WATERMARK_SPARK_CONF's spark.jars.packages yourself.",
        )
    return found[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def s3_packages() -> list[str]:
    """The Maven packages Spark needs for S3: hadoop-aws of PySpark's Hadoop version (which
    declares the AWS SDK bundle it needs)."""
    return [f"org.apache.hadoop:hadoop-aws:{hadoop_version()}"]


def needs_s3_jars(settings: Mapping[str, str]) -> bool:
    """Whether a session built with ``settings`` reads or writes S3 (so needs hadoop-aws)."""
    return settings.get(S3A_IMPL_KEY) == S3A_FILE_SYSTEM


__all__ = [
    "S3A_IMPL_KEY",
    "hadoop_version",
    "is_s3",
    "needs_s3_jars",
    "s3_packages",
    "spark_s3_settings",
]
