"""The walk over a query's scopes: each SELECT's sources, the equalities its clauses
prove (by :mod:`~watermark_dagster.config.key_inference._rules`), its windows, and the
columns it gives the query around it.
"""

from collections.abc import Callable, Iterator, Mapping
from typing import cast

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from watermark_dagster.config.key_inference._classes import Classes, Window
from watermark_dagster.config.key_inference._rules import Always, Rule, join_rule
from watermark_dagster.config.key_inference._sources import (
    Branches,
    Derived,
    Generated,
    Located,
    Node,
    Opaque,
    Ref,
    RenamedTable,
    Source,
    TableSource,
)
from watermark_dagster.config.key_inference.refusal import PER_KEY_FIX, Refusal


class Scopes(Classes):
    """Reads a query's scopes into classes of equal columns (see
    :class:`~watermark_dagster.config.key_inference.inference.Graph`)."""

    def source_of_scope(
        self,
        scope: Scope,
        env: list[dict[str, Source]],
        nullable: bool,
        branches: Branches,
        within: str = "",
    ) -> Derived:
        expression = scope.expression
        if isinstance(expression, exp.SetOperation):
            union = self.joint("union")[0]
            parts = [
                self.source_of_scope(branch, env, nullable, branches | {(union, i)}, within)
                for i, branch in enumerate(scope.set_operation_scopes)
            ]
            names = parts[0].ordered
            outputs: dict[str, Node | None] = {}
            positions: list[Node | None] = []
            for position, name in enumerate(names):
                joint: Node | None = self.joint(name)
                for part in parts:
                    node = part.at(position)
                    if node is None:
                        joint = None
                        break
                    assert joint is not None
                    self.link(node, joint)  # a branch's rows hold it, not the others'

                    if self.null_extended(node):
                        self.null_joints.add(joint)
                positions.append(joint)
                outputs.setdefault(name, joint)
            return renamed_by_alias(Derived(self, outputs, names, [], positions), expression)
        if not isinstance(expression, exp.Select):
            raise Refusal(
                expression, f"uses {expression.key.upper()}, which is not analysed", PER_KEY_FIX
            )
        derived = self._select(scope, expression, env, nullable, branches, within)
        return renamed_by_alias(derived, expression)

    def _select(
        self,
        scope: Scope,
        select: exp.Select,
        env: list[dict[str, Source]],
        nullable: bool,
        branches: Branches,
        within: str,
    ) -> Derived:
        from_ = select.args.get("from_")
        joins: list[exp.Join] = list(select.args.get("joins") or [])
        order = [from_.this.alias_or_name.lower()] if from_ is not None else []
        optional: set[str] = set()
        hidden: set[str] = set()  # the right side of a semi- or anti-join
        using: dict[str, str] = {}  # a USING column -> the alias whose value it is
        for join in joins:
            alias = join.this.alias_or_name.lower()
            side, kind = (join.side or "").upper(), (join.kind or "").upper()
            if kind in ("SEMI", "ANTI"):
                hidden.add(alias)
            elif side == "LEFT":
                optional.add(alias)
            elif side == "RIGHT":
                optional.update(order)
            elif side == "FULL":
                optional.update(order)
                optional.add(alias)
            for identifier in using_columns(join):
                name = identifier.name.lower()
                if side == "FULL":
                    using[name] = ""  # COALESCE of both sides
                elif side == "RIGHT":
                    using[name] = alias
                else:
                    using.setdefault(name, order[0] if order else alias)
            order.append(alias)
        sources: dict[str, Source] = {}
        named = {alias.lower(): source for alias, source in scope.sources.items()}
        laterals = [
            lateral.alias_or_name.lower()
            for lateral in cast("list[exp.Expr]", select.args.get("laterals") or [])
        ]
        first_ref = len(self.refs)
        tables = {
            t.alias_or_name.lower(): t
            for t in [*([from_.this] if from_ is not None else []), *(j.this for j in joins)]
            if isinstance(t, exp.Table)
        }
        for name in dict.fromkeys([*order, *laterals]):
            source = named.get(name)
            if source is None:
                sources[name] = Opaque(self)
                continue
            extended = nullable or name in optional
            if isinstance(source, exp.Table):
                upstream = source.name.lower()
                if upstream in self.upstreams:
                    ref = Ref(len(self.refs), upstream, name, source, extended, branches, within)
                    self.refs.append(ref)
                    schema = self.schemas.get(upstream)
                    alias = source.args.get("alias")
                    renamed = alias.columns if isinstance(alias, exp.TableAlias) else []
                    if renamed:  # FROM t AS x (a, b): the table's columns by position
                        sources[name] = RenamedTable(
                            self, ref, [c.name.lower() for c in renamed], schema
                        )
                    else:
                        sources[name] = TableSource(ref, schema, self.known.get(upstream, set()))
                else:
                    sources[name] = Opaque(self)
            elif source.is_udtf:  # LATERAL VIEW explode(...): row-local values
                names = _generated_names(source.expression)
                self.generated.update(n.lower() for n in names)
                sources[name] = Generated(self, names)
            else:  # a derived table or a WITH query: sees no sibling (not LATERAL)
                where = "in a WITH query" if source.is_cte else "in a derived table"
                derived = self.source_of_scope(source, env, extended, branches, where)
                reference = tables.get(name)
                alias = reference.args.get("alias") if reference is not None else None
                if isinstance(alias, exp.TableAlias) and alias.columns:
                    # FROM w AS q (a, b): the WITH query's columns renamed by position
                    derived = derived.renamed([c.name.lower() for c in alias.columns])
                sources[name] = derived
        levels = [sources, *env]
        selectable = {a: s for a, s in sources.items() if a not in hidden}

        def locate(column: exp.Column, names: "set[str] | None" = None) -> Located:
            """The column's node, and the alias of this scope that holds it (None for a
            column of an enclosing query, or one no source can be told to hold). ``names``
            are the aliases a join's ``ON`` sees (those up to it, its own right side even
            for a semi- or anti-join); elsewhere the selectable ones."""
            here = selectable if names is None else {a: sources[a] for a in names if a in sources}
            name = column.name.lower()
            table = column.table.lower()
            if column.args.get("db") is not None or column.args.get("catalog") is not None:
                # a.b.c: a struct field of b in table a, or of a table's column: a name
                # this analysis does not place.
                return self.unknowable(column, f"{column.sql(dialect='spark')}"), None
            if table:
                for depth, level in enumerate(levels):
                    if table in level:
                        return level[table].node(name), table if depth == 0 else None
                    if depth == 0 and any(s.has(table) for s in here.values()):
                        # Spark reads `s.k` as the field k of this scope's column s before
                        # an enclosing query's alias s: it relates nothing.
                        return None, None
                return self.unknowable(column, name), None
            if name in using:
                holder = using[name]
                if holder in sources:
                    return sources[holder].node(name), holder
                return self.unknowable(column, name), None
            for depth, level in enumerate(levels):
                visible = here if depth == 0 else level
                maybe = [(a, s) for a, s in visible.items() if s.has(name) is not False]
                sure = [(a, s) for a, s in maybe if s.has(name) is True]
                found = sure if len(sure) == 1 else maybe if len(maybe) == 1 else None
                if found:
                    alias, source = found[0]
                    return source.node(name), alias if depth == 0 else None
                if maybe:  # several could hold it: the schemas decide
                    return self.unknowable(column, name), None
            return self.unknowable(column, name), None

        def resolve(column: exp.Column) -> Node | None:
            return locate(column)[0]

        subqueries: dict[int, Derived] = {}
        for sub in scope.subquery_scopes:
            subqueries[id(sub.expression)] = self.source_of_scope(
                sub, levels, False, branches, "in a subquery"
            )

        # Which equalities hold for every row that reaches the output (they merge
        # classes), and which only for the rows of one side (a link from that side's
        # class to the other's, followed one way): see Scopes._equate.
        where, having = select.args.get("where"), select.args.get("having")
        # A name in HAVING that a projection gives to an expression is Spark's alias for it
        # (when the FROM clause's column of that name is neither grouped nor aggregated).
        aliased = {
            p.alias.lower()
            for p in select.expressions
            if isinstance(p, exp.Alias)
            and not (isinstance(p.this, exp.Column) and p.this.name.lower() == p.alias.lower())
        }
        for clause in (where, having):
            if clause is None:
                continue
            for conjunct in conjuncts(clause.this):
                if clause is having and any(
                    not c.table and c.name.lower() in aliased for c in conjunct.find_all(exp.Column)
                ):
                    continue
                self._equate(conjunct, locate, subqueries, Always())
        merged: dict[str, str] = {}  # a USING column seen before -> the alias holding it
        for position, join in enumerate(joins):
            alias = join.this.alias_or_name.lower()
            earlier = set(order[: position + 1]) - {alias}
            rule = join_rule(join, alias, earlier)
            if join.args.get("on") is not None:
                seen = set(order[: position + 2])  # the tables up to this join, its own too

                def locate_on(column: exp.Column, seen: set[str] = seen) -> Located:
                    return locate(column, seen)

                for conjunct in conjuncts(join.args["on"]):
                    self._equate(conjunct, locate_on, subqueries, rule)
            for identifier in using_columns(join):
                name = identifier.name.lower()
                before = [(a, sources[a]) for a in order[: position + 1] if a in sources]
                maybe = [(a, s) for a, s in before if s.has(name) is not False and a != alias]
                if name in merged:  # the column an earlier USING merged
                    maybe = [(merged[name], sources[merged[name]])]
                if len(maybe) != 1:
                    self.unknowable(identifier, name)
                    continue
                other, source = maybe[0]
                rule.apply(self, (sources[alias].node(name), alias), (source.node(name), other))
                merged.setdefault(name, using.get(name) or other)

        fed = range(first_ref, len(self.refs))  # what this scope's rows come from
        for window in own(select, exp.Window):
            parts = cast("list[exp.Expr]", window.args.get("partition_by") or [])
            if not parts or not all(isinstance(p, exp.Column) for p in parts):
                raise Refusal(
                    window,
                    "uses a window that is not partitioned by columns: it computes a row "
                    "from other keys' rows",
                    "partition the window by the target key columns (PARTITION BY the keys), "
                    "or write the pipeline's incremental transform by hand with @pipeline.",
                )
            nodes = [n for n in (resolve(p) for p in parts if isinstance(p, exp.Column)) if n]
            if any(self.null_extended(n) for n in nodes):
                raise Refusal(
                    window,
                    "uses a window partitioned by a column of the optional side of an outer "
                    "join: its unmatched rows share the NULL partition, and no change names "
                    "the keys of the others",
                    "partition the window by a column of the preserved side (the keys), or "
                    "write the pipeline's incremental transform by hand with @pipeline.",
                )
            classes = {self.find(n) for n in nodes}
            related = {
                i: {c for c in self.refs[i].columns if self.find((i, c)) in classes} for i in fed
            }
            self.windows.append(Window(window, nodes, related, dict(self.parent)))

        outputs: dict[str, Node | None] = {}
        ordered: list[str] = []
        positions: list[Node | None] = []
        stars: list[Source] = []
        computed: dict[str, tuple[exp.Expr, Callable[[exp.Column], Node | None]]] = {}
        for projection in select.expressions:
            inner = projection.unalias()
            while isinstance(inner, exp.Paren):
                inner = inner.this
            if isinstance(inner, exp.Star):
                stars.extend(selectable.values())
                continue
            if isinstance(inner, exp.Column) and isinstance(inner.this, exp.Star):
                table = inner.table.lower()
                if table in selectable:
                    stars.append(selectable[table])
                else:
                    self.unknowable(inner, f"{table}.*")
                continue
            name = projection.alias_or_name.lower()
            ordered.append(name)
            node, holder = locate(inner) if isinstance(inner, exp.Column) else (None, None)
            positions.append(node)
            outputs.setdefault(name, node)
            if not isinstance(inner, exp.Column):
                computed.setdefault(name, (inner, resolve))
            elif node is None and isinstance(source := sources.get(holder or ""), Derived):
                # A derived table's computed column carried out unchanged: the key is
                # still computed from the column inside it.
                carried = source.computed.get(inner.name.lower())
                if carried is not None:
                    computed.setdefault(name, carried)
        return Derived(self, outputs, ordered, stars, positions, computed)

    def _equate(
        self,
        conjunct: exp.Expr,
        locate: Callable[[exp.Column], Located],
        subqueries: Mapping[int, Derived],
        rule: "Rule",
    ) -> None:
        """Record what one conjunct proves: ``a = b`` between two columns by ``rule``;
        ``a IN (SELECT b ...)`` as a link from the subquery's column to ``a`` (only the
        subquery rows that match hold it)."""
        if isinstance(conjunct, (exp.EQ, exp.NullSafeEQ)):
            left, right = bare(conjunct.this), bare(conjunct.expression)
            if isinstance(left, exp.Column) and isinstance(right, exp.Column):
                located = locate(left), locate(right)
                if isinstance(conjunct, exp.NullSafeEQ) and any(
                    node is not None and self.null_extended(node) for node, _ in located
                ):
                    # NULL <=> NULL is true: a row with NULL matches every unmatched row
                    # of the outer join, whatever keys they reach.
                    return
                rule.apply(self, *located)
            return
        if isinstance(conjunct, exp.In) and isinstance(rule, Always):
            query = conjunct.args.get("query")
            inner = query.this if isinstance(query, exp.Subquery) else query
            if inner is None or id(inner) not in subqueries:
                return
            derived = subqueries[id(inner)]
            lhs = bare(conjunct.this)
            columns = list(lhs.expressions) if isinstance(lhs, exp.Tuple) else [lhs]
            for position, column in enumerate(columns):
                column = bare(column)
                if isinstance(column, exp.Column):
                    self.link(derived.at(position), locate(column)[0])


