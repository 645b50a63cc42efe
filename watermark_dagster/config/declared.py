"""Declared pipelines: the user writes the full transform once, the library derives the
incremental one.

A declared pipeline gives

* the **full transform**, as a Python function of the upstreams' snapshots (one parameter
  per upstream, named after it) or as Spark SQL text over views named after the upstreams;
* for every upstream, its **key path**: how one of its rows reaches the target's key.
  Either the target key columns are in the upstream itself (``"order_id"``), or a join path
  leads there through other upstreams::

      customers.customer_id -> orders.customer_id -> orders.order_id

  reads: a changed ``customers`` row's ``customer_id`` matches ``orders.customer_id``, and
  those orders' ``order_id`` is the target key. Each hop after the first names the column
  a row is matched on and then the column carried to the next hop, both in one upstream.
  Composite columns are written ``lines.(order_id, line_no)``.

Each batch, the keys a batch touched are derived from every upstream's change rows (the
before- and after-image of an update both count, so a row whose join key moved updates
the old and the new target row; deletes count too), followed along the key paths through
the pinned snapshots, recomputed with the full transform, and written as upserts and
deletes through the target's MERGE.

What cannot be derived is refused when the definitions load, naming the pipeline, the
upstream and the fix: a missing or malformed key path, a path through an upstream the
pipeline does not read, a function whose parameters are not the upstreams, and SQL that
its own equalities do not prove exact (:mod:`~watermark_dagster.config.declared_sql` and
:mod:`~watermark_dagster.config.key_inference`, which also infers the paths the query
follows: a declared path must be one of them, and a batch follows them all).

The promise the declaration makes, and that the library relies on: the full transform's
row for target key ``k`` depends only on the rows that reach ``k`` along the key paths.
"""

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from watermark_dagster.config.key_paths import Hop, KeyPath
from watermark_dagster.config.names import validate_name
from watermark_dagster.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from watermark_dagster.config.key_inference.inference import Inference

FullTransform = Callable[..., "DataFrame"]
"""``full(orders=..., customers=...) -> DataFrame``: the target computed from scratch."""

KeyPathSpec = str | Sequence[str]
"""A key path as written: a column, a list of columns, or ``"a.x -> b.x -> b.y"``."""

_ARROW = re.compile(r"\s*(?:->|→)\s*")
_STEP = re.compile(r"^\s*(?P<table>[A-Za-z_]\w*)\s*\.\s*(?:\((?P<many>[^()]*)\)|(?P<one>\S+))\s*$")

_PATH_EXAMPLE = "customers.customer_id -> orders.customer_id -> orders.order_id"


@dataclass(frozen=True)
class Declared:
    """The declared form of a pipeline: the full transform and every upstream's key path.

    Give exactly one of ``function`` and ``sql``.

    Args:
        key_paths: per upstream, its :class:`KeyPath`.
        function: the full transform, called with one snapshot per upstream, by name.
        sql: the full transform as one Spark SQL query over views named after the upstreams.
    """

    key_paths: Mapping[str, KeyPath]
    function: FullTransform | None = None
    sql: str | None = None
    # SQL only: every path a batch follows, per upstream (the declared one first, then
    # those the query adds: an upstream joined to itself has one per reference); None
    # until the upstreams' schemas place every column (see paths_for_batch).
    inferred: Mapping[str, tuple[KeyPath, ...]] | None = None


def _every_path(
    declared: Mapping[str, KeyPath], inferred: "Inference"
) -> dict[str, tuple[KeyPath, ...]]:
    every: dict[str, tuple[KeyPath, ...]] = {}
    for upstream, written in declared.items():
        path = inferred.keyed(written)
        more = [p for p in inferred.paths.get(upstream.lower(), ()) if p != path.folded()]
        every[upstream] = (path, *(replace(p, upstream=upstream) for p in more))
    return every


def paths_for_batch(
    pipeline: str,
    declared: Declared,
    keys: Sequence[str],
    schemas: Mapping[str, Sequence[str]],
) -> dict[str, tuple[KeyPath, ...]]:
    """Every key path a batch follows, per upstream: the declared ones for a function;
    for SQL, those the query proves with the snapshots' ``schemas`` (proven again every
    batch: the definitions may have left it open, or placed a name that a column of the
    schemas shadows).

    Raises:
        ConfigurationError: the SQL is refused once the schemas place its columns.
    """
    if declared.sql is None:
        return {u: (p,) for u, p in declared.key_paths.items()}
    # Proven again with the schemas every batch (milliseconds): what the definitions
    # placed by name alone (an alias that a column of the subquery's own table shadows)
    # is settled here, before anything is written.
    from watermark_dagster.config.declared_sql import check_sql

    inferred = check_sql(
        pipeline, declared.sql, paths=declared.key_paths, keys=keys, schemas=schemas
    )
    assert inferred is not None  # with schemas the proof is never open
    return _every_path(declared.key_paths, inferred)


