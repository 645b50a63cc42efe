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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from sqlglot import exp
from sqlglot.optimizer.scope import build_scope

from watermark_dagster.config.key_inference._computed_keys import computed_key
from watermark_dagster.config.key_inference._paths import Paths
from watermark_dagster.config.key_inference._scopes import Scopes
from watermark_dagster.config.key_inference._sources import Node
from watermark_dagster.config.key_inference.refusal import PER_KEY_FIX, Refusal, projection_named
from watermark_dagster.config.key_paths import KeyPath


@dataclass(frozen=True)
class Inference:
    """What the query proves.

    ``paths``: per upstream (lower case), the key path of each of its references, each
    once. ``open``: a column could not be placed without the schemas (the verdict is the
    batch's); the paths are then incomplete and not to be used.
    """

    paths: Mapping[str, tuple[KeyPath, ...]]
    open: bool
    graph: "Graph | None" = None
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


class Graph(Scopes, Paths):
    """A query's references, the classes of equal columns its scopes prove, and the key
    paths through them."""


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
    graph = Graph(upstreams, schemas, known or {})
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
            node, expression = computed_key(
                graph, query, key, position, source, *top.computed[name]
            )
        if node in graph.unknown:
            return Inference({}, open=True, graph=graph)
        if node is None and name in graph.generated:
            raise Refusal(
                projection_named(query, name),
                f"takes the key column '{key}' from a generator's rows (LATERAL VIEW "
                "explode(...) and the like: one upstream row gives several keys, which "
                "its key path cannot follow)",
                f"key the target by the upstream's own columns (e.g. GROUP BY the row's key "
                f"and aggregate '{key}'), or write the pipeline's incremental transform by "
                "hand with @pipeline.",
            )
        if node is None:
            raise Refusal(
                projection_named(query, name),
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
                projection_named(query, name),
                f"takes the key column '{key}' from the optional side of an outer join "
                "(unmatched rows give it NULL, and the NULL key's row is made of rows whose "
                "own key is not NULL: no change names it)",
                f"take '{key}' from the preserved side of the join (for 'a LEFT JOIN b ON "
                f"a.{key} = b.{key}', a.{key}), or use an inner join.",
            )
        if graph.find(node) in {graph.find(n) for n in key_nodes}:
            raise Refusal(
                projection_named(query, name),
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
            fix = PER_KEY_FIX
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


__all__ = ["Graph", "Inference", "infer"]
