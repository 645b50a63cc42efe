"""Names and enumerated settings in declarations: validated once, with errors that name the
value and the fix."""

import re
from enum import StrEnum
from typing import TypeVar

from watermark_dagster.errors import ConfigurationError

E = TypeVar("E", bound=StrEnum)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def validate_name(kind: str, value: object) -> str:
    """Check that ``value`` is a plain identifier (letters, digits, underscore).

    Names become asset keys, column references and file names; restricting them keeps
    quoting out of the picture entirely.
    """
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigurationError(
            f"Invalid {kind} {value!r}: use letters, digits and underscores, starting with a "
            "letter or underscore (at most 128 characters).",
            fix=f"rename the {kind}, e.g. {re.sub(r'[^A-Za-z0-9_]', '_', str(value))!r}.",
        )
    return value


def enum_value(cls: type[E], value: object, what: str, owner: str) -> E:
    """``value`` (a member or its text, any case) as a member of ``cls``.

    Raises:
        ConfigurationError: ``value`` is not one of ``cls``'s values; the message lists them.
    """
    try:
        return cls(value.lower() if isinstance(value, str) else value)
    except ValueError:
        allowed = [m.value for m in cls]
        raise ConfigurationError(
            f"{owner}: {what} {value!r} is not one of {allowed}.",
            fix=f"set {what} to one of {allowed}.",
        ) from None
