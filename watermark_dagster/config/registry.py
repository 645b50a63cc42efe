"""The registry of one code location: its upstreams and pipelines, checked together.

Example:
    >>> orders = DeltaUpstream(name="orders", path="/lake/orders")
    >>> @pipeline(upstreams=["orders"], target="/lake/orders_clean", keys=["order_id"])
    ... def orders_clean(batch):
    ...     return batch["orders"].net_changes(["order_id"])
    >>> registry = Registry(upstreams=[orders], pipelines=[orders_clean])
"""

import os
from collections.abc import Iterable
from typing import Any

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.upstream import Upstream
from watermark_dagster.errors import ConfigurationError


def _location(path: str) -> str:
    """A table location in one spelling, so ``/a/b/``, ``/a//b`` and ``file:///a/b`` compare
    equal."""
    text = path.strip()
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "://" in text:
        return text.rstrip("/")
    return os.path.abspath(os.path.expanduser(text))


class Registry:
    """The upstreams and pipelines of one code location, checked for consistency."""

    def __init__(self, *, upstreams: Iterable[Upstream], pipelines: Iterable[Pipeline]) -> None:
        self.upstreams: dict[str, Upstream] = {}
        for u in upstreams:
            if u.name in self.upstreams:
                raise ConfigurationError(
                    f"Upstream '{u.name}' is declared twice.",
                    upstream=u.name,
                    fix="give each upstream one entry.",
                )
            self.upstreams[u.name] = u
        self.pipelines: dict[str, Pipeline] = {}
        for p in pipelines:
            if p.name in self.pipelines or p.name in self.upstreams:
                raise ConfigurationError(
                    f"Name '{p.name}' is used twice (pipelines and upstreams share one "
                    "namespace: they are all Dagster assets).",
                    pipeline=p.name,
                    fix="rename one of them.",
                )
            unknown = [u for u in p.upstreams if u not in self.upstreams]
            if unknown:
                raise ConfigurationError(
                    f"Pipeline '{p.name}' reads unknown upstream(s) {unknown}; declared "
                    f"upstreams are {sorted(self.upstreams)}.",
                    pipeline=p.name,
                    fix="declare the upstream or fix the name.",
                )
            self.pipelines[p.name] = p
        targets: dict[str, str] = {}
        for p in self.pipelines.values():
            if p.target in targets:
                raise ConfigurationError(
                    f"Pipelines '{targets[p.target]}' and '{p.name}' write the same target "
                    f"{p.target!r}.",
                    pipeline=p.name,
                    fix="give each pipeline its own target table.",
                )
            targets[p.target] = p.name
        self._refuse_cycles()

    def _refuse_cycles(self) -> None:
        """Refuse pipelines that read their own output: a target that is the path of an
        upstream feeding, directly or through other pipelines, the pipeline writing it.
        Every batch would then read what the previous one wrote, without end."""
        upstreams_at: dict[str, list[str]] = {}
        for u in self.upstreams.values():
            upstreams_at.setdefault(_location(u.path), []).append(u.name)
        # pipeline -> [(upstream its target is, a pipeline reading that upstream)]
        feeds = {
            p.name: [
                (u, q.name)
                for u in upstreams_at.get(_location(p.target), ())
                for q in self.pipelines.values()
                if u in q.upstreams
            ]
            for p in self.pipelines.values()
        }
        state: dict[str, bool] = {}  # False: on the current path; True: explored

        def visit(name: str, trail: list[tuple[str, str, str]]) -> None:
            state[name] = False
            for upstream, reader in feeds[name]:
                step = [*trail, (name, upstream, reader)]
                if state.get(reader) is False:
                    cycle = step[next(i for i, s in enumerate(step) if s[0] == reader) :]
                    chain = "; ".join(
                        f"'{p}' writes {self.pipelines[p].target!r} = upstream '{u}', read by '{r}'"
                        for p, u, r in cycle
                    )
                    raise ConfigurationError(
                        f"Pipeline '{reader}' reads its own output through a cycle: {chain}.",
                        pipeline=reader,
                        upstream=cycle[-1][1],
                        fix="give the target a path that no upstream of the cycle has, or "
                        "remove that upstream from the pipeline's upstreams.",
                    )
                if reader not in state:
                    visit(reader, step)
            state[name] = True

        for name in self.pipelines:
            if name not in state:
                visit(name, [])

    def pipeline_inputs(self) -> dict[str, tuple[str, ...]]:
        """Pipeline -> the upstreams it reads."""
        return {name: tuple(p.upstreams) for name, p in self.pipelines.items()}

    def consumers(self, upstream: str) -> tuple[str, ...]:
        """The pipelines that read ``upstream``, sorted: the one definition of its consumers
        (the finalizer advances an upstream once they all applied a batch; a manual change
        and a replay name them)."""
        return tuple(sorted(n for n, p in self.pipelines.items() if upstream in p.upstreams))

    def consumed_upstreams(self) -> list[Upstream]:
        """Upstreams read by at least one pipeline."""
        used = {u for p in self.pipelines.values() for u in p.upstreams}
        return [u for name, u in self.upstreams.items() if name in used]

    def describe(self) -> dict[str, Any]:
        """A plain summary, for logs and ``--json``."""
        return {
            "upstreams": {n: u.path for n, u in self.upstreams.items()},
            "pipelines": {n: list(p.upstreams) for n, p in self.pipelines.items()},
        }
