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
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml

from watermark_dagster.config.declared import check_function, declare
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.secrets import StorageOptions
from watermark_dagster.config.upstream import Upstream
from watermark_dagster.config.upstream_kinds import declare_upstream
from watermark_dagster.config.yaml_lines import LineLoader, mapping_at, with_lines
from watermark_dagster.config.yaml_values import PIPELINE_KEYS, TOP_KEYS, UPSTREAM_KEYS, Reader
from watermark_dagster.errors import ConfigurationError, DeclaredSqlError


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
    reader = Reader(file)
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
        document = yaml.load(text, Loader=LineLoader)  # a SafeLoader subclass: plain data only
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
    return _read_document(Reader(source, base), with_lines(data, (), line_of, block_start, 1), what)


def _read_document(reader: Reader, document: Any, what: str) -> RegistryFile:
    """The registry of a parsed document (its mappings are :class:`LinedMapping`)."""
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

    upstreams: list[Upstream] = []
    lines: dict[tuple[str, str], int] = {}
    for name, body, line in reader.entries(top, "upstreams", "upstream", lines):
        if isinstance(body, str):  # shorthand: `orders: /lake/orders`
            body = mapping_at(line, {"path": body})
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


def _entry(
    reader: Reader,
    kind: str,
    name: str,
    body: Any,
    line: int,
    checks: Mapping[str, tuple[str, Callable[[Reader, Any], Any]]],
) -> dict[str, Any]:
    """An entry's keyword arguments, each key known, of the right type, the required ones
    present; ``key: null`` counts as not given."""
    what = f"{kind} '{name}'"
    body = reader.mapping(mapping_at(line) if body is None else body, what, line)
    reader.known_keys(body, checks, what, f"an {kind}" if kind == "upstream" else f"a {kind}")
    for key, example in _REQUIRED[kind].items():
        # A table named in the catalog has no path or target: `table:` stands for it.
        if body.get(key) is None and (key not in _OR_TABLE or body.get("table") is None):
            if key == "transform" and (body.get("full") is not None or body.get("sql") is not None):
                continue  # a declared pipeline: its incremental transform is derived
            if key == "path" and body.get("kind") == "database":
                continue  # named by url and source_table (required by its declaration)
            raise reader.fail(
                body.key_lines.get(key, line),
                f"{what} has no {key}.",
                fix=f"add {example}.",
                **{kind: name},
            )
    return {key: reader.convert(body, key, what, checks) for key in body if body[key] is not None}
