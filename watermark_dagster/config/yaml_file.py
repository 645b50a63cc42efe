"""Declaring upstreams and pipelines in a YAML file, checked when it loads.

Example ``registry.yaml``::

    control_root: /lake/_watermark        # optional; relative paths are from this file
    upstreams:
      orders: {path: /lake/orders, max_versions_per_batch: 50}
      clicks: {path: /landing/clicks, mode: timestamp, format: parquet, cursor: ts,
               tie_break: [id], lag_seconds: 300}
    pipelines:
      orders_clean:
        upstreams: [orders]
        target: /lake/orders_clean
        keys: [order_id]
        transform: my_pkg.transforms:orders_clean   # module:function, imported at load
        full: my_pkg.transforms:orders_clean_full   # optional: the target from scratch;
                                                    # each batch runs what is cheaper
      customer_totals:                              # declared: the incremental form is derived
        upstreams: {payments: customer_id}          # upstream: key path
        target: /lake/customer_totals
        keys: [customer_id]
        sql: SELECT customer_id, SUM(amount) AS total FROM payments GROUP BY customer_id

Each entry takes the keyword arguments of :class:`~watermark_dagster.config.registry.Upstream` or
:class:`~watermark_dagster.config.registry.Pipeline`. Every problem is a
:class:`~watermark_dagster.errors.ConfigurationError` that starts with ``file:line``, names
the entry and the key or value at fault, and ends with the fix; nothing is written.

    >>> registry = load_registry("registry.yaml")
"""

import difflib
import importlib
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml

from watermark_dagster.config.declared import check_function, declare
from watermark_dagster.config.names import validate_name
from watermark_dagster.config.options import Kind, Option
from watermark_dagster.config.pipeline import PIPELINE_OPTIONS, Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.secrets import StorageOptions, as_reference
from watermark_dagster.config.upstream import UPSTREAM_OPTIONS, AnyUpstream, declare_upstream
from watermark_dagster.errors import ConfigurationError, DeclaredSqlError

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MAP_TAG = "tag:yaml.org,2002:map"


class _Mapping(dict[Any, Any]):
    """A YAML mapping that remembers where it and each of its keys are, and which keys
    appeared more than once (plain YAML loading silently keeps the last one)."""

    line: int
    key_lines: dict[Any, int]
    key_text: dict[Any, str]  # each key as written (YAML reads `on:` as True)
    duplicates: list[tuple[Any, int, int]]  # (key, line, line of its first occurrence)
    # For a literal block value (`key: |`), the file line of the text's first line: the
    # text keeps its line breaks, so its line n is at `block_lines[key] + n - 1`.
    block_lines: dict[Any, int]


