"""A declared pipeline's SQL, analysed before anything runs: no Spark, no JVM.

A batch runs the declared SQL over views of the pinned snapshots in which every upstream
that holds the target keys is cut down to the rows of the keys the batch touched. That
gives each touched key the row a full recompute gives it only if the row depends on
nothing but the rows that reach that key along the key paths. This module accepts only
SQL for which the query itself proves that (parsed with sqlglot's Spark dialect):

* one query, reading no table but the upstreams' views and its own ``WITH`` names (no
  qualified name, path or table function), and no recursive ``WITH``;
* no construct whose rows depend on rows of other keys: ``LIMIT``/``OFFSET``/``FETCH``,
  ``TABLESAMPLE``, ``ROLLUP``/``CUBE``/``GROUPING SETS``, ``PIVOT``/``UNPIVOT``;
* no ``NOT IN (subquery)``: one NULL among the subquery's values empties the answer for
  every key;
* no non-deterministic function (``rand()``, ``uuid()``, ``current_timestamp``,
  ``reflect`` ...);
* every upstream reference reaches the target keys through equalities of the query, each
  key is a plain column of a row that is never NULL-extended, and every window is
  partitioned by the keys (:mod:`~watermark_dagster.config.key_inference`, which infers
  each reference's key path); a declared key path must be one the query follows.

Columns are matched by name (Spark's identifiers are case-insensitive). When the
definitions load the upstreams' schemas are not read: a column that several tables of a
join could hold, unqualified, leaves the proof to the batch, which repeats it with the
snapshots' schemas before it writes. What the text cannot show (a Python full transform,
a function sqlglot does not know) is checked on Spark's analyzed plan before the first
write (:mod:`watermark_dagster.read.derive`).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from watermark_dagster.config.key_inference.inference import Inference, infer
from watermark_dagster.config.key_inference.refusal import Refusal
from watermark_dagster.config.key_paths import KeyPath
from watermark_dagster.errors import ConfigurationError, DeclaredSqlError

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
        # They call any Java method: its answer may differ from call to call.
        "REFLECT",
        "JAVA_METHOD",
        "TRY_REFLECT",
        # Any row of the group, as the plan happens to read them.
        "FIRST",
        "LAST",
        "ANY_VALUE",
        # A random initialization vector.
        "AES_ENCRYPT",
        "TRY_AES_ENCRYPT",
    }
)
# Functions written without parentheses; sqlglot reads some of them as columns.
_BARE_FUNCTIONS = frozenset({"CURRENT_TIMESTAMP", "CURRENT_DATE", "CURRENT_TIME", "LOCALTIMESTAMP"})

_PER_KEY = (
    "compute per key (GROUP BY the target keys, or join), or write the pipeline's "
    "incremental transform by hand with @pipeline."
)
_ACROSS_KEYS: tuple[tuple[type[exp.Expr], str, str], ...] = (
    (exp.Limit, "LIMIT", "LIMIT keeps rows depending on the other keys present"),
    (exp.Fetch, "FETCH", "FETCH keeps rows depending on the other keys present"),
    (exp.Offset, "OFFSET", "OFFSET drops rows depending on the other keys present"),
    (exp.TableSample, "TABLESAMPLE", "TABLESAMPLE keeps a random subset of rows"),
    (exp.Rollup, "ROLLUP", "ROLLUP adds subtotal rows over several keys"),
    (exp.Cube, "CUBE", "CUBE adds subtotal rows over several keys"),
    (exp.GroupingSets, "GROUPING SETS", "GROUPING SETS adds rows over several keys"),
    (exp.Pivot, "PIVOT", "PIVOT aggregates over the rows of every key it does not name"),
)


@dataclass(frozen=True)
class _Sql:
    """One parsed query and what the pipeline declares about it."""

    pipeline: str
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
    pipeline: str,
    sql: str,
    *,
    paths: Mapping[str, KeyPath],
    keys: Sequence[str],
    schemas: Mapping[str, Sequence[str]] | None = None,
) -> Inference | None:
    """Refuse declared SQL whose incremental form could differ from a full recompute (see
    the module docstring), and infer the key path of each of its upstream references.

    ``paths`` are the declared key paths; each must be one the query follows. ``schemas``
    (each upstream's columns) place the unqualified columns of a join; without them such
    a column leaves the proof open.

    Returns:
        The inference, or None when it is open (no schemas and a column only they place).

    Raises:
        DeclaredSqlError: naming the pipeline, the line, the construct and the fix.
    """
    if not isinstance(sql, str) or not sql.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigurationError(
            f"Pipeline '{pipeline}': its SQL is empty.",
            pipeline=pipeline,
            fix="give one SELECT over views named after the upstreams.",
        )
    checked = _Sql(pipeline, names={u.lower(): u for u in paths}, keys=tuple(keys))
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
    try:
        inferred = infer(
            query,
            upstreams=list(paths),
            keys=keys,
            schemas=schemas,
            known=_named(paths),
            source=sql,
        )
    except Refusal as refusal:
        raise checked.refuse(
            refusal.node, refusal.problem, refusal.fix, upstream=refusal.upstream
        ) from None
    if inferred.open:
        if schemas is None:
            return None
        assert inferred.graph is not None
        where = inferred.graph.unresolved[0] if inferred.graph.unresolved else None
        written = where.sql(dialect="spark") if where is not None else "a column"
        raise checked.refuse(
            where,
            f"names {written}, which no table of its FROM clause can be told to hold",
            "qualify the column with its table's alias (o.customer_id).",
        )
    for upstream, declared in paths.items():
        if inferred.explains(declared):
            continue
        found = inferred.paths.get(upstream.lower(), ())
        assert inferred.graph is not None
        if not found:  # read only where no reference is made (a generator's input)
            raise checked.refuse(
                None,
                f"reads upstream '{upstream}' only where no path to the keys can be found",
                "read it in the FROM clause, joined on columns that lead to the keys.",
                upstream=upstream,
            )
        table = next((r.table for r in inferred.graph.refs if r.upstream == upstream.lower()), None)
        raise checked.refuse(
            table,
            f"relates upstream '{upstream}' to the target keys as "
            f"{' and '.join(repr(str(p)) for p in found)}, but its declared key path is "
            f"'{declared}', which the query's equalities do not follow",
            f"declare the key path '{found[0]}' for '{upstream}', or change the query's "
            "join to the one the key path names.",
            upstream=upstream,
        )
    return inferred


def _named(paths: Mapping[str, KeyPath]) -> dict[str, set[str]]:
    """The columns the key paths name, per upstream: each upstream has them."""
    named: dict[str, set[str]] = {}
    for path in paths.values():
        named.setdefault(path.upstream.lower(), set()).update(c.lower() for c in path.start)
        for hop in path.hops:
            named.setdefault(hop.upstream.lower(), set()).update(
                c.lower() for c in (*hop.match, *hop.carry)
            )
    return named


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
        if isinstance(node, exp.With) and node.args.get("recursive"):
            raise checked.refuse(
                node,
                "uses WITH RECURSIVE: a recursive query walks rows of other keys",
                "write the pipeline's incremental transform by hand with @pipeline.",
            )
        if isinstance(node, exp.Lateral) and isinstance(node.this, (exp.Subquery, exp.Query)):
            raise checked.refuse(
                node,
                "uses a LATERAL subquery, whose rows this analysis does not relate to the keys",
                "join a derived table on the key columns instead, or write the pipeline's "
                "incremental transform by hand with @pipeline.",
            )
        if isinstance(node, exp.In) and node.args.get("query") is not None:
            parent = node.parent
            while isinstance(parent, exp.Paren):
                parent = parent.parent
            if isinstance(parent, exp.Not):
                raise checked.refuse(
                    node,
                    "uses NOT IN (subquery): one NULL among the subquery's values makes it "
                    "false for every row, so a change to one key changes every key",
                    "use NOT EXISTS (SELECT 1 FROM ... WHERE inner.column = outer.column).",
                )
        for kind, construct, why in _ACROSS_KEYS:
            if isinstance(node, kind):
                raise checked.refuse(node, f"uses {construct}: {why}", _PER_KEY)
        if isinstance(node, _ORDER_DEPENDENT):
            written = node.sql(dialect="spark").split("(", 1)[0].lower()
            raise checked.refuse(
                node,
                f"uses {written}, whose result follows the order Spark happens to read the "
                "rows in (Spark marks it non-deterministic): a recomputed key may not get "
                "what a full recompute gives",
                "aggregate to values that do not depend on order (count, sum, min, max), "
                "or write the pipeline's incremental transform by hand with @pipeline.",
            )
        name = _function_name(node)
        if name in NON_DETERMINISTIC:
            raise checked.refuse(
                node,
                f"calls {name.lower()}, which is non-deterministic: a recomputed key would "
                "not get the value a full recompute gives",
                "pass the value in as a column of an upstream, or drop it.",
            )


# Aggregates whose result lists the rows in the order they are read (collect_list,
# collect_set, array_agg, string_agg, listagg): Spark marks them non-deterministic, sorted
# or not, and a batch's plan check would refuse them.
_ORDER_DEPENDENT = (exp.ArrayAgg, exp.ArrayUniqueAgg, exp.GroupConcat)


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


def _line(node: exp.Expr) -> int | None:
    """The first line of the SQL text ``node`` was parsed from."""
    lines = [n.meta["line"] for n in node.walk() if "line" in n.meta]
    return min(lines) if lines else None
