"""Credentials in storage options: referenced by name, read from the environment at use.

Dagster records every resource's configuration in its job snapshots and shows it in the
UI. A credential written into a table's ``storage_options`` (or the Spark settings made
from them) would be stored there in plain text. So a credential is never a value here:

* leave it out, and delta-rs and Spark's s3a read ``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ... from the environment of the process (the default), or
* reference an environment variable of your choosing: ``{env: NAME}`` in the registry file,
  ``EnvRef("NAME")`` or Dagster's ``EnvVar("NAME")`` in Python, and ``{"env": "NAME"}`` in
  ``WATERMARK_SPARK_CONF``. The reference is resolved each time a table is opened
  (:func:`resolved_options`); Dagster's resources receive it as an ``EnvVar`` and store
  only the name.

A literal value for an option whose name says it is a credential (:func:`is_credential`)
is refused when the registry loads, naming the table, the option and the fix.
"""

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, cast

from watermark_dagster.errors import ConfigurationError

# Option names that hold a credential: delta-rs's (aws_secret_access_key, session_token,
# azure_storage_account_key, client_secret, sas_key, bearer_token, service_account_key, ...),
# Hadoop's (fs.s3a.secret.key, fs.s3a.access.key, fs.azure.account.key.*, fs.azure.sas.*),
# and anything Spark itself redacts (secret, password, token).
_CREDENTIAL = re.compile(
    r"secret|password|passwd|token|credentials?[._-]?json|private[._-]?key"
    r"|access[._-]?key|account[._-]?key|sas[._-]?key|sas[._-]?token|azure\.sas\.",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class EnvRef:
    """A storage option's value read from environment variable ``name`` when it is used.

    Example:
        >>> DeltaUpstream(name="orders", path="s3://lake/orders",
        ...               storage_options={"AWS_SECRET_ACCESS_KEY": EnvRef("LAKE_SECRET")})
    """

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ConfigurationError(
                f"{self.name!r} is not an environment variable name.",
                fix="name the variable with letters, digits and underscores, e.g. "
                "{env: LAKE_SECRET_KEY}.",
            )

    def __repr__(self) -> str:
        return f"{{env: {self.name}}}"


OptionValue: TypeAlias = str | EnvRef
StorageOptions: TypeAlias = Mapping[str, OptionValue]


def is_credential(key: str) -> bool:
    """Whether a storage option or Spark setting named ``key`` holds a credential."""
    return _CREDENTIAL.search(key) is not None


def as_reference(value: object) -> EnvRef | None:
    """``value`` as an :class:`EnvRef` when it is one: an ``EnvRef``, Dagster's
    ``EnvVar`` (recognised without importing Dagster) or a ``{"env": NAME}`` mapping."""
    if isinstance(value, EnvRef):
        return value
    name = getattr(value, "env_var_name", None)
    if isinstance(value, str) and isinstance(name, str):
        return EnvRef(name)
    if isinstance(value, Mapping):
        entry = cast("Mapping[object, object]", value)
        name = entry.get("env")
        if len(entry) == 1 and isinstance(name, str):
            return EnvRef(name)
    return None


def checked_options(owner: str, options: Mapping[str, Any] | None) -> dict[str, OptionValue] | None:
    """``options`` with every reference as an :class:`EnvRef`, or ``None`` when empty.

    Raises:
        ConfigurationError: a credential given as a literal value, or a value that is
            neither text nor a reference; the message names ``owner`` and the option.
    """
    if not options:
        return None
    checked: dict[str, OptionValue] = {}
    for key, value in options.items():
        reference = as_reference(value)
        if reference is not None:
            checked[key] = reference
        elif not isinstance(value, str):
            raise ConfigurationError(
                f"{owner}'s storage option {key} is {value!r}, which is neither text nor an "
                "environment reference.",
                fix=f"give {key} as text, or as {{env: VARIABLE}} to read it from the environment.",
            )
        elif is_credential(key):
            raise ConfigurationError(
                f"{owner}'s storage option {key} holds a credential as literal text; Dagster "
                "would store it in its job snapshots and show it in the UI.",
                fix=f"write {key}: {{env: VARIABLE}} (EnvRef('VARIABLE') in Python) to read it "
                "from an environment variable when the table is opened, or leave it out and "
                "set the standard variable (AWS_SECRET_ACCESS_KEY, ...) in the environment.",
            )
        else:
            checked[key] = value
    return checked


def resolved_options(
    options: StorageOptions | None, owner: str = "a table"
) -> dict[str, str] | None:
    """The values to hand to delta-rs or Spark: references read from the environment now.

    Raises:
        ConfigurationError: a referenced variable is not set.
    """
    if not options:
        return None
    values: dict[str, str] = {}
    for key, value in options.items():
        reference = as_reference(value)
        if reference is None:
            values[key] = str(value)
            continue
        found = os.environ.get(reference.name)
        if found is None:
            raise ConfigurationError(
                f"{owner}'s storage option {key} reads environment variable "
                f"{reference.name}, which is not set in this process.",
                fix=f"set {reference.name} in the environment of the code location and of "
                "its runs (or of the watermark command).",
            )
        values[key] = found
    return values


def check_spark_conf(conf: Mapping[str, object], *, where: str) -> None:
    """Refuse a Spark setting that holds a credential as literal text (Dagster records the
    Spark resource's ``conf``); references are left for Dagster to resolve.

    Raises:
        ConfigurationError: naming the setting and ``where`` it was given.
    """
    for key, value in conf.items():
        if as_reference(value) is None and is_credential(key) and isinstance(value, str):
            raise ConfigurationError(
                f"The Spark setting {key} in {where} holds a credential as literal text; "
                "Dagster would store it in its job snapshots and show it in the UI.",
                fix='give it as {"env": "VARIABLE"} (EnvVar("VARIABLE") in Python) so '
                "Dagster stores only the name, or leave it out and let s3a read the "
                "standard AWS_* variables from the environment.",
            )


__all__ = [
    "EnvRef",
    "OptionValue",
    "StorageOptions",
    "as_reference",
    "check_spark_conf",
    "checked_options",
    "is_credential",
    "resolved_options",
]