class _Loader(yaml.SafeLoader):
    """Safe loading, plus line numbers and duplicate keys; timestamps stay text (the
    registry parses them itself, always with a time zone)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> Any:
    explicit = {id(key) for key, _ in node.value}
    # Resolves `<<` merge keys; merged pairs come first and explicit ones may override them.
    loader.flatten_mapping(node)
    data = _Mapping()
    data.line, data.key_lines, data.key_text, data.duplicates = node.start_mark.line + 1, {}, {}, []
    data.block_lines = {}
    first_at: dict[Any, int] = {}  # explicit keys -> line
    # PyYAML's stubs leave construct_object untyped; it returns plain data of any type.
    construct = cast("Callable[..., object]", loader.construct_object)  # pyright: ignore[reportUnknownMemberType]
    yield data
    for key_node, value_node in node.value:
        key = construct(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                "found a key that is a list or a mapping",
                key_node.start_mark,
            )
        line = key_node.start_mark.line + 1
        if id(key_node) in explicit:
            if key in first_at:
                data.duplicates.append((key, line, first_at[key]))
            first_at.setdefault(key, line)
        data[key] = construct(value_node, deep=True)
        data.key_lines[key] = line
        data.key_text[key] = str(getattr(key_node, "value", key))
        if isinstance(value_node, yaml.ScalarNode) and value_node.style == "|":
            data.block_lines[key] = value_node.start_mark.line + 2  # the line after `|`


_Loader.add_constructor(_MAP_TAG, _construct_mapping)


@dataclass(frozen=True)
class RegistryFile:
    """What a registry file declares.

    Attributes:
        registry: its upstreams and pipelines.
        control_root: ``control_root:`` (None when the file leaves it to the code location).
        control_storage_options: ``control_storage_options:`` for a control root on an
            object store.
        path: the file.
    """

    registry: Registry
    control_root: str | None
    control_storage_options: StorageOptions | None
    path: Path


class _Reader:
    """Turns one parsed file into checked keyword arguments, raising with file and line."""

    def __init__(self, path: Path, base: Path | None = None) -> None:
        self.path = path
        self.base = path.parent if base is None else base

    # -- errors

    def fail(self, line: int | None, message: str, *, fix: str, **attrs: str) -> ConfigurationError:
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
        self, top: _Mapping, section: str, kind: str, lines: dict[tuple[str, str], int]
    ) -> Iterator[tuple[str, Any, int]]:
        """Each entry of ``section`` (``upstreams:`` or ``pipelines:``, empty when null):
        its checked name, its body and its line, recorded in ``lines`` under ``(kind, name)``.
        """
        at = top.key_lines[section]
        raw = top[section]
        entries = self.mapping(_mapping_at(at) if raw is None else raw, section, at)
        for key, body in entries.items():
            line = entries.key_lines[key]
            name = self.name(key, kind, line, entries.key_text[key])
            lines[(kind, name)] = line
            yield name, body, line

    def mapping(self, value: Any, what: str, line: int | None) -> _Mapping:
        if not isinstance(value, _Mapping):
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

    def known_keys(self, entry: _Mapping, allowed: Mapping[str, Any], what: str, of: str) -> None:
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

    def convert(self, entry: _Mapping, key: str, what: str, checks: Mapping[str, Any]) -> Any:
        value = entry[key]
        line = entry.key_lines[key]
        expected, convert = checks[key]
        converted = convert(self, value)
        if converted is _WRONG:
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
        if "://" in value:
            return value
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else (self.base / path).resolve())

    def transform(
        self, spec: str, what: str, line: int, key: str = "transform"
    ) -> Callable[..., Any]:
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


_WRONG: Any = _Wrong()


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


def _text(_: _Reader, value: Any) -> Any:
    return value if isinstance(value, str) and value.strip() else _WRONG


def _location(reader: _Reader, value: Any) -> Any:
    return reader.location(value) if isinstance(value, str) and value.strip() else _WRONG


def _names(_: _Reader, value: Any) -> Any:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in cast("list[object]", value)):
        return tuple(cast("list[str]", value))
    return _WRONG


def _upstreams(reader: _Reader, value: Any) -> Any:
    """A list of names, or (a declared pipeline) a mapping of name: key path."""
    if not isinstance(value, dict):
        return _names(reader, value)
    paths = cast("dict[object, object]", value)
    if getattr(paths, "duplicates", None) or not all(isinstance(k, str) for k in paths):
        return _WRONG
    for spec in paths.values():
        listed = isinstance(spec, list) and all(
            isinstance(c, str) for c in cast("list[object]", spec)
        )
        if spec is not None and not isinstance(spec, str) and not listed:
            return _WRONG
    return dict(cast("dict[str, Any]", paths))


def _count(_: _Reader, value: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else _WRONG


def _seconds(_: _Reader, value: Any) -> Any:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else _WRONG


def _start(_: _Reader, value: Any) -> Any:
    return value if isinstance(value, str | int) and not isinstance(value, bool) else _WRONG


def _options(_: _Reader, value: Any) -> Any:
    if not isinstance(value, dict):
        return _WRONG
    options = cast("dict[object, object]", value)
    if getattr(options, "duplicates", None):
        return _WRONG
    if not all(isinstance(v, str | int | float | bool) for v in options.values()):
        return _WRONG
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}


def _storage_options(reader: _Reader, value: Any) -> Any:
    """Like :func:`_options`, and a value may be ``{env: VARIABLE}``: read from the
    environment when the table is opened (credentials must be given so)."""
    if not isinstance(value, dict):
        return _WRONG
    options = cast("dict[object, object]", value)
    if getattr(options, "duplicates", None):
        return _WRONG
    references = {
        k: as_reference(cast("dict[object, object]", v))
        for k, v in options.items()
        if isinstance(v, dict)
    }
    if any(r is None for r in references.values()):
        return _WRONG
    plain = _options(reader, {k: v for k, v in options.items() if k not in references})
    if plain is _WRONG:
        return _WRONG
    return {str(k): references[k] if k in references else plain[str(k)] for k in options}


_STORAGE_OPTIONS = "a mapping of option: value (scalar values or {env: VARIABLE}, each key once)"
# How a file's value of each kind is checked and converted (to _WRONG when it is not one).
_CONVERT: dict[Kind, Callable[[_Reader, Any], Any]] = {
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
}


def _checks(options: Iterable[Option]) -> dict[str, tuple[str, Callable[[_Reader, Any], Any]]]:
    return {o.key: (o.shape, _CONVERT[o.kind]) for o in options}


# key -> (what it must be, converter returning the value or _WRONG), from the declarations
UPSTREAM_KEYS = _checks(UPSTREAM_OPTIONS)
PIPELINE_KEYS = _checks(PIPELINE_OPTIONS)
TOP_KEYS: dict[str, tuple[str, Callable[[_Reader, Any], Any]]] = {
    "upstreams": ("a mapping of name: {path: ..., ...}", lambda _r, v: v),
    "pipelines": ("a mapping of name: {upstreams: [...], target: ..., ...}", lambda _r, v: v),
    "control_root": ("text (where the control tables live)", _location),
    "control_storage_options": (_STORAGE_OPTIONS, _storage_options),
}
_OR_TABLE = ("path", "target")
_REQUIRED = {
    "upstream": {"path": "path: /location/of/the/table (or table: schema.table)"},
    "pipeline": {
        "upstreams": "upstreams: [an_upstream]",
        "target": "target: /location/of/the/target (or table: schema.table)",
        "transform": "transform: my_package.transforms:my_function (or a declared "
        "pipeline's full: or sql:)",
    },
}


def load_registry_file(path: str | os.PathLike[str]) -> RegistryFile:
    """Read and check a registry file.

    Args:
        path: the YAML file.

    Returns:
        The registry, with the file's ``control_root`` and ``control_storage_options``.

    Raises:
        ConfigurationError: the file is missing or is not valid YAML, or an entry is wrong:
            an unknown key, a value of the wrong type, a missing path, target or transform,
            a duplicate name, a name that is not an identifier, a pipeline reading an
            unknown upstream, a transform that cannot be imported or is not callable, a
            cycle. The message starts with ``file:line``.
    """
    file = Path(path).expanduser().resolve()
    reader = _Reader(file)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = "does not exist" if isinstance(e, FileNotFoundError) else f"cannot be read ({e})"
        raise reader.fail(
            None,
            f"registry file {reason}.",
            fix="point WATERMARK_REGISTRY (or load_registry) at a readable YAML file.",
        ) from None
    try:
        document = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: plain data only
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise reader.fail(
            mark.line + 1 if mark else None,
            f"not valid YAML: {problem}.",
            fix="check the indentation and quoting around that line.",
        ) from None
    if document is None:
        raise reader.fail(None, "the file is empty.", fix="declare upstreams: and pipelines:.")
    return _read_document(reader, document, "the file")


def load_registry_mapping(
    data: Mapping[str, Any],
    *,
    source: Path,
    base: Path,
    line_of: Callable[[tuple[str | int, ...]], int | None] = lambda _path: None,
    block_start: Callable[[tuple[str | int, ...]], int | None] = lambda _path: None,
    what: str = "the file",
) -> RegistryFile:
    """Check a registry given as plain data (a component's attributes) exactly as a registry
    file is checked, with the same errors.

    Args:
        data: the mapping a registry file holds (``upstreams:``, ``pipelines:``,
            ``control_root:``, ``control_storage_options:``).
        source: the file errors name (``source:line``).
        base: the folder relative paths are taken from.
        line_of: the line of the key at a path of keys and list indexes in ``data``
            (``("pipelines", "orders_clean", "target")``), None when unknown.
        block_start: for a text value written as a literal block (``sql: |``), the line of
            its first line of text.
        what: how errors name the mapping itself.

    Returns:
        The registry, with its control root and storage options.

    Raises:
        ConfigurationError: as :func:`load_registry_file`, each message starting with
            ``source:line`` when ``line_of`` knows the line.
    """
    return _read_document(
        _Reader(source, base), _with_lines(data, (), line_of, block_start, 1), what
    )


def _with_lines(
    value: Any,
    at: tuple[str | int, ...],
    line_of: Callable[[tuple[str | int, ...]], int | None],
    block_start: Callable[[tuple[str | int, ...]], int | None],
    line: int,
) -> Any:
    """Plain data as the loader would have built it: each mapping a :class:`_Mapping`
    knowing its keys' lines (a key whose line is unknown gets its mapping's)."""
    if isinstance(value, list):
        items = cast("list[object]", value)
        return [
            _with_lines(v, (*at, i), line_of, block_start, line_of((*at, i)) or line)
            for i, v in enumerate(items)
        ]
    if not isinstance(value, Mapping):
        return value
    entries = cast("Mapping[Any, Any]", value)
    made = _mapping_at(line)
    for key, item in entries.items():
        path = (*at, str(key))
        key_line = line_of(path) or line
        made[key] = _with_lines(item, path, line_of, block_start, key_line)
        made.key_lines[key] = key_line
        made.key_text[key] = str(key)
        first = block_start(path) if isinstance(item, str) and "\n" in item else None
        if first is not None:
            made.block_lines[key] = first
    return made


def _read_document(reader: _Reader, document: Any, what: str) -> RegistryFile:
    """The registry of a parsed document (its mappings are :class:`_Mapping`)."""
    top = reader.mapping(document, what, 1)
    reader.known_keys(top, TOP_KEYS, "top level", "the file")
    for section in ("upstreams", "pipelines"):
        if section not in top:
            raise reader.fail(
                None,
                f"no {section}: section.",
                fix=f"add {section}: with one entry per {section[:-1]} (`{section}: {{}}` for "
                "none).",
            )
    options: dict[str, Any] = {
        k: reader.convert(top, k, "top level", TOP_KEYS) for k in top if top[k] is not None
    }

    upstreams: list[AnyUpstream] = []
    lines: dict[tuple[str, str], int] = {}
    for name, body, line in reader.entries(top, "upstreams", "upstream", lines):
        if isinstance(body, str):  # shorthand: `orders: /lake/orders`
            body = _mapping_at(line, {"path": body})
        kwargs = _entry(reader, "upstream", name, body, line, UPSTREAM_KEYS)
        try:
            upstreams.append(declare_upstream(name=name, **kwargs))
        except ConfigurationError as e:
            raise reader.rewrap(line, e) from None

    pipelines: list[Pipeline] = []
    declared = [u.name for u in upstreams]
    for name, body, line in reader.entries(top, "pipelines", "pipeline", lines):
        what = f"pipeline '{name}'"
        kwargs = _entry(reader, "pipeline", name, body, line, PIPELINE_KEYS)
        paths: dict[str, Any] | None = None
        if isinstance(kwargs["upstreams"], dict):
            paths = cast("dict[str, Any]", kwargs["upstreams"])
            kwargs["upstreams"] = tuple(paths)
        wanted: tuple[str, ...] = kwargs["upstreams"]
        for upstream in wanted:
            if upstream not in declared:
                close = difflib.get_close_matches(upstream, declared, n=1, cutoff=0.6)
                raise reader.fail(
                    body.key_lines["upstreams"],
                    f"{what} reads unknown upstream {upstream!r}"
                    + (f" (did you mean {close[0]!r}?)" if close else "")
                    + f"; the file declares {declared}.",
                    fix="declare it under upstreams: or fix the name.",
                    pipeline=name,
                )
        full, sql = kwargs.pop("full", None), kwargs.pop("sql", None)
        if full is not None and "transform" in kwargs and paths is None and sql is None:
            # Hand-written with its full transform beside it: strategy picks per batch.
            at = body.key_lines["full"]
            kwargs["full_transform"] = reader.transform(full, what, at, key="full")
            try:
                check_function(name, kwargs["full_transform"], kwargs["upstreams"])
            except ConfigurationError as e:
                raise reader.rewrap(at, e) from None
            full = None
        if full is not None or sql is not None:
            at = body.key_lines["full" if full is not None else "sql"]
            if "transform" in kwargs:
                raise reader.fail(
                    at,
                    f"{what} has both transform: and {'full' if full else 'sql'}:"
                    + (" and maps its upstreams to key paths." if full else "."),
                    fix="keep transform: (hand-written) or the declared full:/sql: with key "
                    "paths, not both; a hand-written pipeline gives its full transform as "
                    "full: beside transform: with its upstreams listed ([a, b]).",
                    pipeline=name,
                )
            if paths is None:
                raise reader.fail(
                    body.key_lines["upstreams"],
                    f"{what} is declared ({'full' if full else 'sql'}:) but its upstreams are "
                    "a list: a declared pipeline maps each upstream to its key path.",
                    fix="write upstreams: {orders: order_id, customers: "
                    "customers.customer_id -> orders.customer_id -> orders.order_id}.",
                    pipeline=name,
                )
            function = reader.transform(full, what, at, key="full") if full else None
            try:
                kwargs["declared"] = declare(
                    name, paths, keys=kwargs.get("keys", ()), function=function, sql=sql
                )
            except DeclaredSqlError as e:
                # Point at the SQL's own line when the file keeps its line breaks.
                first = body.block_lines.get("sql")
                raise reader.rewrap(
                    first + e.sql_line - 1 if first and e.sql_line else at, e
                ) from None
            except ConfigurationError as e:
                raise reader.rewrap(at, e) from None
            if function is not None:
                kwargs.setdefault("description", (function.__doc__ or "").strip() or None)
            kwargs.setdefault("keys", ())
            try:
                pipelines.append(Pipeline(name=name, **kwargs))
            except ConfigurationError as e:
                raise reader.rewrap(line, e) from None
            continue
        if paths is not None:
            raise reader.fail(
                body.key_lines["upstreams"],
                f"{what} maps its upstreams to key paths, but has a hand-written transform:.",
                fix="list the upstreams ([a, b]) for transform:, or give the full transform as "
                "full: (or sql:) to have the incremental transform derived.",
                pipeline=name,
            )
        kwargs["transform"] = reader.transform(
            kwargs["transform"], what, body.key_lines["transform"]
        )
        kwargs.setdefault("description", (kwargs["transform"].__doc__ or "").strip() or None)
        kwargs.setdefault("keys", ())
        try:
            pipelines.append(Pipeline(name=name, **kwargs))
        except ConfigurationError as e:
            raise reader.rewrap(line, e) from None

    try:
        registry = Registry(upstreams=upstreams, pipelines=pipelines)
    except ConfigurationError as e:
        at = lines.get(("pipeline", e.pipeline or "")) or lines.get(("upstream", e.upstream or ""))
        raise reader.rewrap(at or 0, e) from None
    return RegistryFile(
        registry=registry,
        control_root=options.get("control_root"),
        control_storage_options=options.get("control_storage_options"),
        path=reader.path,
    )


def load_registry(path: str | os.PathLike[str]) -> Registry:
    """The :class:`~watermark_dagster.config.registry.Registry` a YAML file declares.

    See :func:`load_registry_file` (which also returns the file's control root) for the
    errors raised.

    Example:
        >>> registry = load_registry("registry.yaml")
        >>> defs = build_definitions(registry, control_root="/lake/_watermark")
    """
    return load_registry_file(path).registry


def _mapping_at(line: int, items: dict[str, Any] | None = None) -> _Mapping:
    """A mapping written by the loader itself (an empty section, a shorthand entry)."""
    made = _Mapping(items or {})
    made.line, made.duplicates = line, []
    made.key_lines, made.key_text = dict.fromkeys(made, line), {k: k for k in made}
    made.block_lines = {}
    return made


def _entry(
    reader: _Reader,
    kind: str,
    name: str,
    body: Any,
    line: int,
    checks: Mapping[str, tuple[str, Callable[[_Reader, Any], Any]]],
) -> dict[str, Any]:
    """An entry's keyword arguments, each key known, of the right type, the required ones
    present; ``key: null`` counts as not given."""
    what = f"{kind} '{name}'"
    body = reader.mapping(_mapping_at(line) if body is None else body, what, line)
    reader.known_keys(body, checks, what, f"an {kind}" if kind == "upstream" else f"a {kind}")
    for key, example in _REQUIRED[kind].items():
        # A table named in the catalog has no path or target: `table:` stands for it.
        if body.get(key) is None and (key not in _OR_TABLE or body.get("table") is None):
            if key == "transform" and (body.get("full") is not None or body.get("sql") is not None):
                continue  # a declared pipeline: its incremental transform is derived
            raise reader.fail(
                body.key_lines.get(key, line),
                f"{what} has no {key}.",
                fix=f"add {example}.",
                **{kind: name},
            )
    return {key: reader.convert(body, key, what, checks) for key in body if body[key] is not None}
