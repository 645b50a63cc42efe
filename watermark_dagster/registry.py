"""Declaring upstreams and pipelines: a few lines each, validated when definitions load.

Example:
    >>> orders = Upstream("orders", path="/lake/orders")
    >>> @pipeline(upstreams=["orders"], target="/lake/orders_clean", keys=["order_id"])
    ... def orders_clean(batch):
    ...     return batch["orders"].net_changes(["order_id"])
    >>> registry = Registry(upstreams=[orders], pipelines=[orders_clean])
"""

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from watermark_dagster.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from watermark_dagster.execute import BatchContext

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Columns the framework adds to targets or reads from transform output.
RESERVED_PREFIX = "_wm_"


def validate_name(kind: str, value: str) -> str:
    """Check that ``value`` is a plain identifier (letters, digits, underscore).

    Names become asset keys, column references and file names; restricting them keeps
    quoting out of the picture entirely.
    """
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigurationError(
            f"Invalid {kind} {value!r}: use letters, digits and underscores, starting with a "
            "letter or underscore (at most 128 characters).",
            fix=f"rename the {kind}, e.g. {re.sub(r'[^A-Za-z0-9_]', '_', str(value))!r}.",
        )
    return value


@dataclass(frozen=True)
class Upstream:
    """A source Delta table, read incrementally by version.

    Args:
        name: registry name; also the Dagster asset key.
        path: location of the Delta table (local path or object-store URI).
        storage_options: delta-rs / Spark storage options for object stores.
        max_versions_per_batch: cap on how many versions one batch reads (None: no cap).
        description: shown in the Dagster UI.
    """

    name: str
    path: str
    storage_options: Mapping[str, str] | None = None
    max_versions_per_batch: int | None = None
    description: str | None = None

    def __post_init__(self) -> None:
        validate_name("upstream name", self.name)
        if not isinstance(self.path, str) or not self.path.strip():
            raise ConfigurationError(
                f"Upstream '{self.name}' has no path.",
                upstream=self.name,
                fix="give the Delta table's location as path=...",
            )
        if self.max_versions_per_batch is not None and (
            not isinstance(self.max_versions_per_batch, int) or self.max_versions_per_batch < 1
        ):
            raise ConfigurationError(
                f"Upstream '{self.name}': max_versions_per_batch must be a positive integer, "
                f"got {self.max_versions_per_batch!r}.",
                upstream=self.name,
                fix="set it to 1 or more, or leave it unset for no cap.",
            )


Transform = Callable[["BatchContext"], "DataFrame"]


@dataclass(frozen=True)
class Pipeline:
    """A transform from one or more upstreams into one target table, run once per batch.

    The transform returns the changes to apply to the target: target columns plus an
    optional ``_change_type`` (``"delete"`` deletes the key; anything else upserts) and an
    optional ``_commit_version`` that orders several changes of one key (the latest wins).

    Args:
        name: registry name; also the Dagster asset key.
        upstreams: names of the upstreams the transform reads.
        target: location of the target Delta table.
        keys: key columns the target is merged on.
        transform: the function, ``transform(batch) -> DataFrame``.
        description: shown in the Dagster UI (defaults to the function's docstring).
    """

    name: str
    upstreams: tuple[str, ...]
    target: str
    keys: tuple[str, ...]
    transform: Transform = field(compare=False)
    description: str | None = None

    def __post_init__(self) -> None:
        validate_name("pipeline name", self.name)
        if not self.upstreams:
            raise ConfigurationError(
                f"Pipeline '{self.name}' reads no upstream.",
                pipeline=self.name,
                fix="name at least one upstream in upstreams=[...].",
            )
        for u in self.upstreams:
            validate_name("upstream name", u)
        if len(set(self.upstreams)) != len(self.upstreams):
            raise ConfigurationError(
                f"Pipeline '{self.name}' lists an upstream twice: {list(self.upstreams)}.",
                pipeline=self.name,
            )
        if not self.keys:
            raise ConfigurationError(
                f"Pipeline '{self.name}' has no key columns.",
                pipeline=self.name,
                fix="give the target's key columns as keys=[...].",
            )
        for k in self.keys:
            validate_name("key column", k)
            if k.startswith(RESERVED_PREFIX):
                raise ConfigurationError(
                    f"Pipeline '{self.name}': key column {k!r} uses the reserved prefix "
                    f"{RESERVED_PREFIX!r}.",
                    pipeline=self.name,
                )
        if not isinstance(self.target, str) or not self.target.strip():
            raise ConfigurationError(
                f"Pipeline '{self.name}' has no target.",
                pipeline=self.name,
                fix="give the target Delta table's location as target=...",
            )
        if not callable(self.transform):
            raise ConfigurationError(
                f"Pipeline '{self.name}': transform is not callable.", pipeline=self.name
            )


def pipeline(
    *,
    upstreams: Sequence[str],
    target: str,
    keys: Sequence[str],
    name: str | None = None,
    description: str | None = None,
) -> Callable[[Transform], Pipeline]:
    """Declare a pipeline with a decorated transform function.

    Example:
        >>> @pipeline(upstreams=["orders", "customers"], target="/lake/enriched",
        ...           keys=["order_id"])
        ... def orders_enriched(batch):
        ...     ...
    """

    def wrap(fn: Transform) -> Pipeline:
        return Pipeline(
            name=name or fn.__name__,
            upstreams=tuple(upstreams),
            target=target,
            keys=tuple(keys),
            transform=fn,
            description=description or (fn.__doc__ or "").strip() or None,
        )

    return wrap


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

    def pipeline_inputs(self) -> dict[str, tuple[str, ...]]:
        """pipeline -> the upstreams it reads."""
        return {name: p.upstreams for name, p in self.pipelines.items()}

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
