"""A target key computed by an expression of one column (``DATE(o.created_at) AS day``):
the column it is a function of, and the expression's own text from the query, with the
column replaced, for a batch to compute the keys a change touches.
"""

from collections.abc import Callable
from typing import cast

import sqlglot
from sqlglot import TokenType, exp
from sqlglot.dialects.dialect import Dialect

from watermark_dagster.config.key_inference._classes import Classes
from watermark_dagster.config.key_inference._sources import Node
from watermark_dagster.config.key_inference.refusal import Refusal, projection_named
from watermark_dagster.config.key_paths import key_input

# Generators in a projection: a row gives several keys, or none.
_ROWS = (exp.Explode, exp.ExplodeOuter, exp.Inline, exp.Stack, exp.Unnest)


def computed_key(
    graph: Classes,
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
    where = projection_named(query, key.lower())
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


__all__ = ["computed_key"]
