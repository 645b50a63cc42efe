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


# One part of a catalog table name: a plain identifier, or any text in backticks except a
# backtick or a control character (Spark's own quoting; a backtick inside is refused rather
# than escaped, so a quoted part never needs unescaping).
_PLAIN_PART = r"[A-Za-z_][A-Za-z0-9_]{0,127}"
_QUOTED_PART = r"`[^`\x00-\x1f\x7f]{1,255}`"
_TABLE_NAME = re.compile(
    rf"^(?:{_PLAIN_PART}|{_QUOTED_PART})(?:\.(?:{_PLAIN_PART}|{_QUOTED_PART})){{0,2}}$"
)
_PART = re.compile(rf"{_PLAIN_PART}|{_QUOTED_PART}")


def table_name_parts(value: object, owner: str) -> tuple[str, ...]:
    """The parts of a catalog table name: ``table``, ``schema.table`` or
    ``catalog.schema.table``, each a plain identifier or a backtick-quoted name.

    Args:
        value: the name as declared (``table=...``).
        owner: how errors name the declaration, e.g. ``"Upstream 'orders'"``.

    Returns:
        The 1 to 3 parts, without their backticks.

    Raises:
        ConfigurationError: ``value`` is not such a name; nothing reaches Spark.
    """
    text = value.strip() if isinstance(value, str) else value
    if not isinstance(text, str) or not _TABLE_NAME.match(text):
        raise ConfigurationError(
            f"{owner}: table {value!r} is not a catalog table name: give 1 to 3 parts "
            "separated by dots (table, schema.table or catalog.schema.table), each letters, "
            "digits and underscores starting with a letter or underscore, or any text in "
            "backticks without a backtick (`my-table`).",
            fix="e.g. table: sales.orders or table: main.sales.`orders-2026`; for a table "
            "known by its location, use path instead.",
        )
    return tuple(part.strip("`") for part in _PART.findall(text))


def quote_table_name(parts: tuple[str, ...]) -> str:
    """The name Spark is given: every part in backticks (parts hold no backtick, see
    :func:`table_name_parts`), so no part is read as SQL."""
    return ".".join(f"`{part}`" for part in parts)


def check_table_declaration(owner: str, path: object, table: object, **names: str) -> None:
    """Check a catalog-table declaration (an upstream's ``table=``, a pipeline's): a valid
    name (:func:`table_name_parts`) and no path beside it (the location comes from the
    catalog; given both, one of them would be ignored).

    Args:
        owner: how errors name the declaration.
        path: the path also given ("" or None: none).
        table: the catalog name.
        names: ``upstream=`` or ``pipeline=`` for the error's attributes.

    Raises:
        ConfigurationError: both are given, or the name is not valid.
    """
    if isinstance(path, str) and path.strip():
        raise ConfigurationError(
            f"{owner} gives both a path ({path!r}) and a catalog table ({table!r}).",
            fix="keep one: a path for a table known by its location, table for one known "
            "by its catalog name.",
            **names,
        )
    try:
        table_name_parts(table, owner)
    except ConfigurationError as e:
        raise ConfigurationError(e.reason, fix=e.fix, **names) from None