def _columns(text: str, pipeline: str, upstream: str, written: str) -> tuple[str, ...]:
    names = tuple(c.strip() for c in text.split(","))
    for c in names:
        try:
            validate_name("key path column", c.strip("`"))
        except ConfigurationError as e:
            raise _path_error(pipeline, upstream, written, e.reason) from None
    return tuple(c.strip("`") for c in names)


def _path_error(pipeline: str, upstream: str, written: object, problem: str) -> ConfigurationError:
    return ConfigurationError(
        f"Pipeline '{pipeline}': the key path of upstream '{upstream}' ({written!r}) {problem}",
        pipeline=pipeline,
        upstream=upstream,
        fix=f"give the target key columns the upstream holds (e.g. 'order_id'), or a join "
        f"path to them through the pipeline's upstreams (e.g. '{_PATH_EXAMPLE}').",
    )


def parse_key_path(
    pipeline: str, upstream: str, spec: object, *, keys: Sequence[str], upstreams: Sequence[str]
) -> KeyPath:
    """``spec`` as a :class:`KeyPath` of ``upstream`` in ``pipeline``, checked against the
    pipeline's target ``keys`` and ``upstreams``.

    Raises:
        ConfigurationError: the path is malformed, starts elsewhere, goes through an
            upstream the pipeline does not read, or does not end at as many columns as the
            target has keys. The message names the pipeline, the upstream and the fix.
    """
    if isinstance(spec, KeyPath):
        spec = str(spec)
    if isinstance(spec, str) and not _ARROW.search(spec) and "." not in spec:
        spec = spec.split(",")
    if isinstance(spec, (list, tuple)):
        items = cast("list[object]", list(spec))  # pyright: ignore[reportUnknownArgumentType]
        names = [c for c in items if isinstance(c, str)]
        if not names or len(names) != len(items):
            raise _path_error(pipeline, upstream, items, "is not a list of column names.")
        path = KeyPath(upstream, _columns(",".join(names), pipeline, upstream, str(names)))
    elif isinstance(spec, str):
        steps: list[tuple[str, tuple[str, ...]]] = []
        for text in _ARROW.split(spec.strip()):
            m = _STEP.match(text)
            if m is None:
                raise _path_error(
                    pipeline, upstream, spec, f"has a step {text!r} that is not upstream.column."
                )
            columns = _columns(m["many"] or m["one"], pipeline, upstream, spec)
            steps.append((m["table"], columns))
        if steps[0][0] != upstream:
            raise _path_error(
                pipeline, upstream, spec, f"starts at '{steps[0][0]}', not at '{upstream}'."
            )
        if len(steps) % 2 == 0:
            raise _path_error(
                pipeline,
                upstream,
                spec,
                "has an even number of steps: after the first, each upstream is named twice, "
                "the column it is matched on and the column carried on.",
            )
        hops: list[Hop] = []
        for (into, match), (leave, carry) in zip(steps[1::2], steps[2::2], strict=True):
            if into != leave:
                raise _path_error(
                    pipeline,
                    upstream,
                    spec,
                    f"enters '{into}' and leaves from '{leave}': a hop stays in one upstream.",
                )
            hops.append(Hop(into, match, carry))
        path = KeyPath(upstream, steps[0][1], tuple(hops))
        seen = [upstream]
        previous = path.start
        for hop in path.hops:
            if hop.upstream not in upstreams:
                raise _path_error(
                    pipeline,
                    upstream,
                    spec,
                    f"goes through '{hop.upstream}', which the pipeline does not read "
                    f"(it reads {list(upstreams)}).",
                )
            if hop.upstream in seen:
                raise _path_error(pipeline, upstream, spec, f"visits '{hop.upstream}' twice.")
            if len(hop.match) != len(previous):
                raise _path_error(
                    pipeline,
                    upstream,
                    spec,
                    f"matches {len(previous)} column(s) to {len(hop.match)} in '{hop.upstream}'.",
                )
            seen.append(hop.upstream)
            previous = hop.carry
    else:
        kind = type(spec).__name__
        raise _path_error(pipeline, upstream, kind, f"is {kind}, not text.")
    if len(path.end) != len(keys):
        raise _path_error(
            pipeline,
            upstream,
            str(path),
            f"ends at {len(path.end)} column(s) {list(path.end)}, but the target has "
            f"{len(keys)} key column(s) {list(keys)}.",
        )
    return path


