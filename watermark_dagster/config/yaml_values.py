"""The values of a registry file: each key's check and conversion, and the reader that
raises with the file and line.

The upstream and pipeline keys come from the declarations
(:data:`~watermark_dagster.config.file_options.UPSTREAM_OPTIONS`,
:data:`~watermark_dagster.config.file_options.PIPELINE_OPTIONS`): each :class:`Kind` has one
converter here, which returns the value or :data:`WRONG`.
"""

import difflib
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

from watermark_dagster.config.file_options import PIPELINE_OPTIONS, UPSTREAM_OPTIONS
from watermark_dagster.config.locations import absolute_location
from watermark_dagster.config.names import validate_name
from watermark_dagster.config.options import Kind, Option, is_seconds
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.secrets import as_reference
from watermark_dagster.config.yaml_lines import LinedMapping, mapping_at
from watermark_dagster.errors import ConfigurationError


class Reader:
    """Turns one parsed file into checked keyword arguments, raising with file and line."""

    def __init__(self, path: Path, base: Path | None = None) -> None:
        self.path = path
        self.base = path.parent if base is None else base

    # -- errors

    def fail(self, line: int | None, message: str, *, fix: str, **attrs: str) -> ConfigurationError:
        """The error to raise: ``message`` at ``file:line`` (the file alone without a line)."""
        where = f"{self.path}:{line}" if line else str(self.path)
        return ConfigurationError(f"{where}: {message}", fix=fix, **attrs)

    def rewrap(self, line: int, error: ConfigurationError) -> ConfigurationError:
        """The same error from :mod:`watermark_dagster.config.registry`, pointing into the file."""
        message = str(error)
        if error.fix and message.endswith(f" Fix: {error.fix}"):
            message = message[: -len(f" Fix: {error.fix}")]
        attrs = {k: v for k, v in (("upstream", error.upstream), ("pipeline", error.pipeline)) if v}
        return self.fail(line, message, fix=error.fix or "correct the entry.", **attrs)

    # -- shapes

    def entries(
        self, top: LinedMapping, section: str, kind: str, lines: dict[tuple[str, str], int]
    ) -> Iterator[tuple[str, Any, int]]:
        """Each entry of ``section`` (``upstreams:`` or ``pipelines:``, empty when null):
        its checked name, its body and its line, recorded in ``lines`` under ``(kind, name)``.
        """
        at = top.key_lines[section]
        raw = top[section]
        entries = self.mapping(mapping_at(at) if raw is None else raw, section, at)
        for key, body in entries.items():
            line = entries.key_lines[key]
            name = self.name(key, kind, line, entries.key_text[key])
            lines[(kind, name)] = line
            yield name, body, line

    def mapping(self, value: Any, what: str, line: int | None) -> LinedMapping:
        """``value`` checked to be a mapping that gives no key twice."""
        if not isinstance(value, LinedMapping):
            raise self.fail(
                getattr(value, "line", line),
                f"{what} must be a mapping of key: value, got {_show(value)}.",
                fix=f"write {what} as indented `key: value` lines (or {{key: value, ...}}).",
            )
        if value.duplicates:
            key, at, first = value.duplicates[0]
            raise self.fail(
                at,
                f"{key!r} appears twice in {what} (first at line {first}); YAML would "
                "silently keep only the last one.",
                fix=f"keep one {key!r} entry in {what}, or rename one of them.",
            )
        return value

    def known_keys(
        self, entry: LinedMapping, allowed: Mapping[str, Any], what: str, of: str
    ) -> None:
        """Raise for the first key of ``entry`` not in ``allowed``, with the closest one."""
        for key in entry:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(
                    entry.key_lines[key],
                    f"{what}: unknown key {key!r}{hint}.",
                    fix=f"{'rename it to ' + repr(close[0]) if close else 'remove it'}; the "
                    f"keys of {of} are {sorted(allowed)}.",
                )

    def name(self, value: Any, kind: str, line: int, written: str) -> str:
        """An entry's name, checked to be text and an identifier."""
        if not isinstance(value, str):
            raise self.fail(
                line,
                f"{kind} name '{written}' is read by YAML as {_type(value)} ({value!r}), not text.",
                fix=f"quote it ('{written}') or use a name of letters, digits and underscores.",
            )
        try:
            return validate_name(f"{kind} name", value)
        except ConfigurationError as e:
            raise self.rewrap(line, e) from None

    # -- values

    def convert(self, entry: LinedMapping, key: str, what: str, checks: Mapping[str, Any]) -> Any:
        """``entry[key]`` converted by its check, raising with what it must be."""
        value = entry[key]
        line = entry.key_lines[key]
        expected, convert = checks[key]
        converted = convert(self, value)
        if converted is WRONG and convert is _secret:
            # Never echoed: the text given may be the credential itself.
            raise self.fail(
                line,
                f"{what}: {key} is given as {_type(value)}; a credential is only read from "
                "the environment, so Dagster never stores it.",
                fix=f"write {key}: {{env: VARIABLE}} and set VARIABLE where the code location "
                "and its runs start.",
            )
        if converted is WRONG:
            quote = (
                " (YAML reads unquoted yes/no/on/off as booleans and digits as numbers: quote it)"
                if isinstance(value, bool | int | float) and expected.startswith("text")
                else ""
            )
            raise self.fail(
                line,
                f"{what}: {key} must be {expected}, got {_show(value)}{quote}.",
                fix=f"give {key} as {expected}.",
            )
        return converted

    def location(self, value: str) -> str:
        """Local relative paths are taken from the file's folder; URIs are kept as they are."""
        return absolute_location(value, self.base)

    def transform(
        self, spec: str, what: str, line: int, key: str = "transform"
    ) -> Callable[..., Any]:
        """The function ``module:function`` names, imported, or an error naming the fix."""
        module_name, _, attribute = spec.partition(":")
        if not module_name or not attribute:
            raise self.fail(
                line,
                f"{what}: {key} {spec!r} is not module:function.",
                fix=f"give it as {key}: my_package.transforms:orders_clean.",
            )
        try:
            found: Any = importlib.import_module(module_name)
        except Exception as e:  # an import runs the module: anything may be raised
            raise self.fail(
                line,
                f"{what}: cannot import module {module_name!r} of {key} {spec!r} "
                f"({type(e).__name__}: {e}).",
                fix="install the package or put its folder on PYTHONPATH (for `dagster dev`, "
                "the workspace's working_directory), and check the spelling.",
            ) from e
        for part in attribute.split("."):
            if not hasattr(found, part):
                names = [n for n in dir(found) if not n.startswith("_")]
                close = difflib.get_close_matches(part, names, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(
                    line,
                    f"{what}: {key} {spec!r}: {type(found).__name__} {found.__name__!r} "
                    f"has no attribute {part!r}{hint}."
                    if hasattr(found, "__name__")
                    else f"{what}: {key} {spec!r} has no attribute {part!r}{hint}.",
                    fix="name a function defined in that module.",
                )
            found = getattr(found, part)
        if isinstance(found, Pipeline):
            raise self.fail(
                line,
                f"{what}: {key} {spec!r} is a pipeline declared with @pipeline, not a "
                "plain function.",
                fix=f"use {key}: {spec}.transform, or drop the decorator."
                if key == "transform"
                else "point it at the plain full-transform function, or drop the decorator.",
            )
        if not callable(found):
            raise self.fail(
                line,
                f"{what}: {key} {spec!r} is {_type(found)}, not a function.",
                fix="point it at a function taking the batch and returning a DataFrame."
                if key == "transform"
                else "point it at a function taking one DataFrame per upstream.",
            )
        return found


class _Wrong:
    pass


WRONG: Any = _Wrong()
"""What a converter returns for a value of the wrong form."""


def _show(value: object) -> str:
    if value is None:
        return "nothing"
    return f"{value!r} ({_type(value)})"


def _type(value: object) -> str:
    names: dict[type, str] = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "text",
        list: "a list",
    }
    return names.get(type(value), "a mapping" if isinstance(value, dict) else type(value).__name__)


