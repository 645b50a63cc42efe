"""Each setting of an upstream or a pipeline, declared once, and what is derived from it.

A setting is a field of its dataclass (:class:`~watermark_dagster.config.upstream.DeltaUpstream`,
:class:`~watermark_dagster.config.upstream.CursorUpstream`,
:class:`~watermark_dagster.config.pipeline.Pipeline`) whose metadata says how a file writes
it (``field(default=..., metadata=written_as(Kind.NAMES))``):

* its **type** lists the values it takes (a ``Literal`` names each one);
* its **default** is the default;
* its entry under the class docstring's ``Args:`` is its one sentence of documentation.

From that one declaration come the registry file's keys and their checks
(:mod:`~watermark_dagster.config.yaml_file`), the Component's models
(:mod:`~watermark_dagster.dagster_defs.component`) and the option tables of
docs/registry-file.md and docs/configuration.md
(:mod:`~watermark_dagster.dagster_defs.option_docs`). The location settings
(``WatermarkSettings``, ``HealthSettings``) are declared the same way, each with the
environment variable it is read from. Adding a setting is adding its field and its
``Args:`` (or ``Attributes:``) sentence.
"""

import dataclasses
import inspect
import math
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

_META = "watermark_option"


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The default of a setting every entry must give."""
_NAMES = "a list of names ([a, b]) or one name"


class Kind(StrEnum):
    """How a file writes a setting, and so how a registry file checks it and which type the
    Component's model gives it."""

    TEXT = "text"
    COLUMN = "column"
    LOCATION = "location"
    TABLE = "table"
    FUNCTION = "function"
    CHOICE = "choice"
    NAMES = "names"
    UPSTREAMS = "upstreams"
    WHOLE = "whole"
    SECONDS = "seconds"
    START = "start"
    OPTIONS = "options"
    STORAGE_OPTIONS = "storage_options"
    SECRET = "secret"
    TARGET = "target"


# What a value of each kind must be, as an error says it ("lag_seconds must be ...").
_SHAPES: dict[Kind, str] = {
    Kind.TEXT: "text",
    Kind.COLUMN: "text (a column name)",
    Kind.LOCATION: "text (the table's location)",
    Kind.TABLE: "text (a catalog table name: schema.table or catalog.schema.table)",
    Kind.FUNCTION: "text (module:function)",
    Kind.NAMES: _NAMES,
    Kind.UPSTREAMS: _NAMES + ", or for a declared pipeline a mapping of upstream: key path",
    Kind.WHOLE: "a whole number",
    Kind.SECONDS: "a number of seconds",
    Kind.START: "beginning, latest, a version or an ISO 8601 timestamp",
    Kind.OPTIONS: "a mapping of option: value (scalar values, each key once)",
    Kind.STORAGE_OPTIONS: "a mapping of option: value (scalar values or {env: VARIABLE}, each "
    "key once)",
    Kind.SECRET: "{env: VARIABLE} (a credential is never given as text)",
    Kind.TARGET: "text (the target table's location), or a warehouse table: "
    "{kind: postgres, url: ..., table: ...}",
}


@dataclass(frozen=True)
class WrittenAs:
    """A field's metadata: how a file writes the setting.

    Attributes:
        kind: the value's form.
        key: the file's key when it is not the field's name (``full`` for ``full_transform``).
        shape: what an error says the value must be, when the kind's words are not enough.
        env: the environment variable a code location reads it from when its declaration
            leaves it out (location settings only).
    """

    kind: Kind
    key: str | None = None
    shape: str | None = None
    env: str | None = None


def written_as(
    kind: Kind, *, key: str | None = None, shape: str | None = None, env: str | None = None
) -> dict[str, Any]:
    """The ``metadata=`` of a dataclass field that is a setting (see the module docstring)."""
    return {_META: WrittenAs(kind, key, shape, env)}


@dataclass(frozen=True)
class Option:
    """One setting as a file writes it.

    Attributes:
        key: the key in a registry file and a component's ``defs.yaml``.
        field: the dataclass field it sets (None: a key only a file has, such as ``sql``).
        kind: the value's form (:class:`Kind`).
        doc: its documentation, from the class docstring's ``Args:`` (reStructuredText).
        choices: the values it takes, for a :attr:`Kind.CHOICE`.
        default: the field's default (:data:`REQUIRED`: none).
        shape: what an error says the value must be.
        applies: which entries take it (``""``: all of its section's).
        env: the environment variable it is read from when left out (None: none).
    """

    key: str
    field: str | None
    kind: Kind
    doc: str
    choices: tuple[str, ...] = ()
    default: object = REQUIRED
    shape: str = ""
    applies: str = ""
    env: str | None = None

    @property
    def required(self) -> bool:
        """Whether every entry must give it."""
        return self.default is REQUIRED

    @property
    def plain(self) -> str:
        """:attr:`doc` as plain text (a Component field's description)."""
        return shown_references(self.doc, quote="").replace("`", "")


