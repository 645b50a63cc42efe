"""What a name in a query's FROM clause reads, and the columns it places: an upstream
reference, a derived table or ``WITH`` query, or a source whose columns lead nowhere.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sqlglot import exp

Branches = frozenset[tuple[int, int]]
"""(set operation, branch) pairs a reference lies in."""

Node = tuple[int, str]
"""A column of one reference: (reference id, column); negative ids are columns of no
upstream row (a set operation's output, an unresolved name)."""

Located = tuple[Node | None, str | None]
"""A column's node and the alias of the scope that holds it (None: an enclosing query's)."""


class Unknowables(Protocol):
    """What a source asks of the graph it belongs to: a node for a column no source could
    be told to hold without the schemas
    (:meth:`~watermark_dagster.config.key_inference._classes.Classes.unknowable`)."""

    def unknowable(self, where: exp.Expr, column: str) -> Node: ...


@dataclass
class Ref:
    id: int
    upstream: str
    alias: str
    table: exp.Expr
    nullable: bool
    branches: Branches
    within: str  # "" at the top, else where: "in a subquery", "in a derived table ..."
    columns: set[str] = field(default_factory=set[str])

    def compatible(self, other: "Ref") -> bool:
        """False when the two are in different branches of one set operation (their rows
        never meet)."""
        mine = dict(self.branches)
        return all(mine.get(union, branch) == branch for union, branch in other.branches)


class Source:
    """What a name in a FROM clause reads: an upstream reference, a derived table or
    ``WITH`` query, or something whose columns lead nowhere (a generator)."""

    def node(self, column: str) -> Node | None:
        raise NotImplementedError

    def has(self, column: str) -> bool | None:
        """Whether it has ``column``; None when unknown (no schema)."""
        raise NotImplementedError


class TableSource(Source):
    """An upstream reference. Without its schema, the columns its key paths name are known
    to be there; a column Spark finds in it is in no other table of the FROM clause (an
    unqualified name two tables hold is an error), so a known column places the name."""

    def __init__(self, ref: Ref, columns: Sequence[str] | None, known: set[str]) -> None:
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


class RenamedTable(Source):
    """An upstream reference whose alias renames its columns by position (``FROM t AS x
    (a, b)``): without the schema no name can be placed."""

    def __init__(
        self, graph: Unknowables, ref: Ref, names: list[str], schema: Sequence[str] | None
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


class Opaque(Source):
    def __init__(self, graph: Unknowables) -> None:
        self.graph = graph

    def node(self, column: str) -> Node | None:
        return None

    def has(self, column: str) -> bool | None:
        return None


class Generated(Opaque):
    """A generator's rows (``LATERAL VIEW explode(o.tags) t AS tag``): its columns lead
    nowhere, and the names its alias gives are its own. Spark refuses an unqualified name
    that it and a table both hold, so such a name is the generator's, known from the text
    alone (a key named so is refused when the definitions load, not by the batch)."""

    def __init__(self, graph: Unknowables, names: Sequence[str]) -> None:
        super().__init__(graph)
        self.names = {n.lower() for n in names}

    def has(self, column: str) -> bool | None:
        if column in self.names:
            return True
        return False if self.names else None  # no names given: Spark's own (col, pos ...)


class Derived(Source):
    def __init__(
        self,
        graph: Unknowables,
        outputs: dict[str, Node | None],
        ordered: list[str],
        stars: list[Source],
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

    def renamed(self, names: list[str]) -> "Derived":
        """The same columns under ``names``, by position (a column list on an alias)."""
        outputs = {n: self.at(i) for i, n in enumerate(names)}
        computed = {
            n: self.computed[self.ordered[i]]
            for i, n in enumerate(names)
            if i < len(self.ordered) and self.ordered[i] in self.computed and not self.stars
        }
        return Derived(self.graph, outputs, names, [], computed=computed)

    def at(self, position: int) -> Node | None:
        if position < len(self.positions) and not self.stars:
            return self.positions[position]
        # a star's columns, in an order unknown here
        return self.graph.unknowable(exp.Star(), f"#{position}")


__all__ = [
    "Branches",
    "Derived",
    "Generated",
    "Located",
    "Node",
    "Opaque",
    "Ref",
    "RenamedTable",
    "Source",
    "TableSource",
    "Unknowables",
]
