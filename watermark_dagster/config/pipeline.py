"""Pipelines: a transform from pinned upstream inputs into one target table, run once per
batch (what the transform receives: :mod:`~watermark_dagster.config.batch_context`).

Example:
    >>> @pipeline(upstreams=["orders"], target="/lake/orders_clean", keys=["order_id"])
    ... def orders_clean(batch: BatchContext) -> DataFrame:
    ...     return batch["orders"].net_changes(["order_id"])
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, cast

from watermark_dagster.config import warehouse as wh
from watermark_dagster.config.batch_context import Transform
from watermark_dagster.config.declared import (
    Declared,
    FullTransform,
    KeyPathSpec,
    check_function,
    declare,
)
from watermark_dagster.config.locations import absolute_location
from watermark_dagster.config.names import (
    check_table_declaration,
    enum_value,
    table_name_parts,
    validate_name,
)
from watermark_dagster.config.options import Kind, written_as
from watermark_dagster.config.secrets import StorageOptions, checked_options
from watermark_dagster.core.columns import RESERVED_PREFIX
from watermark_dagster.core.strategy import ChangeFeed, Strategy
from watermark_dagster.errors import ConfigurationError

WriteModeValue = Literal["merge", "append", "overwrite"]


class WriteMode(StrEnum):
    """How a pipeline writes its target.

    * ``merge``: upsert and delete by key; only newer changes are taken.
    * ``append``: append rows; a retried batch is not appended twice (Delta transaction ids).
    * ``overwrite``: replace the target with the transform's output of a full reload.
    """

    MERGE = "merge"
    APPEND = "append"
    OVERWRITE = "overwrite"


StrategyValue = Literal["auto", "incremental", "maintain", "full", "rewrite"]
ChangeFeedValue = Literal["minimal", "any"]


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """A transform from one or more upstreams into one target table, run once per batch.

    The transform returns the changes to apply to the target: target columns, an optional
    ``_change_type`` (``"delete"`` deletes the key; anything else upserts) and ``_commit_version``
    ordering several changes of one key (the latest wins).

    Args:
        name: registry name; also the Dagster asset key.
        upstreams: names of the upstreams the transform reads.
        target: location of the target Delta table, or a warehouse table to load each batch
            into exactly once: ``{kind: postgres, url: ..., table: ...}`` in a registry file
            (:class:`~watermark_dagster.config.warehouse.PostgresTarget`; docs/warehouse.md).
        table: instead of ``target``, the target's name in the Spark catalog
            (``schema.table`` or ``catalog.schema.table``). An existing table is resolved to
            its location when the code location loads; a missing one is created by the
            first write at the location the catalog gives a new table of that schema, and
            registered under the name.
        keys: key columns the target is merged on (required for ``write="merge"``).
        transform: the function, ``transform(batch) -> DataFrame`` (the hand-written form).
        full_transform: beside ``transform``, the target from scratch
            (``full(orders=..., customers=...) -> DataFrame``, a pinned snapshot each);
            each batch runs one of the two (``full`` diffed with the target, only changed
            rows merged), so it must equal the batches' sum; ``write`` is ``merge``.
        declared: instead of ``transform``, the full transform and every upstream's key
            path; the incremental transform is derived (:mod:`~watermark_dagster.config.declared`,
            built by :func:`declared_pipeline` or :func:`sql_pipeline`).
        description: shown in the Dagster UI (defaults to the function's docstring).
        write: ``merge`` (default), ``append`` or ``overwrite`` (:class:`WriteMode`).
        partition_by: partition columns the target is created with.
        cluster_by: liquid clustering columns the target is created with.
        strategy: for a declared pipeline or one with a ``full_transform``, ``auto``
            (default), ``incremental``, ``maintain``, ``full`` or ``rewrite`` (:class:`Strategy`).
        change_feed: what the target's change feed promises, ``minimal`` or ``any``
            (:class:`ChangeFeed`); by default ``minimal`` when a pipeline of the registry
            reads the target, else ``any`` (:meth:`Registry.change_feed`).
        storage_options: storage options for the target on an object store (credentials
            as ``EnvRef("VARIABLE")`` or from the environment, never as text).
        feed_on_create: create the target with Delta's change data feed on, for a
            downstream :class:`~watermark_dagster.config.upstream.DeltaUpstream` that reads
            its updates and deletes (Python only; an extraction stage sets it).
        warehouse: instead of ``target``, the warehouse table loaded, a
            :class:`~watermark_dagster.config.warehouse.PostgresTarget` (Python only).
    """

    name: str
    upstreams: Sequence[str] = field(metadata=written_as(Kind.UPSTREAMS))
    target: str = field(default="", metadata=written_as(Kind.TARGET))
    table: str | None = field(
        default=None,
        metadata=written_as(
            Kind.TABLE, shape="text (the target's catalog table name: schema.table)"
        ),
    )
    keys: Sequence[str] = field(default=(), metadata=written_as(Kind.NAMES))
    transform: Transform | None = field(
        default=None, compare=False, metadata=written_as(Kind.FUNCTION)
    )
    full_transform: FullTransform | None = field(
        default=None,
        compare=False,
        metadata=written_as(
            Kind.FUNCTION,
            key="full",
            shape="text (module:function)",
        ),
    )
    declared: Declared | None = field(default=None, compare=False)
    description: str | None = field(default=None, metadata=written_as(Kind.TEXT))
    write: WriteModeValue = field(default="merge", metadata=written_as(Kind.CHOICE))
    partition_by: tuple[str, ...] = field(default=(), metadata=written_as(Kind.NAMES))
    cluster_by: tuple[str, ...] = field(default=(), metadata=written_as(Kind.NAMES))
    storage_options: StorageOptions | None = field(
        default=None, metadata=written_as(Kind.STORAGE_OPTIONS)
    )
    strategy: StrategyValue = field(default="auto", metadata=written_as(Kind.CHOICE))
    change_feed: ChangeFeedValue | None = field(default=None, metadata=written_as(Kind.CHOICE))
    feed_on_create: bool = False
    warehouse: wh.PostgresTarget | None = None

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
        owner = f"Pipeline '{self.name}'"
        object.__setattr__(
            self, "storage_options", checked_options(f"{owner} target", self.storage_options)
        )
        object.__setattr__(self, "write", enum_value(WriteMode, self.write, "write", owner))
        strategy = enum_value(Strategy, self.strategy, "strategy", owner)
        object.__setattr__(self, "strategy", strategy)
        if not self.chooses_strategy and strategy is not Strategy.AUTO:
            raise ConfigurationError(
                f"{owner} is hand-written and sets strategy='{strategy}' without a full "
                "transform: there is nothing to choose between.",
                pipeline=self.name,
                fix="drop strategy=, give the full transform beside the transform "
                "(full_transform=..., or full: beside transform: in the registry file), or "
                "declare the pipeline (declared_pipeline, sql_pipeline, or full:/sql: with "
                "key paths).",
            )
        if self.change_feed is not None:
            change_feed = enum_value(ChangeFeed, self.change_feed, "change_feed", owner)
            object.__setattr__(self, "change_feed", change_feed)
            if strategy is Strategy.REWRITE and change_feed is ChangeFeed.MINIMAL:
                raise ConfigurationError(
                    f"{owner} sets strategy='rewrite' and change_feed='minimal': a rewrite "
                    "puts every row of the target in its change feed.",
                    pipeline=self.name,
                    fix="drop strategy= (auto picks among the others), use strategy='full' "
                    "(only the rows that differ are written), or set change_feed='any'.",
                )
        object.__setattr__(self, "upstreams", tuple(self.upstreams))
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        object.__setattr__(self, "cluster_by", tuple(self.cluster_by))
        if not self.keys and self.write is WriteMode.MERGE:
            raise ConfigurationError(
                f"Pipeline '{self.name}' merges into its target but has no key columns.",
                pipeline=self.name,
                fix="give the target's key columns as keys=[...], or write='append'.",
            )
        if self.partition_by and self.cluster_by:
            raise ConfigurationError(
                f"{owner}: a Delta table is either partitioned or clustered, not both.",
                pipeline=self.name,
                fix="keep partition_by or cluster_by.",
            )
        for k in (*self.partition_by, *self.cluster_by):
            validate_name("target column", k)
        for k in self.keys:
            validate_name("key column", k)
            if k.startswith(RESERVED_PREFIX):
                raise ConfigurationError(
                    f"Pipeline '{self.name}': key column {k!r} uses the reserved prefix "
                    f"{RESERVED_PREFIX!r}.",
                    pipeline=self.name,
                )
        # Declarations come from plain Python and YAML: the annotations are not enforced.
        if not isinstance(self.target, str) or self.warehouse is not None:  # pyright: ignore[reportUnnecessaryIsInstance]
            wh.bind_warehouse(self, wh.warehouse_target(self.name, self.warehouse or self.target))
        elif self.table is not None:
            check_table_declaration(owner, self.target, self.table, pipeline=self.name)
        elif not self.target.strip():
            raise ConfigurationError(
                f"Pipeline '{self.name}' has no target.",
                pipeline=self.name,
                fix="give the target Delta table's location as target=..., or its catalog "
                "name as table=...",
            )
        else:
            object.__setattr__(self, "target", absolute_location(self.target))
        if self.declared is not None:
            self._check_declared(self.declared)
        elif self.transform is None:
            raise ConfigurationError(
                f"Pipeline '{self.name}' has no transform.",
                pipeline=self.name,
                fix="give transform=... (a function of the batch), or declare the full "
                "transform with @declared_pipeline or sql_pipeline(...).",
            )
        elif not callable(self.transform):
            raise ConfigurationError(
                f"Pipeline '{self.name}': transform is not callable.", pipeline=self.name
            )
        if self.full_transform is not None:
            self._check_full_transform(self.full_transform)
        if strategy is Strategy.MAINTAIN:
            from watermark_dagster.config.maintained import form_of, refuse_unmaintainable

            sql = self.declared.sql if self.declared else None
            refuse_unmaintainable(self.name, form_of(sql, self.upstreams))

    @property
    def chooses_strategy(self) -> bool:
        """Whether the pipeline has a full transform to choose per batch: declared, or
        hand-written with ``full_transform``."""
        return self.declared is not None or self.full_transform is not None

    @property
    def maintainable(self) -> bool:
        """Whether ``auto`` may run ``maintain`` for it (declared SQL only)."""
        if self.declared is None or self.declared.sql is None:
            return False
        from watermark_dagster.config.maintained import MaintainedForm, form_of

        return isinstance(form_of(self.declared.sql, self.upstreams), MaintainedForm)

    def _check_full_transform(self, full_transform: object) -> None:
        if self.declared is not None:
            raise ConfigurationError(
                f"Pipeline '{self.name}' is declared and also gives full_transform=.",
                pipeline=self.name,
                fix="drop full_transform=: a declared pipeline's full transform is its "
                "declaration.",
            )
        check_function(self.name, full_transform, self.upstreams)
        if self.write is not WriteMode.MERGE:
            raise ConfigurationError(
                f"Pipeline '{self.name}' gives a full transform but writes with "
                f"write='{self.write}': a full batch merges the rows that differ from the "
                "target.",
                pipeline=self.name,
                fix="drop write= (merge), or drop full_transform=.",
            )

    def _check_declared(self, declared: Declared) -> None:
        if self.transform is not None:
            raise ConfigurationError(
                f"Pipeline '{self.name}' has both a transform and a declared full transform.",
                pipeline=self.name,
                fix="keep one: the declared form derives the incremental transform itself.",
            )
        if self.write is not WriteMode.MERGE:
            raise ConfigurationError(
                f"Pipeline '{self.name}' is declared but writes with write='{self.write}': a "
                "declared pipeline upserts and deletes the keys a batch touched.",
                pipeline=self.name,
                fix="drop write= (a declared pipeline merges), or hand-write the transform.",
            )
        if set(declared.key_paths) != set(self.upstreams):
            missing = [u for u in self.upstreams if u not in declared.key_paths]
            extra = [u for u in declared.key_paths if u not in self.upstreams]
            raise ConfigurationError(
                f"Pipeline '{self.name}': "
                + (f"upstream(s) {missing} have no key path" if missing else "")
                + ("; " if missing and extra else "")
                + (f"key path(s) given for {extra}, which it does not read" if extra else "")
                + ".",
                pipeline=self.name,
                upstream=(missing or extra)[0],
                fix="give every upstream the pipeline reads a key path, and no other.",
            )
        for path in declared.key_paths.values():
            if len(path.end) != len(self.keys):
                raise ConfigurationError(
                    f"Pipeline '{self.name}': the key path of '{path.upstream}' ({path}) ends "
                    f"at {len(path.end)} column(s), the target has keys {list(self.keys)}.",
                    pipeline=self.name,
                    upstream=path.upstream,
                    fix="end each key path at the target's key columns.",
                )

    @property
    def table_parts(self) -> tuple[str, ...] | None:
        """The parts of ``table`` without backticks (None: the target is named by path)."""
        return (
            None if self.table is None else table_name_parts(self.table, f"Pipeline '{self.name}'")
        )


def declared_pipeline(
    *,
    upstreams: Mapping[str, KeyPathSpec],
    keys: Sequence[str],
    target: "str | wh.PostgresTarget" = "",
    table: str | None = None,
    name: str | None = None,
    description: str | None = None,
    partition_by: Sequence[str] = (),
    cluster_by: Sequence[str] = (),
    storage_options: StorageOptions | None = None,
    strategy: StrategyValue = "auto",
    change_feed: ChangeFeedValue | None = None,
) -> Callable[[FullTransform], Pipeline]:
    """Declare a pipeline by its full transform; the incremental one is derived.

    The decorated function computes the target from scratch: it takes one DataFrame per
    upstream (the snapshot, as the batch pinned it), by the upstream's name. ``upstreams``
    maps each upstream to its key path (:mod:`~watermark_dagster.config.declared`).

    Example:
        >>> @declared_pipeline(
        ...     upstreams={
        ...         "orders": "order_id",
        ...         "customers": "customers.customer_id -> orders.customer_id -> orders.order_id",
        ...     },
        ...     target="/lake/orders_enriched",
        ...     keys=["order_id"],
        ... )
        ... def orders_enriched(orders, customers):
        ...     return orders.join(customers.select("customer_id", "name"), "customer_id", "left")

    Raises:
        ConfigurationError: when the definitions load, for anything that keeps the
            incremental form from being derived (names the pipeline, upstream and fix).
    """

    def wrap(fn: FullTransform) -> Pipeline:
        pipeline_name = name or getattr(fn, "__name__", "")
        validate_name("pipeline name", pipeline_name)
        return _declared(
            pipeline_name,
            upstreams,
            declare(pipeline_name, upstreams, keys=tuple(keys), function=fn),
            keys=tuple(keys),
            target=target,  # pyright: ignore[reportArgumentType]: a warehouse target too
            table=table,
            description=description or (fn.__doc__ or "").strip() or None,
            partition_by=tuple(partition_by),
            cluster_by=tuple(cluster_by),
            storage_options=storage_options,
            strategy=strategy,
            change_feed=change_feed,
        )

    return wrap


def sql_pipeline(
    *,
    name: str,
    sql: str,
    upstreams: Mapping[str, KeyPathSpec],
    keys: Sequence[str],
    target: "str | wh.PostgresTarget" = "",
    table: str | None = None,
    description: str | None = None,
    partition_by: Sequence[str] = (),
    cluster_by: Sequence[str] = (),
    storage_options: StorageOptions | None = None,
    strategy: StrategyValue = "auto",
    change_feed: ChangeFeedValue | None = None,
) -> Pipeline:
    """Declare a pipeline by one Spark SQL query over views named after its upstreams; the
    incremental form is derived as for :func:`declared_pipeline`.

    Example:
        >>> sql_pipeline(
        ...     name="customer_payments",
        ...     sql="SELECT customer_id, SUM(amount_cents) AS total FROM payments "
        ...     "GROUP BY customer_id",
        ...     upstreams={"payments": "customer_id"},
        ...     target="/lake/customer_payments",
        ...     keys=["customer_id"],
        ... )

    Raises:
        ConfigurationError: as :func:`declared_pipeline`, and for SQL that reads anything but
            the upstreams or uses a window, LIMIT, sampling or a non-deterministic function.
    """
    validate_name("pipeline name", name)
    return _declared(
        name,
        upstreams,
        declare(name, upstreams, keys=tuple(keys), sql=sql),
        keys=tuple(keys),
        target=target,  # pyright: ignore[reportArgumentType]: a warehouse target too
        table=table,
        description=description,
        partition_by=tuple(partition_by),
        cluster_by=tuple(cluster_by),
        storage_options=storage_options,
        strategy=strategy,
        change_feed=change_feed,
    )


def _declared(
    name: str, upstreams: Mapping[str, KeyPathSpec], declared: Declared, **settings: object
) -> Pipeline:
    """The pipeline a declaration makes, its upstreams those its key paths name."""
    names = tuple(_upstream_names(name, upstreams))
    # The settings are the builders' own typed keywords, passed on as they came.
    return Pipeline(name=name, upstreams=names, declared=declared, **settings)  # pyright: ignore[reportArgumentType]


def _upstream_names(pipeline: str, upstreams: object) -> list[str]:
    if not isinstance(upstreams, Mapping):
        raise ConfigurationError(
            f"Pipeline '{pipeline}': a declared pipeline's upstreams map each upstream to its "
            f"key path, not {type(upstreams).__name__}.",
            pipeline=pipeline,
            fix="e.g. upstreams={'orders': 'order_id', 'customers': "
            "'customers.customer_id -> orders.customer_id -> orders.order_id'}.",
        )
    return [str(u) for u in cast("Mapping[object, object]", upstreams)]


def pipeline(
    *,
    upstreams: Sequence[str],
    target: "str | wh.PostgresTarget" = "",
    table: str | None = None,
    keys: Sequence[str] = (),
    name: str | None = None,
    description: str | None = None,
    write: WriteModeValue = "merge",
    partition_by: Sequence[str] = (),
    cluster_by: Sequence[str] = (),
    storage_options: StorageOptions | None = None,
    full_transform: FullTransform | None = None,
    strategy: StrategyValue = "auto",
    change_feed: ChangeFeedValue | None = None,
) -> Callable[[Transform], Pipeline]:
    """Declare a pipeline with a decorated transform function (the arguments are those of
    :class:`Pipeline`; give ``target`` or ``table``).

    Example:
        >>> @pipeline(upstreams=["orders", "customers"], target="/lake/enriched",
        ...           keys=["order_id"], full_transform=full_orders_enriched)
        ... def orders_enriched(batch):
        ...     ...

    With ``full_transform`` (the target from scratch, one snapshot per upstream by name)
    each batch runs the decorated transform or the full one, whichever ``strategy``
    (``auto`` by default) picks.
    """

    def wrap(fn: Transform) -> Pipeline:
        return Pipeline(
            name=name or fn.__name__,
            upstreams=tuple(upstreams),
            target=target,  # pyright: ignore[reportArgumentType]: a warehouse target too
            table=table,
            keys=tuple(keys),
            transform=fn,
            description=description or (fn.__doc__ or "").strip() or None,
            write=write,
            partition_by=tuple(partition_by),
            cluster_by=tuple(cluster_by),
            storage_options=storage_options,
            full_transform=full_transform,
            strategy=strategy,
            change_feed=change_feed,
        )

    return wrap
