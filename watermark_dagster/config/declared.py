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
reads anything but the upstreams' views or uses a construct that mixes keys (window
functions, LIMIT, sampling) or is non-deterministic (``rand()``, ``uuid()``,
``current_timestamp``).

The promise the declaration makes, and that the library relies on: the full transform's
row for target key ``k`` depends only on the rows that reach ``k`` along the key paths.
"""

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from watermark_dagster.config.names import validate_name
from watermark_dagster.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

FullTransform = Callable[..., "DataFrame"]
"""``full(orders=..., customers=...) -> DataFrame``: the target computed from scratch."""

KeyPathSpec = str | Sequence[str]
"""A key path as written: a column, a list of columns, or ``"a.x -> b.x -> b.y"``."""

_ARROW = re.compile(r"\s*(?:->|→)\s*")
_STEP = re.compile(r"^\s*(?P<table>[A-Za-z_]\w*)\s*\.\s*(?:\((?P<many>[^()]*)\)|(?P<one>\S+))\s*$")

_PATH_EXAMPLE = "customers.customer_id -> orders.customer_id -> orders.order_id"


@dataclass(frozen=True)
class Hop:
    """One step of a key path: rows of ``upstream`` whose ``match`` columns equal the
    values carried so far; their ``carry`` columns go on."""

    upstream: str
    match: tuple[str, ...]
    carry: tuple[str, ...]


@dataclass(frozen=True)
class KeyPath:
    """How one upstream's rows reach the target's keys.

    ``start`` are the upstream's own columns whose changed values start the walk; each hop
    joins the pinned snapshot of another upstream. With no hops, ``start`` are the columns
    holding the target keys (in the order of the target's ``keys``).
    """

    upstream: str
    start: tuple[str, ...]
    hops: tuple[Hop, ...] = ()

    @property
    def direct(self) -> bool:
        """True when the upstream holds the target keys itself."""
        return not self.hops

    @property
    def end(self) -> tuple[str, ...]:
        """The columns the walk ends at: the target keys, in order."""
        return self.hops[-1].carry if self.hops else self.start

    def __str__(self) -> str:
        def step(table: str, columns: tuple[str, ...]) -> str:
            return (
                f"{table}.{columns[0]}" if len(columns) == 1 else f"{table}.({', '.join(columns)})"
            )

        if self.direct:
            return ", ".join(self.start)
        parts = [step(self.upstream, self.start)]
        for hop in self.hops:
            parts += [step(hop.upstream, hop.match), step(hop.upstream, hop.carry)]
        return " -> ".join(parts)


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
        check_sql(pipeline, sql, upstreams=names, keys=keys)
    return Declared(key_paths=paths, function=function, sql=sql)


# ------------------------------------------------------------------------------- SQL


@dataclass(frozen=True)
class _Token:
    kind: str  # "word", "ident" (backtick-quoted), "string", "number", "punct"
    text: str
    depth: int  # parenthesis depth before the token

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""


_LEXEME = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<line_comment>--[^\n]*)
  | (?P<ident>`(?:[^`]|``)*`)
  | (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
  | (?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?[A-Za-z]*)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)

# Functions whose value differs between a full recompute and an incremental one.
_NON_DETERMINISTIC = frozenset(
    {
        "RAND",
        "RANDN",
        "RANDOM",
        "RANDSTR",
        "UNIFORM",
        "UUID",
        "SHUFFLE",
        "NOW",
        "CURRENT_TIMESTAMP",
        "CURRENT_DATE",
        "CURRENT_TIME",
        "LOCALTIMESTAMP",
        "MONOTONICALLY_INCREASING_ID",
        "SPARK_PARTITION_ID",
        "INPUT_FILE_NAME",
        "INPUT_FILE_BLOCK_START",
        "INPUT_FILE_BLOCK_LENGTH",
    }
)
# Constructs whose rows depend on rows of other keys.
_ACROSS_KEYS = {
    "OVER": "a window function (OVER ...) computes a row from other keys' rows",
    "WINDOW": "a named window (WINDOW ...) computes a row from other keys' rows",
    "LIMIT": "LIMIT keeps rows depending on the other keys present",
    "OFFSET": "OFFSET drops rows depending on the other keys present",
    "TABLESAMPLE": "TABLESAMPLE keeps a random subset of rows",
    "QUALIFY": "QUALIFY filters on a window over other keys' rows",
}
_STATEMENT_STARTS = {"SELECT", "WITH", "FROM", "VALUES", "TABLE"}
_CLAUSE_ENDS = {
    "WHERE",
    "GROUP",
    "HAVING",
    "ORDER",
    "SORT",
    "CLUSTER",
    "DISTRIBUTE",
    "UNION",
    "INTERSECT",
    "EXCEPT",
    "MINUS",
    "LATERAL",
    "PIVOT",
    "UNPIVOT",
    "WINDOW",
    "LIMIT",
    "SELECT",
}
_JOIN_WORDS = {"JOIN", "ON", "USING", "INNER", "LEFT", "RIGHT", "FULL", "OUTER", "CROSS"} | {
    "SEMI",
    "ANTI",
    "NATURAL",
}


def _tokens(sql: str) -> list[_Token]:
    tokens: list[_Token] = []
    depth, i = 0, 0
    while i < len(sql):
        if sql.startswith("/*", i):  # Spark's bracketed comments nest
            level, j = 0, i
            while j < len(sql):
                if sql.startswith("/*", j):
                    level, j = level + 1, j + 2
                elif sql.startswith("*/", j):
                    level, j = level - 1, j + 2
                    if level == 0:
                        break
                else:
                    j += 1
            i = j
            continue
        m = _LEXEME.match(sql, i)
        assert m is not None  # the last alternative matches any character
        i = m.end()
        kind = m.lastgroup or "punct"
        if kind in ("space", "line_comment"):
            continue
        text = m.group()
        if text == ")":
            depth -= 1
        tokens.append(_Token(kind, text, depth))
        if text == "(":
            depth += 1
    return tokens


def _sql_error(
    pipeline: str, problem: str, fix: str, upstream: str | None = None
) -> ConfigurationError:
    return ConfigurationError(
        f"Pipeline '{pipeline}': its SQL {problem}, so the incremental form cannot be "
        "derived from it.",
        pipeline=pipeline,
        upstream=upstream,
        fix=fix,
    )


def check_sql(pipeline: str, sql: str, *, upstreams: Sequence[str], keys: Sequence[str]) -> None:
    """Check a declared pipeline's SQL without a Spark session, before anything runs.

    Spark parses and analyses the text when the pipeline runs, against views of the pinned
    snapshots named after the upstreams; this check refuses, when the definitions load,
    what would parse but could not be derived: more than one statement, anything but a
    query, a table other than the upstreams' views, a window, LIMIT or sampling, a
    non-deterministic function, or a top-level GROUP BY without the target keys.

    Raises:
        ConfigurationError: naming the pipeline, the construct found and the fix.
    """
    if not isinstance(sql, str) or not sql.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigurationError(
            f"Pipeline '{pipeline}': its SQL is empty.",
            pipeline=pipeline,
            fix="give one SELECT over views named after the upstreams.",
        )
    tokens = _tokens(sql)
    while tokens and tokens[-1].text == ";":
        tokens.pop()
    if not tokens:
        raise ConfigurationError(
            f"Pipeline '{pipeline}': its SQL is empty.",
            pipeline=pipeline,
            fix="give one SELECT over views named after the upstreams.",
        )
    opened = sum(t.text == "(" for t in tokens)
    if opened != sum(t.text == ")" for t in tokens) or any(t.depth < 0 for t in tokens):
        raise _sql_error(pipeline, "has unbalanced parentheses", "balance them.")
    if any(t.text == ";" for t in tokens):
        raise _sql_error(pipeline, "holds more than one statement", "give a single query.")
    first = next((t for t in tokens if t.text != "("), tokens[0])
    if first.upper not in _STATEMENT_STARTS:
        raise _sql_error(
            pipeline,
            f"is not a query (it starts with {first.text!r})",
            "give one SELECT (or WITH ... SELECT); the library writes the target itself.",
        )
    ctes: set[str] = set()
    read: set[str] = set()
    for i, t in enumerate(tokens):
        word = t.upper
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        # WINDOW is also a column name; only WINDOW followed by a name starts the clause.
        if word in _ACROSS_KEYS and (
            word != "WINDOW" or (following is not None and following.kind == "word")
        ):
            raise _sql_error(
                pipeline,
                f"uses {t.text}: {_ACROSS_KEYS[word]}",
                "compute per key (GROUP BY the target keys, or join), or write the "
                "pipeline's incremental transform by hand with @pipeline.",
            )
        if word in _NON_DETERMINISTIC and (
            (following is not None and following.text == "(")
            or word.startswith(("CURRENT_", "LOCAL"))
        ):
            raise _sql_error(
                pipeline,
                f"calls {t.text}, which is non-deterministic: a recomputed key would not get "
                "the value a full recompute gives",
                "pass the value in as a column of an upstream, or drop it.",
            )
        if _names_cte(tokens, i):
            ctes.add(t.text.strip("`").lower())
        if word == "JOIN" or (word == "FROM" and _starts_relation(tokens, i)):
            read |= _table_references(pipeline, tokens, i + 1, upstreams, ctes)
    for u in upstreams:
        if u.lower() not in read:
            raise _sql_error(
                pipeline,
                f"does not read upstream '{u}'",
                f"read it (FROM {u} / JOIN {u}), or remove it from the pipeline's upstreams.",
                upstream=u,
            )
    _check_group_by(pipeline, tokens, keys)


def _names_cte(tokens: list[_Token], at: int) -> bool:
    """True when ``tokens[at]`` names a common table expression: ``WITH name AS (`` or
    ``, name (col, ...) AS (``."""
    t = tokens[at]
    if t.kind not in ("word", "ident") or at == 0:
        return False
    if tokens[at - 1].upper not in ("WITH", "RECURSIVE") and tokens[at - 1].text != ",":
        return False
    j = at + 1
    if j < len(tokens) and tokens[j].text == "(":  # a column list
        while j < len(tokens) and not (tokens[j].text == ")" and tokens[j].depth == t.depth):
            j += 1
        j += 1
    return j + 1 < len(tokens) and tokens[j].upper == "AS" and tokens[j + 1].text == "("


def _starts_relation(tokens: list[_Token], at: int) -> bool:
    """False for a FROM inside a function call (``EXTRACT(YEAR FROM ts)``,
    ``TRIM(BOTH ' ' FROM name)``) or after ``IS [NOT] DISTINCT``."""
    if at > 0 and tokens[at - 1].upper == "DISTINCT":
        return False
    depth = tokens[at].depth
    if depth == 0:
        return True
    for j in range(at - 1, -1, -1):
        if tokens[j].depth == depth - 1 and tokens[j].text == "(":
            inner = tokens[j + 1]
            return inner.upper in _STATEMENT_STARTS or inner.text == "("
    return True


def _table_references(
    pipeline: str, tokens: list[_Token], at: int, upstreams: Sequence[str], ctes: set[str]
) -> set[str]:
    """The upstream views read by the FROM or JOIN clause starting at ``tokens[at]``."""
    read: set[str] = set()
    names = {u.lower(): u for u in upstreams}
    depth = tokens[at - 1].depth
    expect_table = True
    i = at
    while i < len(tokens):
        t = tokens[i]
        if t.depth < depth or (t.depth == depth and t.upper in _CLAUSE_ENDS | _JOIN_WORDS):
            break
        if t.depth > depth:
            i += 1
            continue
        if expect_table:
            if t.text == "(":
                expect_table = False  # a subquery: its own FROM is checked where it is
            elif t.kind in ("word", "ident"):
                name = t.text.strip("`").replace("``", "`")
                following = tokens[i + 1] if i + 1 < len(tokens) else None
                if following is not None and following.text == ".":
                    raise _sql_error(
                        pipeline,
                        f"reads {t.text}.{tokens[i + 2].text if i + 2 < len(tokens) else ''}, "
                        "a table outside the batch",
                        "read only the upstreams' views, by their names "
                        f"({', '.join(upstreams)}); declare other tables as upstreams.",
                    )
                if following is not None and following.text == "(":
                    raise _sql_error(
                        pipeline,
                        f"reads the table function {t.text}(...), which is not an upstream",
                        "read only the upstreams' views, by their names.",
                    )
                if name.lower() in names:
                    read.add(name.lower())
                elif name.lower() not in ctes:
                    raise _sql_error(
                        pipeline,
                        f"reads {t.text}, which is neither an upstream of the pipeline nor "
                        "defined in its WITH clause",
                        f"read only the upstreams' views ({', '.join(upstreams)}); declare "
                        "other tables as upstreams.",
                    )
                expect_table = False
            else:
                break
        elif t.text == ",":
            expect_table = True
        i += 1
    return read


def _check_group_by(pipeline: str, tokens: list[_Token], keys: Sequence[str]) -> None:
    """A top-level GROUP BY must group by every target key (by name)."""
    for i, t in enumerate(tokens):
        if t.upper != "GROUP" or t.depth != 0:
            continue
        grouped: set[str] = set()
        j = i + 2  # past GROUP BY
        while j < len(tokens) and not (
            tokens[j].depth == 0 and tokens[j].upper in _CLAUSE_ENDS - {"GROUP"} | {"HAVING"}
        ):
            if tokens[j].upper == "ALL" and j == i + 2:
                return
            if tokens[j].kind in ("word", "ident"):
                grouped.add(tokens[j].text.strip("`").lower())
            j += 1
        missing = [k for k in keys if k.lower() not in grouped]
        if missing:
            raise _sql_error(
                pipeline,
                f"groups rows by something other than the target key(s) {missing}",
                f"GROUP BY the target key columns {list(keys)}, so each output row belongs "
                "to one key.",
            )


def describe(declared: Declared) -> dict[str, Any]:
    """The declaration as shown in the Dagster UI and ``watermark list``."""
    return {
        "form": "sql" if declared.sql is not None else "function",
        "key_paths": {u: str(p) for u, p in declared.key_paths.items()},
    }