def options_of(cls: type, *, applies: str = "") -> tuple[Option, ...]:
    """The settings a dataclass declares, in field order, each with its ``Args:`` (or
    ``Attributes:``) entry.

    Raises:
        TypeError: a setting has no such entry in the class's (or a base class's)
            docstring, or a choice field's type is not a ``Literal``.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        docs.update(_args_section(klass.__doc__ or ""))
    found: list[Option] = []
    for spec in dataclasses.fields(cls):
        meta = spec.metadata.get(_META)
        if meta is None:
            continue
        assert isinstance(meta, WrittenAs)
        if spec.name not in docs:
            raise TypeError(
                f"{cls.__name__}.{spec.name} is a setting without an entry under Args: in "
                "the class docstring: give it one sentence there."
            )
        choices = _literal_values(spec.type) if meta.kind is Kind.CHOICE else ()
        if meta.kind is Kind.CHOICE and not choices:
            raise TypeError(f"{cls.__name__}.{spec.name} is a choice but its type is no Literal.")
        default: object = REQUIRED if spec.default is dataclasses.MISSING else spec.default
        if spec.default_factory is not dataclasses.MISSING:
            default = spec.default_factory()
        shape = meta.shape or (
            f"text ({_either(choices)})" if meta.kind is Kind.CHOICE else _SHAPES[meta.kind]
        )
        found.append(
            Option(
                key=meta.key or spec.name,
                field=spec.name,
                kind=meta.kind,
                doc=docs[spec.name],
                choices=choices,
                default=default,
                shape=shape,
                applies=applies,
                env=meta.env,
            )
        )
    return tuple(found)


def is_seconds(value: object) -> bool:
    """True when ``value`` is a number of seconds a setting can hold: an ``int`` or
    ``float``, finite (YAML's ``.nan`` and ``.inf`` are floats) and 0 or more."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def file_only(
    key: str,
    kind: Kind,
    doc: str,
    *,
    shape: str | None = None,
    choices: tuple[str, ...] = (),
    default: object = None,
) -> Option:
    """A key that only a file has (no field of its own), optional."""
    shape = shape or (f"text ({_either(choices)})" if choices else _SHAPES[kind])
    return Option(key, None, kind, doc, choices=choices, default=default, shape=shape)


def _either(choices: Iterable[str]) -> str:
    values = list(choices)
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def _literal_values(hint: object) -> tuple[str, ...]:
    """The text values of a ``Literal`` type, also inside ``X | None``."""
    if typing.get_origin(hint) is Literal:
        return tuple(str(v) for v in typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(v for arg in typing.get_args(hint) for v in _literal_values(arg))
    return ()


def _args_section(docstring: str) -> dict[str, str]:
    """A Google-style docstring's ``Args:`` (else ``Attributes:``) entries, each joined onto
    one line."""
    lines = inspect.cleandoc(docstring).splitlines()
    section = next((s for s in ("Args:", "Attributes:") if s in lines), None)
    if section is None:
        return {}
    entries: dict[str, str] = {}
    name: str | None = None
    indent: int | None = None
    for line in lines[lines.index(section) + 1 :]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:  # the next section
            break
        indent = depth if indent is None else indent
        match = re.match(r"(\w+):\s*(.*)", line.strip())
        if depth == indent and match:
            name = str(match.group(1))
            entries[name] = str(match.group(2))
        elif name is not None:
            entries[name] = f"{entries[name]} {line.strip()}"
    return entries


def shown_references(text: str, quote: str = "`") -> str:
    """Markdown for reStructuredText ``text``: each Sphinx reference (``:func:`~a.b.name```)
    as its name quoted by ``quote`` (the last part for ``~``, as Sphinx shows it, else the
    whole path), and double backquotes as single ones."""

    def name(match: re.Match[str]) -> str:
        target = match.group(2).lstrip(".")
        return quote + (target.rsplit(".", 1)[-1] if match.group(1) else target) + quote

    return re.sub(r":\w+:`(~?)([^`]+)`", name, text).replace("``", "`")
