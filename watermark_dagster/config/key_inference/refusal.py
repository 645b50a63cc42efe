"""Why a declared query is not proven: :class:`Refusal`, the fix it suggests most, and the
part of the query it points at.
"""

from sqlglot import exp


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


PER_KEY_FIX = (
    "relate every upstream to the target keys with '=' between columns, in a JOIN's ON or a "
    "WHERE that is AND-ed (not inside OR, CASE or NOT), or write the pipeline's incremental "
    "transform by hand with @pipeline."
)


def projection_named(query: exp.Query, name: str) -> exp.Expr:
    """The projection of ``query`` named ``name`` (the query itself when none is): what
    a refusal about a key column points at."""
    select = query if isinstance(query, exp.Select) else query.find(exp.Select)
    if select is not None:
        for projection in select.expressions:
            if projection.alias_or_name.lower() == name:
                return projection
    return query


__all__ = ["PER_KEY_FIX", "Refusal", "projection_named"]