def _text(_: Reader, value: Any) -> Any:
    return value if isinstance(value, str) and value.strip() else WRONG


def _location(reader: Reader, value: Any) -> Any:
    return reader.location(value) if isinstance(value, str) and value.strip() else WRONG


def _names(_: Reader, value: Any) -> Any:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in cast("list[object]", value)):
        return tuple(cast("list[str]", value))
    return WRONG


def _upstreams(reader: Reader, value: Any) -> Any:
    """A list of names, or (a declared pipeline) a mapping of name: key path."""
    if not isinstance(value, dict):
        return _names(reader, value)
    paths = cast("dict[object, object]", value)
    if getattr(paths, "duplicates", None) or not all(isinstance(k, str) for k in paths):
        return WRONG
    for spec in paths.values():
        listed = isinstance(spec, list) and all(
            isinstance(c, str) for c in cast("list[object]", spec)
        )
        if spec is not None and not isinstance(spec, str) and not listed:
            return WRONG
    return dict(cast("dict[str, Any]", paths))


def _count(_: Reader, value: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else WRONG


def _seconds(_: Reader, value: Any) -> Any:
    return value if is_seconds(value) else WRONG


def _start(_: Reader, value: Any) -> Any:
    return value if isinstance(value, str | int) and not isinstance(value, bool) else WRONG


def _options(_: Reader, value: Any) -> Any:
    if not isinstance(value, dict):
        return WRONG
    options = cast("dict[object, object]", value)
    if getattr(options, "duplicates", None):
        return WRONG
    if not all(isinstance(v, str | int | float | bool) for v in options.values()):
        return WRONG
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}


