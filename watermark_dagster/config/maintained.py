"""Which declared SQL a batch can maintain from the change rows alone: no Spark, no JVM.

An aggregate over one upstream, grouped by the columns through which that upstream holds
the target keys, is a sum over the upstream's rows. A batch can then fold the signed change
rows of its range (``+1`` for an insert or an update's after-image, ``-1`` for a delete or
an update's before-image) into per-group deltas and add them to a stored state, instead of
reading every row of the touched groups again (:mod:`~watermark_dagster.read.maintain`).

:func:`maintained_form` finds each such aggregate in the query and says how:

* **What qualifies:** a ``SELECT ... FROM upstream [alias] [WHERE ...] GROUP BY columns
  [HAVING ...]`` that is the whole query, a derived table in a ``FROM`` or ``JOIN``, or a
  ``WITH`` query; the only reference to that upstream in the whole query; no join,
  subquery, window, ``DISTINCT`` or ``FILTER`` inside it; grouped by plain columns; every
  aggregate one of ``COUNT(*)``, ``COUNT(x)``, ``COUNT_IF(p)``, ``SUM(x)`` and ``AVG(x)``
  (no ``DISTINCT``), named with ``AS``. Each output is an expression of the aggregates and
  the grouped columns (``COALESCE(SUM(x), 0)``, ``SUM(x) / COUNT(*)``).
* **The state** per group: ``_wm_rows`` (the rows, which tells when a group empties), and
  per aggregate a sum and a count of its non-NULL values (``SUM`` of no non-NULL value is
  NULL, not 0). ``state_sql`` computes it from any rows of the upstream carrying a sign
  column ``_wm_sign``: the change rows for a delta, the snapshot (all ``+1``) to rebuild.
* **The outputs** are the query's own expressions with each aggregate replaced by its value
  from the state, and ``HAVING`` likewise; a group is present while its ``_wm_rows`` is
  positive, as a ``GROUP BY`` gives a group only for rows that pass the ``WHERE``.
* **The query** (``sql``) is the declared one with the aggregate replaced by a view of the
  maintained rows, so the rest of it (a join to the customers, the ``COALESCE`` around a
  left join's sums) runs as the incremental form runs it.

What the text cannot show is checked when a batch runs, before anything is written: that
the upstream is read from its change feed or appended files, that the grouped columns are
its key path to the target keys, and that every ``SUM`` and ``AVG`` adds exact numbers
(integers, or decimals for ``SUM``): floating-point sums depend on the order of the
additions, so a maintained sum would differ from a recomputed one in its last bits.
"""

import functools
import hashlib
from collections.abc import Collection
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from watermark_dagster.errors import ConfigurationError

SIGN = "_wm_sign"
ROWS = "_wm_rows"
DIALECT = "spark"

# What an aggregate select may hold: anything else (ORDER BY, DISTINCT, QUALIFY, a join,
# a WITH of its own) leaves it to the other strategies.
_PARTS = frozenset({"expressions", "from_", "from", "where", "group", "having"})

# The state sum of an aggregate's argument over signed rows, and its count of non-NULL
# values; ``_wm_arg`` stands for the argument.
_SUM = f"COALESCE(SUM(CASE WHEN {SIGN} > 0 THEN _wm_arg ELSE -(_wm_arg) END), 0)"
_COUNT = f"COALESCE(SUM(CASE WHEN _wm_arg IS NOT NULL THEN {SIGN} ELSE 0 END), 0)"
_COUNT_IF = f"COALESCE(SUM(CASE WHEN _wm_arg THEN {SIGN} ELSE 0 END), 0)"


@dataclass(frozen=True)
class StateColumn:
    """One column of the state: its name and how the state query computes it."""

    name: str
    sql: str