def check_function(pipeline: str, function: object, upstreams: Sequence[str]) -> None:
    """The full transform takes one parameter per upstream, named after it.

    Raises:
        ConfigurationError: it is not callable, or its parameters and the upstreams differ.
    """
    if not callable(function):
        raise ConfigurationError(
            f"Pipeline '{pipeline}': the full transform is {type(function).__name__}, not a "
            "function.",
            pipeline=pipeline,
            fix="give a function taking one DataFrame per upstream, named after it.",
        )
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return  # a builtin or C callable: its parameters cannot be checked
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = [p.name for p in parameters if p.kind in kinds]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    bad = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)
    ]
    missing = [u for u in upstreams if u not in named and not takes_any]
    extra = [
        p.name
        for p in parameters
        if p.kind in kinds and p.name not in upstreams and p.default is inspect.Parameter.empty
    ]
    if bad or missing or extra:
        problems: list[str] = []
        if missing:
            problems.append(f"takes no parameter for upstream(s) {missing}")
        if extra:
            problems.append(f"has parameter(s) {extra} that name no upstream it reads")
        if bad:
            problems.append(f"has positional-only parameter(s) {bad}")
        raise ConfigurationError(
            f"Pipeline '{pipeline}': the full transform {'; '.join(problems)}.",
            pipeline=pipeline,
            upstream=missing[0] if missing else None,
            fix=f"define it as def {getattr(function, '__name__', 'full')}"
            f"({', '.join(upstreams)}): each parameter receives that upstream's snapshot.",
        )


def declare(
    pipeline: str,
    upstreams: Mapping[str, KeyPathSpec],
    *,
    keys: Sequence[str],
    function: FullTransform | None = None,
    sql: str | None = None,
) -> Declared:
    """Check a declaration and return it parsed (see the module docstring).

    Raises:
        ConfigurationError: anything that keeps the incremental form from being derived.
    """
    if (function is None) == (sql is None):
        raise ConfigurationError(
            f"Pipeline '{pipeline}': a declared pipeline has "
            f"{'both' if function is not None else 'neither'} a full transform function "
            "and SQL.",
            pipeline=pipeline,
            fix="give exactly one: the function (full=... / @declared_pipeline) or sql=...",
        )
    if not isinstance(upstreams, Mapping) or not upstreams:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigurationError(
            f"Pipeline '{pipeline}': a declared pipeline's upstreams map each upstream to its "
            "key path.",
            pipeline=pipeline,
            fix=f"e.g. upstreams={{'orders': 'order_id', 'customers': '{_PATH_EXAMPLE}'}}.",
        )
    names = [validate_name("upstream name", u) for u in upstreams]
    if not keys:
        raise ConfigurationError(
            f"Pipeline '{pipeline}': a declared pipeline needs the target's key columns.",
            pipeline=pipeline,
            fix="give keys=[...]: the columns that identify one row of the target.",
        )
    for u, spec in upstreams.items():
        if not spec:  # None from YAML, "" or []
            raise _path_error(pipeline, u, spec, "is missing.")
    paths = {
        u: parse_key_path(pipeline, u, spec, keys=keys, upstreams=names)
        for u, spec in upstreams.items()
    }
    if function is not None:
        check_function(pipeline, function, names)
    if sql is not None:
        # Imported here: sqlglot is needed for SQL alone, and a code location of Python
        # pipelines loads without it.
        from watermark_dagster.config.declared_sql import check_sql

        inferred = check_sql(pipeline, sql, paths=paths, keys=keys)
        if inferred is not None:
            return Declared(paths, sql=sql, inferred=_every_path(paths, inferred))
    return Declared(key_paths=paths, function=function, sql=sql)


def describe(declared: Declared) -> dict[str, Any]:
    """The declaration as shown in the Dagster UI and ``watermark list``."""
    described: dict[str, Any] = {
        "form": "sql" if declared.sql is not None else "function",
        # Each declared path as a batch follows it (with the expression of a computed key).
        "key_paths": {
            u: str((declared.inferred or {}).get(u, (p,))[0]) for u, p in declared.key_paths.items()
        },
    }
    # Paths the query adds to the declared ones (an upstream joined to itself, a column
    # it is also joined on): a batch follows them too.
    more = {u: [str(p) for p in ps[1:]] for u, ps in (declared.inferred or {}).items() if ps[1:]}
    if more:
        described["inferred_key_paths"] = more
    return described
