"""Refusing an S3 control root whose commits could not be atomic.

The control tables' compare-and-swap (:meth:`ControlTables._cas`) relies on a Delta commit
landing as version ``v + 1`` only if no other writer created that version first. On local
disk delta-rs gets this from an atomic rename. On S3, delta-rs 1.x writes each commit file
with a conditional ``PutObject`` (``If-None-Match: *``), by default and always: AWS S3 has
honoured it since 2024, and so do MinIO, Cloudflare R2 and moto's server (tested in
``tests/scale/test_s3_store.py``). delta-rs 1.x has no DynamoDB locking provider any more
(``AWS_S3_LOCKING_PROVIDER=dynamodb`` is ignored, with an error in its log), and
``AWS_S3_ALLOW_UNSAFE_RENAME`` no longer changes how it commits.

So the safe configuration is the default, and :func:`require_conditional_writes` refuses,
before anything is written, the options that would leave the control tables without it:
conditional puts turned off (``conditional_put`` or ``aws_conditional_put``:
``disabled``, with which no commit can land on S3) and a DynamoDB locking provider (which
delta-rs 1.x ignores: whoever set it expects a lock that is not there, and writers of
older releases that use it do not coordinate with these). A server that ignores
``If-None-Match`` cannot be told apart from the client side (delta-rs checks the log
before it puts, so only truly simultaneous commits would collide): the documentation
says what a bucket needs.
"""

import os
from collections.abc import Mapping

from watermark_dagster.errors import ConfigurationError
from watermark_dagster.store import schema

S3_SCHEMES = ("s3://", "s3a://")

_CONDITIONAL_PUT_OPTIONS = ("conditional_put", "aws_conditional_put")
_LOCKING_PROVIDER = "AWS_S3_LOCKING_PROVIDER"


def is_s3(uri: str) -> bool:
    """Whether ``uri`` names an S3 location (``s3://`` or ``s3a://``)."""
    return uri.lower().startswith(S3_SCHEMES)


def option(options: Mapping[str, str] | None, key: str) -> str | None:
    """The value delta-rs would take for ``key``: from ``options`` (any letter case), else
    from the environment (upper case), else None."""
    for name, value in (options or {}).items():
        if name.lower() == key.lower():
            return value
    return os.environ.get(key.upper())


def require_conditional_writes(root: str, options: Mapping[str, str] | None) -> None:
    """Refuse options that would leave an S3 control root's commits unguarded (does
    nothing for a root that is not on S3).

    Raises:
        ConfigurationError: conditional puts are turned off, or a DynamoDB locking provider
            is configured, in ``options`` or the environment. Nothing is written.
    """
    if not is_s3(root):
        return
    tables = ", ".join(f"'{name}'" for name in schema.TABLES)
    for key in _CONDITIONAL_PUT_OPTIONS:
        value = option(options, key)
        if value is not None and value.strip().lower() == "disabled":
            raise ConfigurationError(
                f"The control tables {tables} under {root} cannot commit with {key}={value}: "
                "delta-rs commits on S3 with a conditional PutObject (If-None-Match), the "
                "only thing that keeps two writers from both committing one version, and "
                "with it turned off no commit can land.",
                fix=f"remove {key} from control_storage_options and the environment (its "
                "default, conditional puts with If-None-Match, is the safe one).",
            )
    provider = option(options, _LOCKING_PROVIDER)
    if provider:
        raise ConfigurationError(
            f"The control tables {tables} under {root} are configured with "
            f"{_LOCKING_PROVIDER}={provider}, which delta-rs 1.x ignores: its commits on S3 "
            "are guarded by conditional writes (PutObject with If-None-Match), not by a "
            "DynamoDB lock, and writers that still take that lock do not coordinate with it.",
            fix=f"remove {_LOCKING_PROVIDER} from control_storage_options and the environment, "
            "stop any writer of an older release, and use a bucket that honours If-None-Match "
            "(AWS S3 does).",
        )


__all__ = ["S3_SCHEMES", "is_s3", "option", "require_conditional_writes"]