@dataclass(frozen=True)
class MaintainedAggregate:
    """One aggregate of a declared query that batches maintain from change rows.

    Attributes:
        upstream: the upstream it aggregates (as the query spells it, lower case).
        group: the upstream's columns it groups by, lower case, in ``GROUP BY`` order;
            the state's key columns are ``_wm_g0``, ``_wm_g1``... in this order.
        state: the state's value columns: ``_wm_rows`` first.
        state_sql: the state of every group from rows of the upstream's view that carry
            ``_wm_sign`` (keys, then the value columns).
        outputs: the aggregate's output columns (name, expression over the state).
        having: its ``HAVING`` over the state, or None.
        original_sql: the aggregate as written (Spark analyses it for the output types).
        exact_sums: the state columns that sum a ``SUM``'s or an ``AVG``'s argument
            (``AVG``'s marked), whose types a batch checks are exact.
        view: the name of the view that replaces it in :attr:`MaintainedForm.sql`.
    """

    upstream: str
    group: tuple[str, ...]
    state: tuple[StateColumn, ...]
    state_sql: str
    outputs: tuple[tuple[str, str], ...]
    having: str | None
    original_sql: str
    exact_sums: tuple[tuple[str, bool], ...]
    view: str

    @property
    def fingerprint(self) -> str:
        """A digest of the state's definition: a state stored under another definition
        (the query was edited) is rebuilt, never added to."""
        return hashlib.sha256(self.state_sql.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class MaintainedForm:
    """A declared query whose aggregates a batch maintains.

    Attributes:
        aggregates: each maintained aggregate (one per upstream it reads).
        sql: the query with each aggregate replaced by ``SELECT * FROM`` its view.
    """

    aggregates: tuple[MaintainedAggregate, ...]
    sql: str


class Unmaintainable(str):
    """Why a query cannot be maintained (a reason in words)."""


def maintained_form(sql: str, upstreams: Collection[str]) -> MaintainedForm | Unmaintainable:
    """The maintained form of a declared query over ``upstreams``, or why there is none
    (see the module's docstring)."""
    try:
        tree = sqlglot.parse_one(sql, dialect=DIALECT)
    except (ParseError, TokenError) as e:
        return Unmaintainable(f"the SQL does not parse ({e})")
    names = {u.lower() for u in upstreams}
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    references: dict[str, int] = {}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if name not in ctes:
            references[name] = references.get(name, 0) + 1
    found: list[tuple[exp.Select, MaintainedAggregate]] = []
    reasons: list[str] = []
    for select in list(tree.find_all(exp.Select)):
        if select.args.get("group") is None:
            continue
        outcome = _aggregate(select, names, ctes, references, len(found))
        if isinstance(outcome, MaintainedAggregate):
            found.append((select, outcome))
        else:
            reasons.append(outcome)
    if not found:
        return Unmaintainable(
            reasons[0] if reasons else "it has no GROUP BY over one upstream to maintain"
        )
    for select, aggregate in found:
        view = exp.select("*").from_(exp.to_identifier(aggregate.view))
        tree = view if select is tree else tree
        select.replace(view)
    return MaintainedForm(tuple(a for _, a in found), tree.sql(dialect=DIALECT))


def _aggregate(
    select: exp.Select,
    upstreams: Collection[str],
    ctes: Collection[str],
    references: dict[str, int],
    index: int,
) -> MaintainedAggregate | Unmaintainable:
    parts = {k for k, v in select.args.items() if v}
    if "joins" in parts:
        return Unmaintainable("its GROUP BY query reads a join")
    if parts - _PARTS:
        return Unmaintainable(
            f"its GROUP BY query also has {', '.join(sorted(parts - _PARTS)).upper()}"
        )
    parent = select.parent
    placed = (
        parent is None
        or isinstance(parent, exp.CTE)
        or (isinstance(parent, exp.Subquery) and isinstance(parent.parent, (exp.From, exp.Join)))
    )
    if not placed:
        return Unmaintainable("its GROUP BY query is inside an expression or a set operation")
    tables = list(select.find_all(exp.Table))
    if len(tables) != 1 or any(s is not select for s in select.find_all(exp.Select)):
        return Unmaintainable("its GROUP BY query reads a join or a subquery")
    table = tables[0]
    upstream = table.name.lower()
    if upstream in ctes or upstream not in upstreams or table.args.get("db"):
        return Unmaintainable("its GROUP BY query reads no upstream directly")
    if references.get(upstream, 0) != 1:
        return Unmaintainable(f"it reads {upstream} more than once")
    if select.find(exp.Window) is not None or select.find(exp.Filter) is not None:
        return Unmaintainable("its GROUP BY query has a window or an aggregate FILTER")
    qualifiers = {"", upstream, table.alias.lower()}
    group_by = select.args["group"]
    group: list[str] = []
    for column in group_by.expressions:
        if not isinstance(column, exp.Column) or column.table.lower() not in qualifiers:
            return Unmaintainable("it groups by an expression, not a column of the upstream")
        group.append(column.name.lower())
    builder = _StateBuilder(group, index)
    outputs: list[tuple[str, str]] = []
    for item in select.expressions:
        name = item.alias_or_name
        if not isinstance(item, (exp.Alias, exp.Column)) or not name:
            return Unmaintainable(f"an output of its GROUP BY query has no name: {item.sql()}")
        value = builder.final(item.this if isinstance(item, exp.Alias) else item)
        if isinstance(value, Unmaintainable):
            return value
        outputs.append((name, value))
    having = select.args.get("having")
    kept = builder.final(having.this) if having is not None else None
    if isinstance(kept, Unmaintainable):
        return kept
    where = select.args.get("where")
    state = exp.select(
        *[exp.alias_(exp.column(g, quoted=True), f"_wm_g{i}") for i, g in enumerate(group)],
        *[exp.alias_(sqlglot.parse_one(c.sql, dialect=DIALECT), c.name) for c in builder.state],
    ).from_(table.copy())
    if where is not None:
        state = state.where(where.this.copy())
    state = state.group_by(*[exp.column(g, quoted=True) for g in group])
    return MaintainedAggregate(
        upstream=upstream,
        group=tuple(group),
        state=tuple(builder.state),
        state_sql=state.sql(dialect=DIALECT),
        outputs=tuple(outputs),
        having=kept,
        original_sql=select.sql(dialect=DIALECT),
        exact_sums=tuple(builder.sums),
        view=f"_wm_maintained_{index}",
    )


class _StateBuilder:
    """The state columns one aggregate select needs, each aggregate once, and its
    outputs rewritten over them."""

    def __init__(self, group: list[str], index: int) -> None:
        self.group = group
        self.state: list[StateColumn] = [StateColumn(ROWS, f"COALESCE(SUM({SIGN}), 0)")]
        self.sums: list[tuple[str, bool]] = []
        self._columns: dict[tuple[str, str], str] = {}

    def _column(self, template: str, argument: exp.Expr) -> str:
        """The state column computing ``template`` of ``argument`` (added once)."""
        sql = _filled(template, argument)
        if (template, sql) not in self._columns:
            name = f"_wm_a{len(self.state) - 1}"
            self.state.append(StateColumn(name, sql))
            self._columns[(template, sql)] = name
        return self._columns[(template, sql)]

    def final(self, written: exp.Expr) -> str | Unmaintainable:
        """``written`` over the state: each aggregate replaced by its value, each grouped
        column by the state's key (on a copy: the query's tree is left as it is)."""
        expression = written.copy()
        for node in expression.find_all(exp.AggFunc):
            reason = self._refused(node)
            if reason is not None:
                return Unmaintainable(reason)
        replaced: dict[int, exp.Expr] = {}
        for node in list(expression.find_all(exp.AggFunc)):
            replaced[id(node)] = self._value(node)
        for column in expression.find_all(exp.Column):
            inside = any(id(a) in replaced for a in _ancestors(column))
            if not inside and column.name.lower() not in self.group:
                return Unmaintainable(
                    f"an output uses {column.sql()} outside an aggregate and the GROUP BY"
                )

        def swap(node: exp.Expr) -> exp.Expr:
            if id(node) in replaced:
                return replaced[id(node)]
            if isinstance(node, exp.Column) and node.name.lower() in self.group:
                return exp.column(f"_wm_g{self.group.index(node.name.lower())}")
            return node

        return expression.transform(swap, copy=False).sql(dialect=DIALECT)

    def _refused(self, node: exp.AggFunc) -> str | None:
        if not isinstance(node, (exp.Count, exp.Sum, exp.Avg, exp.CountIf)):
            return f"{node.sql(dialect=DIALECT)} is not a sum of per-row values"
        argument = node.this
        if isinstance(argument, exp.Distinct):
            return f"{node.sql(dialect=DIALECT)} counts distinct values"
        if argument is not None and argument.find(exp.AggFunc) is not None:
            return f"{node.sql(dialect=DIALECT)} nests an aggregate"
        return None

    def _value(self, node: exp.AggFunc) -> exp.Expr:
        argument = node.this
        if isinstance(node, exp.Count):
            if argument is None or isinstance(argument, exp.Star) or _non_null(argument):
                return exp.column(ROWS)
            return exp.column(self._column(_COUNT, argument))
        if isinstance(node, exp.CountIf):
            return exp.column(self._column(_COUNT_IF, argument))
        total, count = self._column(_SUM, argument), self._column(_COUNT, argument)
        average = isinstance(node, exp.Avg)
        self.sums.append((total, average))
        value = f"CAST({total} AS DOUBLE) / {count}" if average else total
        return sqlglot.parse_one(f"CASE WHEN {count} > 0 THEN {value} END", dialect=DIALECT)


def _filled(template: str, argument: exp.Expr) -> str:
    """``template`` with ``_wm_arg`` replaced by ``argument``."""
    tree = sqlglot.parse_one(template, dialect=DIALECT)
    for column in list(tree.find_all(exp.Column)):
        if column.name == "_wm_arg":
            column.replace(argument.copy())
    return tree.sql(dialect=DIALECT)


def _non_null(argument: exp.Expr) -> bool:
    """A literal that is never NULL (``COUNT(1)`` counts rows)."""
    return isinstance(argument, exp.Literal)


def _ancestors(node: exp.Expr) -> list[exp.Expr]:
    found: list[exp.Expr] = []
    parent = node.parent
    while parent is not None:
        found.append(parent)
        parent = parent.parent
    return found


@functools.lru_cache(maxsize=256)
def _form_of(sql: str, upstreams: tuple[str, ...]) -> MaintainedForm | Unmaintainable:
    return maintained_form(sql, upstreams)


def form_of(sql: str | None, upstreams: Collection[str]) -> MaintainedForm | Unmaintainable:
    """:func:`maintained_form` of a pipeline's declared ``sql`` (None: not declared SQL),
    parsed once per query."""
    if sql is None:
        return Unmaintainable(
            "only declared SQL is maintained (a Python function's aggregates are not read)"
        )
    return _form_of(sql, tuple(upstreams))


def refuse_unmaintainable(pipeline: str, form: MaintainedForm | Unmaintainable) -> None:
    """Refuse ``strategy='maintain'`` for a pipeline whose form is ``form``.

    Raises:
        ConfigurationError: there is nothing to maintain.
    """
    if isinstance(form, Unmaintainable):
        raise ConfigurationError(
            f"Pipeline '{pipeline}' sets strategy='maintain', but its target cannot be "
            f"maintained from change rows: {form}.",
            pipeline=pipeline,
            fix="use strategy='auto' (it maintains where it can) or 'incremental'; "
            "maintain applies to declared SQL whose GROUP BY over one upstream sums "
            "per-row values (COUNT, COUNT_IF, SUM, AVG; see docs/declared.md).",
        )
