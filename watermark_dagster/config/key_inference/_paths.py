"""The key path of each reference: breadth first from the references that hold the keys,
through the columns the query holds equal.
"""

from collections.abc import Sequence

from watermark_dagster.config.key_inference._classes import Classes
from watermark_dagster.config.key_inference._sources import Node, Ref
from watermark_dagster.config.key_paths import Hop, KeyPath


class Paths(Classes):
    """Key paths over the classes a query's scopes proved (see
    :class:`~watermark_dagster.config.key_inference.inference.Graph`)."""

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

        def columns_reaching(ref: Ref, target: Node, prefer: str) -> list[str]:
            found = sorted(c for c in ref.columns if target in self.reach((ref.id, c)))
            windowed = partitioned.get(ref.id, set())
            return sorted(found, key=lambda c: (c not in windowed, c != prefer))

        solved: dict[int, KeyPath] = {}
        queue: list[Ref] = []
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


__all__ = ["Paths"]
