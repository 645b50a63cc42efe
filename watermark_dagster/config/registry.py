"""The registry of one code location: its upstreams and pipelines, checked together.

Example:
    >>> orders = DeltaUpstream(name="orders", path="/lake/orders")
    >>> @pipeline(upstreams=["orders"], target="/lake/orders_clean", keys=["order_id"])
    ... def orders_clean(batch):
    ...     return batch["orders"].net_changes(["order_id"])
    >>> registry = Registry(upstreams=[orders], pipelines=[orders_clean])
"""

import copy
import os
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from watermark_dagster.config.pipeline import ChangeFeed, Pipeline
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


def _table_key(parts: tuple[str, ...]) -> str:
    """A catalog name in one spelling (Spark's session catalog ignores case)."""
    return "table:" + ".".join(p.lower() for p in parts)


def _where(path: str, parts: tuple[str, ...] | None) -> str:
    """Where a table is, for comparing declarations: its location, or its catalog name while
    that is not resolved yet."""
    return _table_key(parts) if parts is not None and not path.strip() else _location(path)


_D = TypeVar("_D", Upstream, Pipeline)


def _located(declared: _D, attribute: str, location: str) -> _D:
    """A copy of ``declared`` (named by ``table``) whose ``attribute`` (``path`` or
    ``target``) holds the location the catalog resolved: both are then set, which a
    declaration may not do, so the copy is made without building it again."""
    found = copy.copy(declared)
    object.__setattr__(found, attribute, location)
    return found


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
            where = _where(p.target, p.table_parts)
            if where in targets:
                raise ConfigurationError(
                    f"Pipelines '{targets[where]}' and '{p.name}' write the same target "
                    f"{p.table or p.target!r}.",
                    pipeline=p.name,
                    fix="give each pipeline its own target table.",
                )
            targets[where] = p.name
        self._refuse_cycles()
        self._refuse_rewrites_read()

    def _refuse_cycles(self) -> None:
        """Refuse pipelines that read their own output: a target that is the path of an
        upstream feeding, directly or through other pipelines, the pipeline writing it.
        Every batch would then read what the previous one wrote, without end."""
        feeds = self._feeds()
        state: dict[str, bool] = {}  # False: on the current path; True: explored

        def visit(name: str, trail: list[tuple[str, str, str]]) -> None:
            state[name] = False
            for upstream, reader in feeds[name]:
                step = [*trail, (name, upstream, reader)]
                if state.get(reader) is False:
                    cycle = step[next(i for i, s in enumerate(step) if s[0] == reader) :]
                    chain = "; ".join(
                        f"'{p}' writes {self._target_text(p)!r} = upstream '{u}', read by '{r}'"
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

    def _feeds(self) -> dict[str, list[tuple[str, str]]]:
        """Pipeline -> [(an upstream its target is, a pipeline reading that upstream)]."""
        upstreams_at: dict[str, list[str]] = {}
        for u in self.upstreams.values():
            upstreams_at.setdefault(_where(u.path, u.table_parts), []).append(u.name)
        return {
            p.name: [
                (u, q.name)
                for u in upstreams_at.get(_where(p.target, p.table_parts), ())
                for q in self.pipelines.values()
                if u in q.upstreams
            ]
            for p in self.pipelines.values()
        }

    def _refuse_rewrites_read(self) -> None:
        """Refuse ``strategy='rewrite'`` on a target another pipeline reads, unless the
        pipeline says its change feed may hold every row (``change_feed='any'``)."""
        for name, readers in self._feeds().items():
            pipeline = self.pipelines[name]
            if readers and pipeline.strategy == "rewrite" and pipeline.change_feed is None:
                upstream, reader = readers[0]
                raise ConfigurationError(
                    f"Pipeline '{name}' sets strategy='rewrite', but its target is upstream "
                    f"'{upstream}' of pipeline '{reader}': each batch would put every row "
                    "of the target in the change feed that pipeline reads.",
                    pipeline=name,
                    fix="drop strategy= (auto then never rewrites this target), or set "
                    "change_feed='any' to accept that its readers see every row change.",
                )

    def change_feed(self, pipeline: str) -> ChangeFeed:
        """What ``pipeline``'s target's change feed promises: the pipeline's own
        ``change_feed``, else ``minimal`` when a pipeline of this registry reads the
        target (its batches read only what changed), else ``any``."""
        declared = self.pipelines[pipeline].change_feed
        if declared is not None:
            return ChangeFeed(declared)
        return ChangeFeed.MINIMAL if self._feeds()[pipeline] else ChangeFeed.ANY

    def _target_text(self, pipeline: str) -> str:
        found = self.pipelines[pipeline]
        return found.table or found.target

    def catalog_names(self) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
        """The declarations named by catalog table and not resolved yet: ``(upstream ->
        name parts, pipeline -> its target's name parts)``; both empty for a registry of
        paths, which then needs no catalog (and no JVM) at all."""
        upstreams = {
            n: parts
            for n, u in self.upstreams.items()
            if (parts := u.table_parts) is not None and not u.path.strip()
        }
        targets = {
            n: parts
            for n, p in self.pipelines.items()
            if (parts := p.table_parts) is not None and not p.target.strip()
        }
        return upstreams, targets

    def with_locations(
        self, upstreams: Mapping[str, str], targets: Mapping[str, str]
    ) -> "Registry":
        """This registry with the locations the catalog resolved: each upstream in
        ``upstreams`` gets its ``path``, each pipeline in ``targets`` its ``target`` (they
        keep their ``table``). Checked again as a whole, now by location, so a target that
        is an upstream's table under another name is a cycle too."""
        return Registry(
            upstreams=[
                _located(u, "path", upstreams[n]) if n in upstreams else u
                for n, u in self.upstreams.items()
            ],
            pipelines=[
                _located(p, "target", targets[n]) if n in targets else p
                for n, p in self.pipelines.items()
            ],
        )

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
            "upstreams": {n: u.path or u.table for n, u in self.upstreams.items()},
            "pipelines": {n: list(p.upstreams) for n, p in self.pipelines.items()},
        }
