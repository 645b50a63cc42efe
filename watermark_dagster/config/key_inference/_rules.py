"""How an equality between two columns is recorded, by the clause it is in: merged into
one class, linked one way, or ignored.
"""

from sqlglot import exp

from watermark_dagster.config.key_inference._classes import Classes
from watermark_dagster.config.key_inference._sources import Located


class Rule:
    """How an equality between two columns, each with the alias of the scope that holds
    it (None: a column of an enclosing query), is recorded."""

    def apply(
        self,
        graph: Classes,
        left: Located,
        right: Located,
    ) -> None:
        raise NotImplementedError


class Always(Rule):
    """``WHERE``, ``HAVING``, an inner join's ``ON``: every output row satisfies it. Two
    columns of the scope merge; a column of the scope and one of an enclosing query (a
    correlation) link the scope's to the enclosing one's: the enclosing query's rows
    reach the output whether or not a row of the subquery matches."""

    def apply(
        self,
        graph: Classes,
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


class OptionalSide(Rule):
    """An outer, semi- or anti-join's ``ON``: rows of the ``optional`` side reach the
    output only through a match (or, for an anti-join, by its absence), rows of the
    other side whatever it says. Two optional columns merge; an optional column links to
    the other side's; two columns of the other side prove nothing (the ``ON`` filters
    none of its rows)."""

    def __init__(self, optional: set[str]) -> None:
        self.optional = optional

    def apply(
        self,
        graph: Classes,
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


class Nothing(Rule):
    """A full outer join's ``ON``: each side's rows reach the output matched or not."""

    def apply(
        self,
        graph: Classes,
        left: Located,
        right: Located,
    ) -> None:
        return None


def join_rule(join: exp.Join, alias: str, earlier: set[str]) -> Rule:
    side, kind = (join.side or "").upper(), (join.kind or "").upper()
    if kind in ("SEMI", "ANTI") or side == "LEFT":
        return OptionalSide({alias})
    if side == "RIGHT":
        return OptionalSide(earlier)
    if side == "FULL":
        return Nothing()
    return Always()


__all__ = ["Always", "Nothing", "OptionalSide", "Rule", "join_rule"]
