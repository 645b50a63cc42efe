"""Spark's analyzed plan as a tree, read from its text: what a Spark Connect client can
see of a plan it sent (the server's ``EXPLAIN EXTENDED``), for the checks that a local
session makes on the plan object itself (:mod:`~watermark_dagster.read.derive`).

The text is Catalyst's ``treeString``: one node a line, each line's depth given by its
prefix of three-character segments (``+- ``, ``:- ``, ``:  ``, three spaces). A node's
children follow it one level deeper; the plans of its subquery expressions (a scalar,
``IN``, ``EXISTS`` or lateral subquery) come first, two levels deeper. A subquery that
reads a column of the query around it shows it as ``outer(column#id)``.
"""

import re
from dataclasses import dataclass, field

ANALYZED = "== Analyzed Logical Plan =="
_NEXT_SECTION = "== Optimized Logical Plan =="
_SEGMENT = 3
# The marker before a node: "+- " or ":- " after any number of ":  " / "   " segments.
_LINE = re.compile(r"^(?P<prefix>(?:[: ] {2})*(?:[+:]- )?)(?P<text>\S.*)$")
# What a line shows when Spark left fields out (spark.sql.debug.maxToStringFields).
TRUNCATED = re.compile(r"\.\.\. \d+ more fields")


@dataclass
class PlanNode:
    """One operator: its name (``Aggregate``, ``Relation``, ``LogicalRDD`` ...), the rest of
    its line, its children, and the plans of its subquery expressions."""

    name: str
    text: str
    children: list["PlanNode"] = field(default_factory=list["PlanNode"])
    subqueries: list["PlanNode"] = field(default_factory=list["PlanNode"])

    def walk(self) -> "list[PlanNode]":
        """This node and every node under it, subquery plans included, depth first."""
        found: list[PlanNode] = [self]
        for node in (*self.subqueries, *self.children):
            found += node.walk()
        return found

    @property
    def correlated(self) -> bool:
        """True when this plan (a subquery's) reads a column of the query around it."""
        return any("outer(" in n.text for n in self.walk())

    @property
    def grouped(self) -> bool:
        """For an ``Aggregate``: True when it has grouping expressions. Its line shows two
        lists, ``[grouping], [aggregates]``, and only the second without grouping."""
        return _lists(self.text) > 1


def analyzed_tree(explained: str) -> PlanNode:
    """The analyzed plan of ``EXPLAIN EXTENDED``'s text (or of a bare tree string).

    Raises:
        ValueError: the text holds no plan this reader understands.
    """
    lines = explained.splitlines()
    if ANALYZED in explained:
        # The marker's line, then the output schema ("a: bigint, b: string", empty for
        # no columns), then the tree up to the next section.
        after = explained.split(ANALYZED, 1)[1].split(_NEXT_SECTION, 1)[0]
        lines = after.split("\n")[2:]
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise ValueError("no plan in the text")
    stack: list[tuple[int, PlanNode]] = []
    root: PlanNode | None = None
    for line in lines:
        match = _LINE.match(line)
        if match is None or len(match["prefix"]) % _SEGMENT:
            raise ValueError(f"not a plan line: {line!r}")
        depth = len(match["prefix"]) // _SEGMENT
        name, _, rest = match["text"].partition(" ")
        node = PlanNode(name, rest)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if not stack:
            if root is not None:
                raise ValueError(f"a second root: {line!r}")
            root = node
        elif stack[-1][0] == depth - 1:
            stack[-1][1].children.append(node)
        elif stack[-1][0] == depth - 2:
            stack[-1][1].subqueries.append(node)
        else:
            raise ValueError(f"a line deeper than its parent allows: {line!r}")
        stack.append((depth, node))
    assert root is not None
    return root


def _lists(text: str) -> int:
    """How many bracketed lists open the text, one after another (``[a], [b]`` is 2)."""
    count, position = 0, 0
    while position < len(text) and text[position] == "[":
        depth = 0
        for i in range(position, len(text)):
            depth += {"[": 1, "]": -1}.get(text[i], 0)
            if depth == 0:
                position = i + 1
                break
        else:
            return count + 1
        count += 1
        if text.startswith(", [", position):
            position += 2
        else:
            break
    return count
