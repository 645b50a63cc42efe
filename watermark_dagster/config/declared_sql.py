"""A declared pipeline's SQL, analysed before anything runs: no Spark, no JVM.

A batch runs the declared SQL over views of the pinned snapshots in which every upstream
that holds the target keys is cut down to the rows of the keys the batch touched. That
gives each touched key the row a full recompute gives it only if the row depends on
nothing but the rows that reach that key along the key paths (the declaration's promise,
see :mod:`watermark_dagster.config.declared`). This module refuses SQL that breaks the
promise in a way the text shows, parsed with sqlglot's Spark dialect:

* anything but one query, or a table other than the upstreams' views and the query's own
  ``WITH`` names (a qualified name, a path, a table function);
* constructs whose rows depend on rows of other keys: windows (``OVER``, ``WINDOW``,
  ``QUALIFY``), ``LIMIT``/``OFFSET``, ``TABLESAMPLE``, ``ROLLUP``/``CUBE``/``GROUPING SETS``;
* non-deterministic functions (``rand()``, ``uuid()``, ``current_timestamp`` ...);
* a top-level aggregate that does not group by every target key, or aggregates all rows;
* an aggregate in a derived table, a ``WITH`` query or a subquery over an upstream whose
  groups are not made of whole key-path groups: it must group by (or be correlated on)
  the upstream's key-path start columns;
* a scalar, ``EXISTS`` or ``IN`` subquery over an upstream that is not correlated on the
  upstream's key-path start columns (an ``IN`` may instead select them). An uncorrelated
  ``(SELECT AVG(amount) FROM orders)`` is computed over the cut-down view and changes
  with every order, so the keys a batch did not touch would keep stale rows.

Columns are matched by name (Spark's identifiers are case-insensitive), because the
upstreams' schemas are not read when the definitions load; an unqualified column inside a
subquery is taken as the subquery's own. What the text cannot show (a Python full
transform, a function sqlglot does not know) is checked on Spark's analyzed plan before
the first write (:mod:`watermark_dagster.read.derive`).
"""

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.optimizer.scope import Scope, ScopeType, build_scope

from watermark_dagster.errors import ConfigurationError


class DeclaredSqlError(ConfigurationError):
    """A declared pipeline's SQL was refused; ``sql_line`` is the line of the SQL text at
    fault (1-based), so a registry file can point at its own line."""

    def __init__(self, message: str, *, sql_line: int | None, **attrs: str | None) -> None:
        super().__init__(message, **attrs)
        self.sql_line = sql_line