def _storage_options(reader: Reader, value: Any) -> Any:
    """Like :func:`_options`, and a value may be ``{env: VARIABLE}``: read from the
    environment when the table is opened (credentials must be given so)."""
    if not isinstance(value, dict):
        return WRONG
    options = cast("dict[object, object]", value)
    if getattr(options, "duplicates", None):
        return WRONG
    references = {
        k: as_reference(cast("dict[object, object]", v))
        for k, v in options.items()
        if isinstance(v, dict)
    }
    if any(r is None for r in references.values()):
        return WRONG
    plain = _options(reader, {k: v for k, v in options.items() if k not in references})
    if plain is WRONG:
        return WRONG
    return {str(k): references[k] if k in references else plain[str(k)] for k in options}


def _secret(_: Reader, value: Any) -> Any:
    """``{env: VARIABLE}`` only: a credential read from the environment when it is used."""
    reference = as_reference(cast("object", value)) if isinstance(value, dict) else None
    return WRONG if reference is None else reference


def _target(reader: Reader, value: Any) -> Any:
    """A Delta target's location, or a warehouse target's mapping (``kind: postgres``),
    which the pipeline's declaration checks
    (:func:`~watermark_dagster.config.warehouse.warehouse_target`)."""
    if isinstance(value, dict):
        entry = cast("dict[object, object]", value)
        if getattr(entry, "duplicates", None) or not all(isinstance(k, str) for k in entry):
            return WRONG
        return {str(k): v for k, v in entry.items()}
    return _location(reader, value)


_STORAGE_OPTIONS = "a mapping of option: value (scalar values or {env: VARIABLE}, each key once)"
# How a file's value of each kind is checked and converted (to WRONG when it is not one).
_CONVERT: dict[Kind, Callable[[Reader, Any], Any]] = {
    Kind.TEXT: _text,
    Kind.COLUMN: _text,
    Kind.TABLE: _text,
    Kind.FUNCTION: _text,
    Kind.CHOICE: _text,  # the declaration checks the value (and names the allowed ones)
    Kind.LOCATION: _location,
    Kind.NAMES: _names,
    Kind.UPSTREAMS: _upstreams,
    Kind.WHOLE: _count,
    Kind.SECONDS: _seconds,
    Kind.START: _start,
    Kind.OPTIONS: _options,
    Kind.STORAGE_OPTIONS: _storage_options,
    Kind.SECRET: _secret,
    Kind.TARGET: _target,
}


def key_checks(options: Iterable[Option]) -> dict[str, tuple[str, Callable[[Reader, Any], Any]]]:
    """Each option's key -> (what its value must be, its converter)."""
    return {o.key: (o.shape, _CONVERT[o.kind]) for o in options}


# key -> (what it must be, converter returning the value or WRONG), from the declarations
UPSTREAM_KEYS = key_checks(UPSTREAM_OPTIONS)
PIPELINE_KEYS = key_checks(PIPELINE_OPTIONS)
TOP_KEYS: dict[str, tuple[str, Callable[[Reader, Any], Any]]] = {
    "upstreams": ("a mapping of name: {path: ..., ...}", lambda _r, v: v),
    "pipelines": ("a mapping of name: {upstreams: [...], target: ..., ...}", lambda _r, v: v),
    "control_root": ("text (where the control tables live)", _location),
    "control_storage_options": (_STORAGE_OPTIONS, _storage_options),
}