def renamed_by_alias(derived: Derived, expression: exp.Expr) -> Derived:
    """``derived`` under the column names its alias gives (``WITH t (a, b) AS (...)``,
    ``(SELECT ...) AS t (a, b)``), by position."""
    holder = expression.parent
    alias = holder.args.get("alias") if isinstance(holder, (exp.CTE, exp.Subquery)) else None
    names = [c.name.lower() for c in alias.columns] if isinstance(alias, exp.TableAlias) else []
    return derived.renamed(names) if names else derived


def bare(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def using_columns(join: exp.Join) -> list[exp.Expr]:
    """The columns of a join's USING clause."""
    return cast("list[exp.Expr]", join.args.get("using") or [])


def conjuncts(condition: exp.Expr) -> Iterator[exp.Expr]:
    condition = bare(condition)
    if isinstance(condition, exp.And):
        yield from conjuncts(condition.this)
        yield from conjuncts(condition.expression)
    else:
        yield condition


def _generated_names(lateral: exp.Expr) -> list[str]:
    """The column names a generator's alias gives (``t AS tag`` / ``t(pos, tag)``)."""
    alias = lateral.args.get("alias")
    if not isinstance(alias, exp.TableAlias):
        return []
    return [c.name for c in cast("list[exp.Expr]", alias.columns)]


def own(select: exp.Select, kind: type[exp.Expr]) -> Iterator[exp.Expr]:
    """The ``kind`` nodes of ``select`` that are not in a nested query."""
    for node in select.walk(prune=lambda n: n is not select and isinstance(n, exp.Query)):
        if isinstance(node, kind):
            yield node


__all__ = ["Scopes"]