# Functions whose value differs between a full recompute and an incremental one.
NON_DETERMINISTIC = frozenset(
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
# Functions written without parentheses; sqlglot reads some of them as columns.
_BARE_FUNCTIONS = frozenset({"CURRENT_TIMESTAMP", "CURRENT_DATE", "CURRENT_TIME", "LOCALTIMESTAMP"})

_PER_KEY = (
    "compute per key (GROUP BY the target keys, or join), or write the pipeline's "
    "incremental transform by hand with @pipeline."
)
_ACROSS_KEYS: tuple[tuple[type[exp.Expr], str, str], ...] = (
    (exp.Window, "OVER", "a window function computes a row from other keys' rows"),
    (exp.Qualify, "QUALIFY", "QUALIFY filters on a window over other keys' rows"),
    (exp.Limit, "LIMIT", "LIMIT keeps rows depending on the other keys present"),
    (exp.Fetch, "FETCH", "FETCH keeps rows depending on the other keys present"),
    (exp.Offset, "OFFSET", "OFFSET drops rows depending on the other keys present"),
    (exp.TableSample, "TABLESAMPLE", "TABLESAMPLE keeps a random subset of rows"),
    (exp.Rollup, "ROLLUP", "ROLLUP adds subtotal rows over several keys"),
    (exp.Cube, "CUBE", "CUBE adds subtotal rows over several keys"),
    (exp.GroupingSets, "GROUPING SETS", "GROUPING SETS adds rows over several keys"),
)


@dataclass(frozen=True)
class _Sql:
    """One parsed query and what the pipeline declares about it."""

    pipeline: str
    starts: Mapping[str, tuple[str, ...]]  # upstream (lower case) -> key-path start columns
    names: Mapping[str, str]  # upstream (lower case) -> as declared
    keys: tuple[str, ...]  # target keys, lower case

    def refuse(
        self, node: exp.Expr | None, problem: str, fix: str, upstream: str | None = None
    ) -> DeclaredSqlError:
        line = _line(node) if node is not None else None
        where = f" (line {line})" if line is not None else ""
        return DeclaredSqlError(
            f"Pipeline '{self.pipeline}': its SQL{where} {problem}, so the incremental form "
            "cannot be derived from it.",
            sql_line=line,
            pipeline=self.pipeline,
            upstream=self.names.get(upstream or "", upstream),
            fix=fix,
        )


def check_sql(
    pipeline: str, sql: str, *, starts: Mapping[str, Sequence[str]], keys: Sequence[str]
) -> None:
    """Refuse, when the definitions load, declared SQL whose incremental form would differ
    from a full recompute (see the module docstring). ``starts`` gives each upstream's
    key-path start columns (``KeyPath.start``).

    Raises:
        DeclaredSqlError: naming the pipeline, the line, the construct and the fix.
    """
    if not isinstance(sql, str) or not sql.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigurationError(
            f"Pipeline '{pipeline}': its SQL is empty.",
            pipeline=pipeline,
            fix="give one SELECT over views named after the upstreams.",
        )
    checked = _Sql(
        pipeline,
        starts={u.lower(): tuple(c.lower() for c in cs) for u, cs in starts.items()},
        names={u.lower(): u for u in starts},
        keys=tuple(k.lower() for k in keys),
    )
    query = _parse(checked, sql)
    _check_constructs(checked, query)
    read = _check_tables(checked, query)
    for lower, name in checked.names.items():
        if lower not in read:
            raise checked.refuse(
                None,
                f"does not read upstream '{name}'",
                f"read it (FROM {name} / JOIN {name}), or remove it from the pipeline's upstreams.",
                upstream=lower,
            )
    root = build_scope(query)
    assert root is not None  # a query always has a scope
    _check_scopes(checked, root)


def _parse(checked: _Sql, sql: str) -> exp.Query:
    try:
        statements = [s for s in sqlglot.parse(sql, read="spark") if s is not None]
    except ParseError as e:
        first = e.errors[0] if e.errors else {}
        line = first.get("line")
        raise DeclaredSqlError(
            f"Pipeline '{checked.pipeline}': its SQL does not parse"
            + (f" (line {line}, column {first.get('col')})" if line else "")
            + f": {first.get('description') or e}.",
            sql_line=line,
            pipeline=checked.pipeline,
            fix="correct the query; it is Spark SQL over views named after the upstreams.",
        ) from None
    except TokenError as e:
        raise DeclaredSqlError(
            f"Pipeline '{checked.pipeline}': its SQL does not parse: {e}.",
            sql_line=None,
            pipeline=checked.pipeline,
            fix="correct the query (an unclosed quote or comment?).",
        ) from None
    if not statements:
        raise ConfigurationError(
            f"Pipeline '{checked.pipeline}': its SQL is empty.",
            pipeline=checked.pipeline,
            fix="give one SELECT over views named after the upstreams.",
        )
    if len(statements) > 1:
        raise checked.refuse(statements[1], "holds more than one statement", "give one query.")
    statement = statements[0]
    if not isinstance(statement, exp.Query):
        first = sql.strip().split(None, 1)[0]
        raise checked.refuse(
            statement,
            f"is not a query (it starts with {first!r})",
            "give one SELECT (or WITH ... SELECT); the library writes the target itself.",
        )
    return statement


def _check_constructs(checked: _Sql, query: exp.Query) -> None:
    for node in query.walk():
        for kind, construct, why in _ACROSS_KEYS:
            if isinstance(node, kind):
                raise checked.refuse(node, f"uses {construct}: {why}", _PER_KEY)
        name = _function_name(node)
        if name in NON_DETERMINISTIC:
            raise checked.refuse(
                node,
                f"calls {name.lower()}, which is non-deterministic: a recomputed key would "
                "not get the value a full recompute gives",
                "pass the value in as a column of an upstream, or drop it.",
            )


def _function_name(node: exp.Expr) -> str | None:
    if isinstance(node, exp.Anonymous):
        return node.name.upper()
    if isinstance(node, exp.Func):
        return node.sql_name()
    if (
        isinstance(node, exp.Column)
        and not node.table
        and isinstance(node.this, exp.Identifier)
        and not node.this.quoted
        and node.name.upper() in _BARE_FUNCTIONS
    ):
        return node.name.upper()
    return None


def _check_tables(checked: _Sql, query: exp.Query) -> set[str]:
    """Every table read is an upstream's view or a ``WITH`` name; returns the upstreams."""
    ctes = {cte.alias_or_name.lower() for cte in query.find_all(exp.CTE)}
    listed = ", ".join(checked.names.values())
    outside = f"read only the upstreams' views ({listed}); declare other tables as upstreams."
    read: set[str] = set()
    for table in query.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            call = table.this.name or table.this.sql(dialect="spark").split("(", 1)[0]
            raise checked.refuse(
                table, f"reads the table function {call}(...), which is not an upstream", outside
            )
        if table.args.get("db") or table.args.get("catalog"):
            raise checked.refuse(
                table, f"reads {table.sql(dialect='spark')}, a table outside the batch", outside
            )
        name = table.name.lower()
        if name in checked.names:
            read.add(name)
        elif name not in ctes:
            raise checked.refuse(
                table,
                f"reads {table.name}, which is neither an upstream of the pipeline nor "
                "defined in its WITH clause",
                outside,
            )
    return read


# ------------------------------------------------------------------------- scopes


def _check_scopes(checked: _Sql, root: Scope) -> None:
    reach_memo: dict[int, frozenset[str]] = {}

    def reach(scope: Scope) -> frozenset[str]:
        """The upstreams whose rows flow into ``scope``'s FROM clause (through derived
        tables, WITH queries and set operations; not its expression subqueries)."""
        if id(scope) not in reach_memo:
            reach_memo[id(scope)] = frozenset()  # a recursive WITH stops here
            found: set[str] = set()
            for branch in scope.set_operation_scopes:
                found |= reach(branch)
            for _, source in scope.selected_sources.values():
                if isinstance(source, Scope):
                    found |= reach(source)
                elif source.name.lower() in checked.names:  # a table
                    found.add(source.name.lower())
            reach_memo[id(scope)] = frozenset(found)
        return reach_memo[id(scope)]

    for scope in root.traverse():
        select = scope.expression
        if not isinstance(select, exp.Select):
            continue
        role = _role(scope)
        grouped = _grouped(select)
        if role == "top":
            _check_top_grouping(checked, select, grouped)
            continue
        pinned = _correlated(scope)
        if role == "subquery":
            matched = pinned | _in_selected(scope)
            for upstream in sorted(reach(scope)):
                missing = [c for c in checked.starts[upstream] if c not in matched]
                if missing:
                    name = checked.names[upstream]
                    raise checked.refuse(
                        select,
                        f"reads upstream '{name}' in a subquery that is not correlated on its "
                        f"key-path column(s) {missing}: its value depends on the rows of every "
                        "key (keys a batch did not touch would keep stale rows)",
                        f"correlate the subquery on the key-path column(s) "
                        f"{list(checked.starts[upstream])} of {name} (e.g. WHERE "
                        f"{name}.{missing[0]} = outer.{missing[0]}), or write the pipeline's "
                        "incremental transform by hand with @pipeline.",
                        upstream=upstream,
                    )
        if grouped is not None:
            for upstream in sorted(reach(scope)):
                missing = [c for c in checked.starts[upstream] if c not in grouped | pinned]
                if missing:
                    by = f"grouped by {sorted(grouped)}" if grouped else "over all its rows"
                    raise checked.refuse(
                        select,
                        f"aggregates rows of upstream '{checked.names[upstream]}' {by}, not per "
                        f"its key-path column(s) {missing}: a group holds rows of keys a batch "
                        "did not touch",
                        f"GROUP BY (or correlate on) the key-path column(s) "
                        f"{list(checked.starts[upstream])} of {checked.names[upstream]}, or "
                        "write the pipeline's incremental transform by hand with @pipeline.",
                        upstream=upstream,
                    )


def _role(scope: Scope) -> str:
    """``top`` (the query's own rows), ``subquery`` (a scalar, EXISTS or IN subquery) or
    ``source`` (a derived table or a WITH query)."""
    while scope.scope_type == ScopeType.SET_OPERATION and scope.parent is not None:
        scope = scope.parent
    if scope.scope_type == ScopeType.ROOT:
        return "top"
    if scope.scope_type == ScopeType.SUBQUERY:
        return "subquery"
    return "source"


def _own(select: exp.Select) -> Iterator[exp.Expr]:
    """The nodes of ``select`` that are not in a nested query."""
    for node in select.walk(prune=lambda n: n is not select and isinstance(n, exp.Query)):
        if node is select or not isinstance(node, exp.Query):
            yield node


def _grouped(select: exp.Select) -> set[str] | None:
    """The column names ``select`` groups by, or None when it does not aggregate.

    ``GROUP BY ALL`` and ``DISTINCT`` group by the selected non-aggregate columns.
    """
    group = select.args.get("group")
    projections = list(select.expressions)
    if group is not None and group.args.get("all"):
        return {p.alias_or_name.lower() for p in projections if not p.find(exp.AggFunc)}
    if group is not None:
        names: set[str] = set()
        for item in group.expressions:
            if isinstance(item, exp.Literal) and item.is_int:  # GROUP BY 1
                position = int(item.name) - 1
                if 0 <= position < len(projections):
                    names.add(projections[position].alias_or_name.lower())
            elif isinstance(item, exp.Column):
                names.add(item.name.lower())
        return names
    if select.args.get("distinct") is not None:
        return {p.alias_or_name.lower() for p in projections}
    aggregates = any(
        isinstance(n, exp.AggFunc)
        for n in _own(select)
        if n.parent is None or not isinstance(n.parent, exp.Window)
    )
    return set() if aggregates else None


def _check_top_grouping(checked: _Sql, select: exp.Select, grouped: set[str] | None) -> None:
    if grouped is None:
        return
    missing = [k for k in checked.keys if k not in grouped]
    if not missing:
        return
    if not grouped:
        raise checked.refuse(
            select,
            "aggregates all rows into one (an aggregate with no GROUP BY)",
            f"GROUP BY the target key columns {list(checked.keys)}, so each output row "
            "belongs to one key.",
        )
    raise checked.refuse(
        select.args.get("group") or select,
        f"groups rows by something other than the target key(s) {missing}",
        f"GROUP BY the target key columns {list(checked.keys)}, so each output row belongs "
        "to one key.",
    )


def _correlated(scope: Scope) -> set[str]:
    """Names of ``scope``'s own columns equated to a column of an enclosing query, in its
    WHERE, HAVING or JOIN conditions (``o.customer_id = c.customer_id``)."""
    inner = {name.lower() for name in scope.selected_sources}
    names: set[str] = set()
    select = scope.expression
    assert isinstance(select, exp.Select)
    for node in _own(select):
        if not isinstance(node, (exp.EQ, exp.NullSafeEQ)):
            continue
        left, right = node.this, node.expression
        if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
            continue
        for mine, other in ((left, right), (right, left)):
            mine_inner = not mine.table or mine.table.lower() in inner
            other_outer = bool(other.table) and other.table.lower() not in inner
            if mine_inner and other_outer:
                names.add(mine.name.lower())
    return names


def _in_selected(scope: Scope) -> set[str]:
    """For the query of ``x IN (SELECT c ...)``: the columns it selects, which ``IN``
    matches against ``x`` (as a correlation would)."""
    outer = scope
    while outer.scope_type == ScopeType.SET_OPERATION and outer.parent is not None:
        outer = outer.parent
    node = outer.expression.parent
    if isinstance(node, exp.Subquery):
        node = node.parent
    if not isinstance(node, exp.In):
        return set()
    select = scope.expression
    assert isinstance(select, exp.Select)
    return {p.alias_or_name.lower() for p in select.expressions}


def _line(node: exp.Expr) -> int | None:
    """The first line of the SQL text ``node`` was parsed from."""
    lines = [n.meta["line"] for n in node.walk() if "line" in n.meta]
    return min(lines) if lines else None
