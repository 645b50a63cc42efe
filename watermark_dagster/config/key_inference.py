"""Key paths inferred from a declared query: what a batch must recompute, proven from the
query's own equalities rather than trusted from the declaration.

A batch recomputes the target keys its changes touched (:mod:`watermark_dagster.read.derive`):
every changed row's before- and after-image is followed along a key path to the keys it
reaches. That is exact when, for every row any upstream reference contributes to an
output row, the key path's equalities hold between that row and the output row's key.
This module finds such paths in the query itself:

* Every equality ``a.x = b.y`` (or ``<=>``) that is a top-level ``AND`` conjunct of a
  ``WHERE``, ``HAVING`` or ``JOIN ... ON`` holds for every combination of rows that
  contributes to the query's output, and so does ``a.x IN (SELECT b.y ...)`` as a
  conjunct, a ``USING`` column, a plain column carried out of a derived table, a ``WITH``
  query or a set operation's branch, and a ``GROUP BY`` column (every row of a group has
  its value). Those equalities put columns in classes of equal values.
* An equality inside ``OR``, ``CASE``, ``NOT`` or a function does not hold for every
  contributing row, and a comparison of expressions (``LOWER(a.x) = b.y``) relates no
  column: neither links anything.
* A reference holds the keys directly when it has a column in the class of every output
  key column; another reference reaches the keys through one that does, by the columns
  they share a class with, and so on (a breadth-first search from the keys). Each
  reference of an upstream (an upstream joined to itself has two) gets its own path.
* Each output key column must be a column of a reference that is never NULL-extended
  (not on the optional side of an outer join: the NULL group is fed by rows whose own
  key is not NULL), or a deterministic expression of one such column (``COALESCE(x, -1)
  AS x``, ``DATE(o.created_at) AS day`` grouped by it), in the outer query or in a derived
  table or ``WITH`` query that the outer query selects it from unchanged. Paths then end
  at that column and the batch computes the key from each value reached, as the query
  does: every row behind an output row has the column's value the key was computed from.
  An aggregate, window, subquery, generator or unknown function in the expression, or
  an expression of several columns, is refused.
* A window must be partitioned by the output keys' classes.

A reference no path reaches is refused: its rows change output rows whose keys no change
of it names. The search needs to know which reference an unqualified column belongs to;
without the upstreams' schemas (when the definitions load) a column that several
references could hold leaves the answer open, and the batch decides it before writing
(with the snapshots' schemas).
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import sqlglot
from sqlglot import TokenType, exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.optimizer.scope import Scope, build_scope

from watermark_dagster.config.key_paths import Hop, KeyPath, key_input

Branches = frozenset[tuple[int, int]]
"""(set operation, branch) pairs a reference lies in."""

Node = tuple[int, str]
"""A column of one reference: (reference id, column); negative ids are columns of no
upstream row (a set operation's output, an unresolved name)."""

Located = tuple[Node | None, str | None]
"""A column's node and the alias of the scope that holds it (None: an enclosing query's)."""


class Refusal(Exception):
    """The query is not proven: ``node`` is where (for its line), ``problem`` and ``fix``
    complete the caller's message."""

    def __init__(
        self, node: exp.Expr | None, problem: str, fix: str, upstream: str | None = None
    ) -> None:
        super().__init__(problem)
        self.node = node
        self.problem = problem
        self.fix = fix
        self.upstream = upstream


@dataclass(frozen=True)
class Inference:
    """What the query proves.

    ``paths``: per upstream (lower case), the key path of each of its references, each
    once. ``open``: a column could not be placed without the schemas (the verdict is the
    batch's); the paths are then incomplete and not to be used.
    """

    paths: Mapping[str, tuple[KeyPath, ...]]
    open: bool
    graph: "_Graph | None" = None
    # Per target key, the expression that computes it from its one column (see
    # KeyPath.computed); empty when every key is a plain column.
    computed: tuple[str | None, ...] = ()

    def keyed(self, path: KeyPath) -> KeyPath:
        """``path`` (declared: it names columns only) computing the keys as the query does."""
        return replace(path, computed=self.computed)

    def explains(self, path: KeyPath) -> bool:
        """True when ``path`` (declared) follows equalities of the query from one of its
        upstream's references to the keys."""
        if path.folded() in self.paths.get(path.upstream.lower(), ()):
            return True
        return self.graph is not None and self.graph.follows(path.folded())


@dataclass
class _Ref:
    id: int
    upstream: str
    alias: str
    table: exp.Expr
    nullable: bool
    branches: Branches
    within: str  # "" at the top, else where: "in a subquery", "in a derived table ..."
    columns: set[str] = field(default_factory=set[str])

    def compatible(self, other: "_Ref") -> bool:
        """False when the two are in different branches of one set operation (their rows
        never meet)."""
        mine = dict(self.branches)
        return all(mine.get(union, branch) == branch for union, branch in other.branches)


class _Source:
    """What a name in a FROM clause reads: an upstream reference, a derived table or
    ``WITH`` query, or something whose columns lead nowhere (a generator)."""

    def node(self, column: str) -> Node | None:
        raise NotImplementedError

    def has(self, column: str) -> bool | None:
        """Whether it has ``column``; None when unknown (no schema)."""
        raise NotImplementedError


class _TableSource(_Source):
    """An upstream reference. Without its schema, the columns its key paths name are known
    to be there; a column Spark finds in it is in no other table of the FROM clause (an
    unqualified name two tables hold is an error), so a known column places the name."""

    def __init__(self, ref: _Ref, columns: Sequence[str] | None, known: set[str]) -> None:
        self.ref = ref
        self.columns = None if columns is None else {c.lower() for c in columns}
        self.known = known

    def node(self, column: str) -> Node | None:
        self.ref.columns.add(column)
        return (self.ref.id, column)

    def has(self, column: str) -> bool | None:
        if self.columns is not None:
            return column in self.columns
        return True if column in self.known else None


class _RenamedTable(_Source):
    """An upstream reference whose alias renames its columns by position (``FROM t AS x
    (a, b)``): without the schema no name can be placed."""

    def __init__(
        self, graph: "_Graph", ref: _Ref, names: list[str], schema: Sequence[str] | None
    ) -> None:
        self.graph = graph
        self.ref = ref
        columns = [c.lower() for c in schema] if schema is not None else None
        self.mapping = None if columns is None else dict(zip(names, columns, strict=False))

    def node(self, column: str) -> Node | None:
        if self.mapping is None or column not in self.mapping:
            return self.graph.unknowable(exp.column(column), column)
        self.ref.columns.add(self.mapping[column])
        return (self.ref.id, self.mapping[column])

    def has(self, column: str) -> bool | None:
        return None if self.mapping is None else column in self.mapping


class _Opaque(_Source):
    def __init__(self, graph: "_Graph") -> None:
        self.graph = graph

    def node(self, column: str) -> Node | None:
        return None

    def has(self, column: str) -> bool | None:
        return None


class _Derived(_Source):
    def __init__(
        self,
        graph: "_Graph",
        outputs: dict[str, Node | None],
        ordered: list[str],
        stars: list[_Source],
        positions: list[Node | None] | None = None,
        computed: "dict[str, tuple[exp.Expr, Callable[[exp.Column], Node | None]]] | None" = None,
    ) -> None:
        self.graph = graph
        self.outputs = outputs
        self.ordered = ordered
        self.stars = stars
        # The output columns computed by an expression, each with the function that
        # places a column of it (for a target key computed from one column).
        self.computed = computed or {}
        # Each output column by position (a name may repeat: SELECT b.k, c.k).
        self.positions = positions if positions is not None else [outputs[n] for n in ordered]
        self.repeated = {n for n in ordered if ordered.count(n) > 1}

    def node(self, column: str) -> Node | None:
        if column in self.repeated:  # Spark: an ambiguous reference
            return self.graph.unknowable(exp.column(column), column)
        if column in self.outputs:
            return self.outputs[column]
        found = [s for s in self.stars if s.has(column) is not False]
        sure = [s for s in found if s.has(column) is True]
        if len(sure) == 1 or len(found) == 1:
            return (sure or found)[0].node(column)
        return self.graph.unknowable(exp.column(column), column)

    def has(self, column: str) -> bool | None:
        if column in self.outputs:
            return True
        answers = [s.has(column) for s in self.stars]
        if any(a is True for a in answers):
            return True
        return None if any(a is None for a in answers) else False

    def renamed(self, names: list[str]) -> "_Derived":
        """The same columns under ``names``, by position (a column list on an alias)."""
        outputs = {n: self.at(i) for i, n in enumerate(names)}
        computed = {
            n: self.computed[self.ordered[i]]
            for i, n in enumerate(names)
            if i < len(self.ordered) and self.ordered[i] in self.computed and not self.stars
        }
        return _Derived(self.graph, outputs, names, [], computed=computed)

    def at(self, position: int) -> Node | None:
        if position < len(self.positions) and not self.stars:
            return self.positions[position]
        # a star's columns, in an order unknown here
        return self.graph.unknowable(exp.Star(), f"#{position}")


@dataclass
class _Window:
    """A window as its own scope relates it: ``related`` gives, per reference feeding it,
    the columns equal to a partition column there, and ``parent`` is the union-find of
    classes as it stood there (before any enclosing query's equality)."""

    node: exp.Expr
    nodes: list[Node]
    related: dict[int, set[str]]
    parent: dict[Node, Node]

    def _find(self, node: Node) -> Node:
        while node in self.parent:
            node = self.parent[node]
        return node

    def partitions(self, ref: int, solved: Mapping[int, KeyPath], via: Mapping[int, int]) -> bool:
        """True when ``ref``'s path reaches the keys through the window's partition within
        the window's scope: each hop into a reference feeding the window, on columns equal
        there, ending at one that holds the keys in its partition columns."""
        seen: set[int] = set()
        while ref not in seen:
            seen.add(ref)
            path = solved[ref]
            if path.direct:
                return set(path.start) <= self.related.get(ref, set())
            into = via.get(ref)
            if into is None or into not in self.related:
                return False
            pairs = zip(path.start, path.hops[0].match, strict=True)
            if any(self._find((ref, a)) != self._find((into, b)) for a, b in pairs):
                return False
            ref = into
        return False


class _Rule:
    """How an equality between two columns, each with the alias of the scope that holds
    it (None: a column of an enclosing query), is recorded."""

    def apply(
        self,
        graph: "_Graph",
        left: Located,
        right: Located,
    ) -> None:
        raise NotImplementedError


class _Always(_Rule):
    """``WHERE``, ``HAVING``, an inner join's ``ON``: every output row satisfies it. Two
    columns of the scope merge; a column of the scope and one of an enclosing query (a
    correlation) link the scope's to the enclosing one's: the enclosing query's rows
    reach the output whether or not a row of the subquery matches."""

    def apply(
        self,
        graph: "_Graph",
        left: Located,
        right: Located,
    ) -> None:
        (left_node, left_alias), (right_node, right_alias) = left, right
        if left_alias is not None and right_alias is not None:
            graph.union(left_node, right_node)
        elif left_alias is not None:
            graph.link(left_node, right_node)
        elif right_alias is not None:
            graph.link(right_node, left_node)


class _Optional(_Rule):
    """An outer, semi- or anti-join's ``ON``: rows of the ``optional`` side reach the
    output only through a match (or, for an anti-join, by its absence), rows of the
    other side whatever it says. Two optional columns merge; an optional column links to
    the other side's; two columns of the other side prove nothing (the ``ON`` filters
    none of its rows)."""

    def __init__(self, optional: set[str]) -> None:
        self.optional = optional

    def apply(
        self,
        graph: "_Graph",
        left: Located,
        right: Located,
    ) -> None:
        (left_node, left_alias), (right_node, right_alias) = left, right
        left_optional, right_optional = left_alias in self.optional, right_alias in self.optional
        if left_optional and right_optional:
            graph.union(left_node, right_node)
        elif left_optional:
            graph.link(left_node, right_node)
        elif right_optional:
            graph.link(right_node, left_node)


class _Nothing(_Rule):
    """A full outer join's ``ON``: each side's rows reach the output matched or not."""

    def apply(
        self,
        graph: "_Graph",
        left: Located,
        right: Located,
    ) -> None:
        return None


def _join_rule(join: exp.Join, alias: str, earlier: set[str]) -> _Rule:
    side, kind = (join.side or "").upper(), (join.kind or "").upper()
    if kind in ("SEMI", "ANTI") or side == "LEFT":
        return _Optional({alias})
    if side == "RIGHT":
        return _Optional(earlier)
    if side == "FULL":
        return _Nothing()
    return _Always()


_PER_KEY_FIX = (
    "relate every upstream to the target keys with '=' between columns, in a JOIN's ON or a "
    "WHERE that is AND-ed (not inside OR, CASE or NOT), or write the pipeline's incremental "
    "transform by hand with @pipeline."
)


class _Graph:
    def __init__(
        self,
        upstreams: Sequence[str],
        schemas: Mapping[str, Sequence[str]] | None,
        known: Mapping[str, set[str]],
    ):
        self.upstreams = {u.lower() for u in upstreams}
        self.known = {u.lower(): {c.lower() for c in cs} for u, cs in known.items()}
        self.schemas = {u.lower(): cs for u, cs in (schemas or {}).items()}
        self.parent: dict[Node, Node] = {}
        self.refs: list[_Ref] = []
        self.null_joints: set[Node] = set()
        # Each window: its node, its partition columns' nodes, and per reference feeding it
        # the columns equal to a partition column within the window's own scope (an
        # equality of an enclosing query holds for its output row, not for the others of
        # the partition).
        self.windows: list[_Window] = []
        self.via: dict[int, int] = {}  # a reference with a hop path -> the one it hops into
        self.unknown: set[Node] = set()
        self.links: list[tuple[Node, Node]] = []
        self._link_classes: dict[Node, set[Node]] | None = None
        self.unresolved: list[exp.Expr] = []
        self.open = False
        self._fresh = 0

    # ---------------------------------------------------------------- classes

    def find(self, node: Node) -> Node:
        root = node
        while root in self.parent:
            root = self.parent[root]
        while node != root:
            following = self.parent[node]
            self.parent[node] = root
            node = following
        return root

    def union(self, a: Node | None, b: Node | None) -> None:
        if a is None or b is None:
            return
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb

    def joint(self, column: str) -> Node:
        self._fresh -= 1
        return (self._fresh, column)

    def unknowable(self, where: exp.Expr, column: str) -> Node:
        """A node for a column no source could be told to hold without the schemas."""
        self.open = True
        self.unresolved.append(where)
        node = self.joint(column)
        self.unknown.add(node)
        return node

    def null_extended(self, node: Node) -> bool:
        if node[0] >= 0:
            return self.refs[node[0]].nullable
        return node in self.null_joints

    # ---------------------------------------------------------------- scopes

    def source_of_scope(
        self,
        scope: Scope,
        env: list[dict[str, _Source]],
        nullable: bool,
        branches: Branches,
        within: str = "",
    ) -> _Derived:
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
            return _renamed(_Derived(self, outputs, names, [], positions), expression)
        if not isinstance(expression, exp.Select):
            raise Refusal(
                expression, f"uses {expression.key.upper()}, which is not analysed", _PER_KEY_FIX
            )
        derived = self._select(scope, expression, env, nullable, branches, within)
        return _renamed(derived, expression)

    def _select(
        self,
        scope: Scope,
        select: exp.Select,
        env: list[dict[str, _Source]],
        nullable: bool,
        branches: Branches,
        within: str,
    ) -> _Derived:
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
            for identifier in _identifiers(join):
                name = identifier.name.lower()
                if side == "FULL":
                    using[name] = ""  # COALESCE of both sides
                elif side == "RIGHT":
                    using[name] = alias
                else:
                    using.setdefault(name, order[0] if order else alias)
            order.append(alias)
        sources: dict[str, _Source] = {}
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
                sources[name] = _Opaque(self)
                continue
            extended = nullable or name in optional
            if isinstance(source, exp.Table):
                upstream = source.name.lower()
                if upstream in self.upstreams:
                    ref = _Ref(len(self.refs), upstream, name, source, extended, branches, within)
                    self.refs.append(ref)
                    schema = self.schemas.get(upstream)
                    alias = source.args.get("alias")
                    renamed = alias.columns if isinstance(alias, exp.TableAlias) else []
                    if renamed:  # FROM t AS x (a, b): the table's columns by position
                        sources[name] = _RenamedTable(
                            self, ref, [c.name.lower() for c in renamed], schema
                        )
                    else:
                        sources[name] = _TableSource(ref, schema, self.known.get(upstream, set()))
                else:
                    sources[name] = _Opaque(self)
            elif source.is_udtf:  # LATERAL VIEW explode(...): row-local values
                sources[name] = _Opaque(self)
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

        subqueries: dict[int, _Derived] = {}
        for sub in scope.subquery_scopes:
            subqueries[id(sub.expression)] = self.source_of_scope(
                sub, levels, False, branches, "in a subquery"
            )

        # Which equalities hold for every row that reaches the output (they merge
        # classes), and which only for the rows of one side (a link from that side's
        # class to the other's, followed one way): see _Graph.equate.
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
            for conjunct in _conjuncts(clause.this):
                if clause is having and any(
                    not c.table and c.name.lower() in aliased for c in conjunct.find_all(exp.Column)
                ):
                    continue
                self._equate(conjunct, locate, subqueries, _Always())
        merged: dict[str, str] = {}  # a USING column seen before -> the alias holding it
        for position, join in enumerate(joins):
            alias = join.this.alias_or_name.lower()
            earlier = set(order[: position + 1]) - {alias}
            rule = _join_rule(join, alias, earlier)
            if join.args.get("on") is not None:
                seen = set(order[: position + 2])  # the tables up to this join, its own too

                def locate_on(column: exp.Column, seen: set[str] = seen) -> Located:
                    return locate(column, seen)

                for conjunct in _conjuncts(join.args["on"]):
                    self._equate(conjunct, locate_on, subqueries, rule)
            for identifier in _identifiers(join):
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
        for window in _own(select, exp.Window):
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
            self.windows.append(_Window(window, nodes, related, dict(self.parent)))

        outputs: dict[str, Node | None] = {}
        ordered: list[str] = []
        positions: list[Node | None] = []
        stars: list[_Source] = []
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
            elif node is None and isinstance(source := sources.get(holder or ""), _Derived):
                # A derived table's computed column carried out unchanged: the key is
                # still computed from the column inside it.
                carried = source.computed.get(inner.name.lower())
                if carried is not None:
                    computed.setdefault(name, carried)
        return _Derived(self, outputs, ordered, stars, positions, computed)

    def _equate(
        self,
        conjunct: exp.Expr,
        locate: Callable[[exp.Column], Located],
        subqueries: Mapping[int, _Derived],
        rule: "_Rule",
    ) -> None:
        """Record what one conjunct proves: ``a = b`` between two columns by ``rule``;
        ``a IN (SELECT b ...)`` as a link from the subquery's column to ``a`` (only the
        subquery rows that match hold it)."""
        if isinstance(conjunct, (exp.EQ, exp.NullSafeEQ)):
            left, right = _bare(conjunct.this), _bare(conjunct.expression)
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
        if isinstance(conjunct, exp.In) and isinstance(rule, _Always):
            query = conjunct.args.get("query")
            inner = query.this if isinstance(query, exp.Subquery) else query
            if inner is None or id(inner) not in subqueries:
                return
            derived = subqueries[id(inner)]
            lhs = _bare(conjunct.this)
            columns = list(lhs.expressions) if isinstance(lhs, exp.Tuple) else [lhs]
            for position, column in enumerate(columns):
                column = _bare(column)
                if isinstance(column, exp.Column):
                    self.link(derived.at(position), locate(column)[0])

    def link(self, inner: Node | None, outer: Node | None) -> None:
        """``inner`` equals ``outer`` for every row of ``inner``'s side that reaches the
        output, not for every row of ``outer``'s: a path may go from inner to outer."""
        if inner is not None and outer is not None:
            self.links.append((inner, outer))

    def reach(self, node: Node) -> set[Node]:
        """The classes ``node``'s class equals or links to, through any number of links."""
        if self._link_classes is None:
            self._link_classes = {}
            for inner, outer in self.links:
                self._link_classes.setdefault(self.find(inner), set()).add(self.find(outer))
        start = self.find(node)
        seen, stack = {start}, [start]
        while stack:
            for following in self._link_classes.get(stack.pop(), set()):
                if following not in seen:
                    seen.add(following)
                    stack.append(following)
        return seen

    # ---------------------------------------------------------------- paths

    def follows(self, path: KeyPath) -> bool:
        """True when ``path``'s equalities are the query's, from some reference of its
        upstream to the keys (a declared path the search did not pick)."""
        targets = [self.find(k) for k in self._key_nodes]

        def walk(hops: tuple[Hop, ...], columns: list[Node]) -> bool:
            reached = [self.reach(c) for c in columns]
            if not hops:
                return len(columns) == len(targets) and all(
                    t in r for t, r in zip(targets, reached, strict=True)
                )
            hop = hops[0]
            if len(hop.match) != len(columns):
                return False
            for other in self.refs:
                if other.upstream != hop.upstream:
                    continue
                matched = zip(hop.match, reached, strict=True)
                if all(self.find((other.id, m)) in r for m, r in matched) and walk(
                    hops[1:], [(other.id, c) for c in hop.carry]
                ):
                    return True
            return False

        return any(
            walk(path.hops, [(ref.id, c) for c in path.start])
            for ref in self.refs
            if ref.upstream == path.upstream
        )

    _key_nodes: tuple[Node, ...] = ()

    def paths(self, keys: Sequence[str], key_nodes: Sequence[Node]) -> dict[int, KeyPath]:
        """A key path per reference, breadth first from the references holding the keys."""
        self._key_nodes = tuple(key_nodes)
        classes = [self.find(n) for n in key_nodes]

        # A reference feeding a window starts from its partition columns where it can.
        partitioned: dict[int, set[str]] = {}
        for window in self.windows:
            for i, columns in window.related.items():
                partitioned.setdefault(i, set()).update(columns)

        def columns_reaching(ref: _Ref, target: Node, prefer: str) -> list[str]:
            found = sorted(c for c in ref.columns if target in self.reach((ref.id, c)))
            windowed = partitioned.get(ref.id, set())
            return sorted(found, key=lambda c: (c not in windowed, c != prefer))

        solved: dict[int, KeyPath] = {}
        queue: list[_Ref] = []
        for ref in self.refs:
            held = [columns_reaching(ref, c, k) for c, k in zip(classes, keys, strict=True)]
            if all(held):
                solved[ref.id] = KeyPath(ref.upstream, tuple(h[0] for h in held))
                queue.append(ref)
        while queue:
            near = queue.pop(0)
            near_path = solved[near.id]
            by_class: dict[Node, str] = {}
            for column in sorted(near.columns):
                by_class.setdefault(self.find((near.id, column)), column)
            for ref in self.refs:
                if ref.id in solved or not ref.compatible(near):
                    continue
                pairs: list[tuple[str, str]] = []
                for column in sorted(ref.columns):
                    for reached in sorted(self.reach((ref.id, column))):
                        target = by_class.get(reached)
                        if target is not None and target not in [t for _, t in pairs]:
                            pairs.append((column, target))
                if not pairs:
                    continue
                hop = Hop(near.upstream, tuple(t for _, t in pairs), near_path.start)
                self.via[ref.id] = near.id
                solved[ref.id] = KeyPath(
                    ref.upstream, tuple(c for c, _ in pairs), (hop, *near_path.hops)
                )
                queue.append(ref)
        return solved


def _renamed(derived: _Derived, expression: exp.Expr) -> _Derived:
    """``derived`` under the column names its alias gives (``WITH t (a, b) AS (...)``,
    ``(SELECT ...) AS t (a, b)``), by position."""
    holder = expression.parent
    alias = holder.args.get("alias") if isinstance(holder, (exp.CTE, exp.Subquery)) else None
    names = [c.name.lower() for c in alias.columns] if isinstance(alias, exp.TableAlias) else []
    return derived.renamed(names) if names else derived


def _bare(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _identifiers(join: exp.Join) -> list[exp.Expr]:
    """The columns of a join's USING clause."""
    return cast("list[exp.Expr]", join.args.get("using") or [])


def _conjuncts(condition: exp.Expr) -> Iterator[exp.Expr]:
    condition = _bare(condition)
    if isinstance(condition, exp.And):
        yield from _conjuncts(condition.this)
        yield from _conjuncts(condition.expression)
    else:
        yield condition


def _own(select: exp.Select, kind: type[exp.Expr]) -> Iterator[exp.Expr]:
    """The ``kind`` nodes of ``select`` that are not in a nested query."""
    for node in select.walk(prune=lambda n: n is not select and isinstance(n, exp.Query)):
        if isinstance(node, kind):
            yield node


def infer(
    query: exp.Query,
    *,
    upstreams: Sequence[str],
    keys: Sequence[str],
    schemas: Mapping[str, Sequence[str]] | None = None,
    known: Mapping[str, set[str]] | None = None,
    source: str | None = None,
) -> Inference:
    """The key path of every upstream reference of ``query`` (see the module docstring);
    ``source`` is the text ``query`` was parsed from (a key computed by an expression is
    refused without it).

    Raises:
        Refusal: a key is computed or NULL-extended, a window is not per key, or a
            reference reaches no key.
    """
    graph = _Graph(upstreams, schemas, known or {})
    root = build_scope(query)
    assert root is not None  # a query always has a scope
    top = graph.source_of_scope(root, [], False, frozenset())
    key_nodes: list[Node] = []
    computed: list[str | None] = []
    for position, key in enumerate(keys):
        name = key.lower()
        if name not in top.outputs and top.has(name) is False:
            raise Refusal(
                query,
                f"has no output column '{key}' (a target key)",
                f"select the target key columns {list(keys)}.",
            )
        node = top.node(name)
        expression: str | None = None
        if node is None and name in top.computed and name not in top.repeated:
            node, expression = _key_input(graph, query, key, position, source, *top.computed[name])
        if node in graph.unknown:
            return Inference({}, open=True, graph=graph)
        if node is None:
            raise Refusal(
                _projection(query, name),
                f"computes the key column '{key}' in a derived table, a WITH query or a set "
                "operation's branches (an expression or aggregate there: its values are not "
                "a function of the values a changed row carries, which name the keys a batch "
                "recomputes)",
                f"compute '{key}' in the outer query, as a deterministic expression of one "
                f"upstream column (e.g. DATE(o.created_at) AS {key}, grouped by it), or "
                "select it as a plain column.",
            )
        if graph.null_extended(node):
            raise Refusal(
                _projection(query, name),
                f"takes the key column '{key}' from the optional side of an outer join "
                "(unmatched rows give it NULL, and the NULL key's row is made of rows whose "
                "own key is not NULL: no change names it)",
                f"take '{key}' from the preserved side of the join (for 'a LEFT JOIN b ON "
                f"a.{key} = b.{key}', a.{key}), or use an inner join.",
            )
        if graph.find(node) in {graph.find(n) for n in key_nodes}:
            raise Refusal(
                _projection(query, name),
                f"gives the key column '{key}' the same column as another key",
                "key the target by distinct columns (drop the repeated one from keys).",
            )
        key_nodes.append(node)
        computed.append(expression)
    if graph.open:
        return Inference({}, open=True, graph=graph)
    keyed = tuple(computed) if any(computed) else ()
    solved = {i: replace(path, computed=keyed) for i, path in graph.paths(keys, key_nodes).items()}
    classes = {graph.find(n) for n in key_nodes}
    for window in graph.windows:
        reached = set[Node]().union(*(graph.reach(n) for n in window.nodes))
        # Every reference feeding the window must reach the keys through its partition as
        # the window's own scope relates them: an equality applied after the window holds
        # for the output row, not for the rest of its partition.
        unpartitioned = [
            graph.refs[i]
            for i in window.related
            if i in solved and not window.partitions(i, solved, graph.via)
        ]
        if not classes <= reached or unpartitioned:
            raise Refusal(
                window.node,
                "uses a window not partitioned by the target keys: it computes a row from "
                "other keys' rows",
                f"partition the window by the target key columns {list(keys)}, or write "
                "the pipeline's incremental transform by hand with @pipeline.",
                upstream=unpartitioned[0].upstream if unpartitioned else None,
            )
    for ref in graph.refs:
        if ref.id not in solved:
            where = f"'{ref.alias}'" + (f", {ref.within}" if ref.within else "")
            fix = _PER_KEY_FIX
            if ref.within == "in a subquery":
                fix = (
                    f"correlate the subquery on a column that leads to the target keys "
                    f"(e.g. WHERE {ref.alias}.{keys[0]} = outer.{keys[0]}), AND-ed with its "
                    "other conditions; or write the pipeline's incremental transform by hand "
                    "with @pipeline."
                )
            raise Refusal(
                ref.table,
                f"reads upstream '{ref.upstream}' (as {where}) with no equality between "
                "columns that leads from its rows to the target keys (an aggregate over "
                "all its rows, a filter or join on other columns, an '=' inside OR, CASE "
                "or NOT): a change to it does not name the keys whose rows it changes",
                fix,
                upstream=ref.upstream,
            )
    paths: dict[str, list[KeyPath]] = {}
    for ref in graph.refs:
        found = paths.setdefault(ref.upstream, [])
        if solved[ref.id] not in found:
            found.append(solved[ref.id])
    return Inference(
        {u: tuple(ps) for u, ps in paths.items()},
        open=False,
        graph=graph,
        computed=keyed,
    )


# Generators in a projection: a row gives several keys, or none.
_ROWS = (exp.Explode, exp.ExplodeOuter, exp.Inline, exp.Stack, exp.Unnest)


def _key_input(
    graph: _Graph,
    query: exp.Query,
    key: str,
    position: int,
    source: str | None,
    expression: exp.Expr,
    resolve: Callable[[exp.Column], Node | None],
) -> tuple[Node | None, str]:
    """The column a key computed by ``expression`` is a function of, and the expression
    as Spark SQL over :func:`~watermark_dagster.config.key_paths.key_input` in its place.

    Every row behind an output row has the key's column equal to the one the output row's
    key was computed from (or the row is grouped by the expression), so the expression of
    a changed row's value is the key it touches: exact when the expression reads one
    column (or columns the query holds equal) and nothing else that varies.

    Raises:
        Refusal: the expression aggregates, reads a window or a subquery, reads no column,
            or reads columns that are not equal.
    """
    where = _projection(query, key.lower())
    fix = (
        f"compute '{key}' as a deterministic expression of one upstream column (e.g. "
        f"DATE(o.created_at) AS {key}, grouped by it), or select the column itself."
    )
    found = expression.find(exp.AggFunc, exp.Window, exp.Query, exp.Subquery, exp.Lambda, *_ROWS)
    if found is None:
        found = expression.find(exp.Anonymous)
    if found is not None:
        if isinstance(found, exp.Anonymous):
            why = (
                f"with {found.name}, a function this analysis does not know (it may be "
                "non-deterministic or make several rows)"
            )
        elif isinstance(found, _ROWS):
            why = f"with {found.sql(dialect='spark').split('(')[0]}, which makes several rows"
        else:
            kind = (
                "a window"
                if isinstance(found, exp.Window)
                else "a lambda"
                if isinstance(found, exp.Lambda)
                else "an aggregate"
                if isinstance(found, exp.AggFunc)
                else "a subquery"
            )
            why = (
                f"with {kind}: its values are not a function of the values a changed row "
                "carries, which name the keys a batch recomputes"
            )
        raise Refusal(where, f"computes the key column '{key}' {why}", fix)
    columns = list(expression.find_all(exp.Column))
    nodes = [resolve(c) for c in columns]
    unknown = next((n for n in nodes if n in graph.unknown), None)
    if unknown is not None:
        return unknown, ""
    if not columns or None in nodes:
        raise Refusal(
            where,
            f"computes the key column '{key}' from "
            + ("no column" if not columns else "a column that is itself computed")
            + " (a change names the keys it touches by the values of the key's column)",
            fix,
        )
    if len({graph.find(cast("Node", n)) for n in nodes}) > 1:
        raise Refusal(
            where,
            f"computes the key column '{key}' from several columns: a batch follows one "
            "column per key from a changed row to the keys",
            f"key the target by each of the columns, or {fix}",
        )
    placeholder = key_input(position)

    def put(node: exp.Expr) -> exp.Expr:
        return exp.column(placeholder, quoted=True) if isinstance(node, exp.Column) else node

    # The batch evaluates the key's expression as the query wrote it: sqlglot writing it
    # back may change what Spark computes (TO_CHAR as a CAST, LOG10 as LOG, a format's
    # quoted letters), so the template is the query's own text with the column replaced,
    # and sqlglot only checks that the text taken is that expression.
    template = _own_text(source, expression, placeholder) if source else None
    try:
        taken = sqlglot.parse_one(template, read="spark") if template else None
        while isinstance(taken, exp.Paren):
            taken = taken.this
        same = taken is not None and taken.sql(dialect="spark") == expression.copy().transform(
            put
        ).sql(dialect="spark")
    except Exception:  # sqlglot cannot read or write it back: not proven
        same = False
    if template is None or not same:
        raise Refusal(
            where,
            f"computes the key column '{key}' with an expression whose text this analysis "
            "cannot take from the query to apply to a changed row's value",
            fix,
        )
    return nodes[0], template


_OPENING = {TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE}
_CLOSING = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE}
# What ends a SELECT list.
_AFTER_LIST = {
    TokenType.FROM,
    TokenType.WHERE,
    TokenType.GROUP_BY,
    TokenType.HAVING,
    TokenType.ORDER_BY,
    TokenType.LIMIT,
    TokenType.UNION,
    TokenType.EXCEPT,
    TokenType.INTERSECT,
    TokenType.SEMICOLON,
}


def _own_text(source: str, expression: exp.Expr, placeholder: str) -> str | None:
    """The text of ``expression`` (a projection of its SELECT, or the expression an alias
    names) as ``source`` spells it, each column reference replaced by ``placeholder``
    (quoted); None when its place in ``source`` cannot be told from the parse.

    The SELECT is found from a column's place in the text (the nearest SELECT before it
    that encloses it), its list split at the commas outside parentheses, and the item at
    the projection's position taken, without its alias."""
    projection: exp.Expr = expression
    while projection.parent is not None and not isinstance(projection.parent, exp.Select):
        projection = projection.parent
    select = projection.parent
    if not isinstance(select, exp.Select) or projection.arg_key != "expressions":
        return None
    position = next((i for i, p in enumerate(select.expressions) if p is projection), None)
    columns = list(expression.find_all(exp.Column))
    places = [
        [(p.meta.get("start"), p.meta.get("end")) for p in c.parts if isinstance(p, exp.Identifier)]
        for c in columns
    ]
    if (
        position is None
        or not columns
        or any(not ps or any(a is None or b is None for a, b in ps) for ps in places)
    ):
        return None
    spans = [
        (min(cast("int", a) for a, _ in ps), max(cast("int", b) for _, b in ps) + 1)
        for ps in places
    ]
    tokens = Dialect.get_or_raise("spark").tokenize(source)
    anchor = next((i for i, t in enumerate(tokens) if t.start == spans[0][0]), None)
    if anchor is None:
        return None
    depth, opened = 0, None
    for i in range(anchor - 1, -1, -1):  # back to this SELECT
        kind = tokens[i].token_type
        if kind in _CLOSING:
            depth += 1
        elif kind in _OPENING and depth:
            depth -= 1
        elif kind is TokenType.SELECT and not depth:
            opened = i
            break
    if opened is None:
        return None
    items: list[tuple[int, int]] = []  # token ranges of the list's items, end exclusive
    first, depth = opened + 1, 0
    while first < len(tokens) and tokens[first].token_type in (TokenType.DISTINCT, TokenType.ALL):
        first += 1
    for i in range(first, len(tokens) + 1):
        kind = tokens[i].token_type if i < len(tokens) else TokenType.SEMICOLON
        if kind in _OPENING:
            depth += 1
        elif kind in _CLOSING and depth:
            depth -= 1
        elif depth == 0 and (kind is TokenType.COMMA or kind in _AFTER_LIST or kind in _CLOSING):
            items.append((first, i))
            first = i + 1
            if kind is not TokenType.COMMA:
                break
    if len(items) != len(select.expressions):
        return None
    low_token, high_token = items[position]
    if isinstance(projection, exp.Alias):
        name = projection.args.get("alias")
        start = name.meta.get("start") if isinstance(name, exp.Identifier) else None
        at = next((i for i in range(low_token, high_token) if tokens[i].start == start), None)
        if at is None:
            return None
        high_token = at - 1 if tokens[at - 1].token_type is TokenType.ALIAS else at
    if high_token <= low_token:
        return None
    low, high = tokens[low_token].start, tokens[high_token - 1].end + 1
    if any(not low <= begin < end <= high for begin, end in spans):
        return None
    text = source[low:high]
    quoted = f"`{placeholder}`"
    for begin, end in sorted(spans, reverse=True):
        text = text[: begin - low] + quoted + text[end - low :]
    return text


def _projection(query: exp.Query, name: str) -> exp.Expr:
    select = query if isinstance(query, exp.Select) else query.find(exp.Select)
    if select is not None:
        for projection in select.expressions:
            if projection.alias_or_name.lower() == name:
                return projection
    return query
