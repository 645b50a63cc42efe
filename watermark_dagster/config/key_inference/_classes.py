"""What a query's equalities proved: classes of columns with equal values (a union-find),
one-way links between them, and each window with its classes as its own scope saw them.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from watermark_dagster.config.key_inference._sources import Node, Ref
from watermark_dagster.config.key_paths import KeyPath


@dataclass
class Window:
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


class Classes:
    """The references of a query and the equalities found between their columns (see
    :class:`~watermark_dagster.config.key_inference.inference.Graph`)."""

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
        self.refs: list[Ref] = []
        self.null_joints: set[Node] = set()
        # Each window: its node, its partition columns' nodes, and per reference feeding it
        # the columns equal to a partition column within the window's own scope (an
        # equality of an enclosing query holds for its output row, not for the others of
        # the partition).
        self.windows: list[Window] = []
        self.via: dict[int, int] = {}  # a reference with a hop path -> the one it hops into
        self.unknown: set[Node] = set()
        # The column names generators give (LATERAL VIEW explode(...) t AS tag).
        self.generated: set[str] = set()
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


__all__ = ["Classes", "Window"]
