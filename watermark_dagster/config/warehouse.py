"""A warehouse table as a pipeline's target: PostgreSQL (the dialect Redshift speaks).

A pipeline whose ``target`` is a :class:`PostgresTarget` (``target: {kind: postgres, ...}``
in a registry file) writes each batch into a database table instead of a Delta table, in
one database transaction that also records the batch's position in a small state table of
the same database (:mod:`~watermark_dagster.write.warehouse`). Its rows come from the
pipeline's transform on Spark, as every pipeline's do; its keys and write mode mean what
they mean for a Delta target.

Credentials are environment references only (``{env: VARIABLE}``), read when a
connection opens: neither is stored by Dagster, and the URL may not carry them.

Example:
    >>> PostgresTarget(url="jdbc:postgresql://warehouse:5432/analytics",
    ...                table="public.orders", user=EnvRef("WH_USER"),
    ...                password=EnvRef("WH_PASSWORD"))
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol, cast, get_args

from watermark_dagster.config.database import check_url
from watermark_dagster.config.options import Kind, written_as
from watermark_dagster.config.secrets import EnvRef, as_reference
from watermark_dagster.core.strategy import Strategy
from watermark_dagster.errors import ConfigurationError

WarehouseLoad = Literal["auto", "jdbc", "copy"]
LOAD_CHOICES: tuple[str, ...] = get_args(WarehouseLoad)
WAREHOUSE_KINDS = ("postgres",)
"""The ``kind:`` values of a warehouse target (one dialect module each)."""
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
DEFAULT_STATE_TABLE = "watermark_state"


@dataclass(frozen=True, kw_only=True)
class PostgresTarget:
    """A PostgreSQL table a pipeline loads each batch into, exactly once.

    Args:
        url: the JDBC URL of the database, ``jdbc:postgresql://host:5432/db``; no user or
            password inside it.
        table: the target table, ``schema.table`` (or ``table``, in schema ``public``):
            lower-case letters, digits and underscores. Created on the first load when
            missing (the output's columns, ``_wm_seq`` and ``_wm_batch_id``, a primary key
            on the keys).
        user: the database user as ``{env: VARIABLE}`` (``EnvRef("VARIABLE")`` in Python).
        password: the password as ``{env: VARIABLE}``, never as text.
        state_table: the table, in the target's database, where each pipeline's loaded
            position is recorded in the load's own transaction (one row per pipeline;
            ``schema.table`` or ``table``, in the target's schema).
        load: how a batch's rows reach the database: ``jdbc`` (Spark's JDBC writer, from
            the executors), ``copy`` (the driver streams them with ``COPY``) or ``auto``
            (``copy`` up to 5,000 rows, else ``jdbc``; docs/benchmarks.md#warehouse-loads).
    """

    url: str = field(metadata=written_as(Kind.TEXT, shape="text (jdbc:postgresql://host/db)"))
    table: str = field(metadata=written_as(Kind.TEXT, shape="text (schema.table in the database)"))
    user: EnvRef | None = field(default=None, metadata=written_as(Kind.SECRET))
    password: EnvRef | None = field(default=None, metadata=written_as(Kind.SECRET))
    state_table: str = field(
        default=DEFAULT_STATE_TABLE,
        metadata=written_as(Kind.TEXT, shape="text (schema.table or table)"),
    )
    load: WarehouseLoad = field(default="auto", metadata=written_as(Kind.CHOICE))

    def __post_init__(self) -> None:
        owner = "Warehouse target"
        check_url(owner, "", self.url)
        if not self.url.lower().startswith("jdbc:postgresql://"):
            raise ConfigurationError(
                f"{owner}: url {self.url!r} is not a PostgreSQL URL; a warehouse target "
                "speaks PostgreSQL's dialect.",
                fix="give jdbc:postgresql://host:5432/db (a Redshift dialect would be a "
                "module of its own: docs/warehouse.md#redshift).",
            )
        for what in ("table", "state_table"):
            named = getattr(self, what)
            parts = named.split(".") if isinstance(named, str) else ["?", "?", "?"]
            if len(parts) > 2 or not all(_IDENTIFIER.match(p) for p in parts):
                raise ConfigurationError(
                    f"{owner} at {self.url}: {what} {named!r} is not schema.table of "
                    "lower-case identifiers (letters, digits and underscores).",
                    fix=f"name it so, e.g. {what}: "
                    + ("public.orders" if what == "table" else DEFAULT_STATE_TABLE)
                    + " (each part is quoted for the database).",
                )
        for what in ("user", "password"):
            value = getattr(self, what)
            if value is None:
                continue
            reference = as_reference(value)
            if reference is None:
                shown = "text" if isinstance(value, str) else f"a {type(value).__name__}"
                raise ConfigurationError(
                    f"{owner} {self.table}: {what} is given as {shown}; a database "
                    "credential is only read from the environment, so Dagster never stores it.",
                    fix=f"write {what}: {{env: WH_{what.upper()}}} (EnvRef('WH_{what.upper()}') "
                    "in Python) and set that variable where the code location and its runs "
                    "start.",
                )
            object.__setattr__(self, what, reference)
        if self.load not in LOAD_CHOICES:
            raise ConfigurationError(
                f"{owner} {self.table}: load must be one of {', '.join(LOAD_CHOICES)}, got "
                f"{self.load!r}.",
                fix="set load: auto (the default), jdbc or copy.",
            )

    @property
    def database(self) -> str:
        """The URL's sub-protocol: ``postgresql``."""
        return "postgresql"

    @property
    def schema(self) -> str:
        """The target table's schema (``public`` when the table names none)."""
        return self.table.split(".")[0] if "." in self.table else "public"

    @property
    def name(self) -> str:
        """The target table's name within its schema."""
        return self.table.split(".")[-1]

    @property
    def state_schema(self) -> str:
        """The state table's schema (the target's when it names none)."""
        return self.state_table.split(".")[0] if "." in self.state_table else self.schema

    @property
    def state_name(self) -> str:
        """The state table's name within its schema."""
        return self.state_table.split(".")[-1]

    @property
    def location(self) -> str:
        """Where the target is, as the pipeline's ``target`` shows it: the URL (which
        carries no credential) and the qualified table."""
        return f"{self.url}#{self.schema}.{self.name}"


def warehouse_target(pipeline: str, value: object) -> PostgresTarget:
    """``value`` (a :class:`PostgresTarget`, or a registry file's mapping with
    ``kind: postgres``) as a :class:`PostgresTarget`.

    Raises:
        ConfigurationError: an unknown ``kind`` or key, or a value its declaration refuses,
            naming the pipeline.
    """
    if isinstance(value, PostgresTarget):
        return value
    entry = cast("Mapping[str, Any]", value)
    kind = entry.get("kind")
    if kind not in WAREHOUSE_KINDS:
        raise ConfigurationError(
            f"Pipeline '{pipeline}': target kind {kind!r} is not a warehouse this release loads.",
            pipeline=pipeline,
            fix="write target: {kind: postgres, url: ..., table: ...}, or give the target "
            "Delta table's location as text.",
        )
    known = {f.name for f in fields(PostgresTarget)}
    unknown = sorted(k for k in entry if k != "kind" and k not in known)
    missing = sorted(k for k in ("url", "table") if entry.get(k) is None)
    if unknown or missing:
        raise ConfigurationError(
            f"Pipeline '{pipeline}': its warehouse target "
            + (f"has unknown key(s) {unknown}" if unknown else "")
            + (" and " if unknown and missing else "")
            + (f"lacks {missing}" if missing else "")
            + f"; it takes kind, {', '.join(sorted(known))}.",
            pipeline=pipeline,
            fix="write target: {kind: postgres, url: jdbc:postgresql://host:5432/db, table: "
            "schema.table, user: {env: WH_USER}, password: {env: WH_PASSWORD}}.",
        )
    settings = {k: v for k, v in entry.items() if k != "kind" and v is not None}
    try:
        return PostgresTarget(**settings)
    except ConfigurationError as e:
        raise ConfigurationError(
            f"Pipeline '{pipeline}': {e.reason}",
            pipeline=pipeline,
            fix=e.fix or "correct the target.",
        ) from None


class _Pipeline(Protocol):
    """A pipeline's settings as :func:`check_warehouse_pipeline` reads them."""

    @property
    def name(self) -> str: ...
    @property
    def table(self) -> str | None: ...
    @property
    def partition_by(self) -> tuple[str, ...]: ...
    @property
    def cluster_by(self) -> tuple[str, ...]: ...
    @property
    def storage_options(self) -> object: ...
    @property
    def change_feed(self) -> object: ...
    @property
    def feed_on_create(self) -> bool: ...
    @property
    def strategy(self) -> object: ...
    @property
    def chooses_strategy(self) -> bool: ...


def check_warehouse_pipeline(pipeline: _Pipeline, warehouse: PostgresTarget) -> None:
    """A pipeline loading ``warehouse`` gives only the settings a database table takes, and
    no strategy that reads the target back (``full``, ``maintain``).

    Raises:
        ConfigurationError: naming the pipeline, the setting and the fix.
    """
    owner = f"Pipeline '{pipeline.name}'"
    for what in (
        "table",
        "partition_by",
        "cluster_by",
        "storage_options",
        "change_feed",
        "feed_on_create",
    ):
        given = getattr(pipeline, what)
        if given:
            raise ConfigurationError(
                f"{owner} loads warehouse table {warehouse.table}; {what}={given!r} is a Delta "
                "target's setting and does not apply.",
                pipeline=pipeline.name,
                fix=f"remove {what}.",
            )
    if str(pipeline.strategy) in ("full", "maintain"):
        raise ConfigurationError(
            f"{owner} loads warehouse table {warehouse.table} with "
            f"strategy='{pipeline.strategy}', which reads the target's rows back into Spark on "
            "every batch.",
            pipeline=pipeline.name,
            fix="drop strategy= (a warehouse target runs the incremental form, or "
            "strategy='rewrite' to replace the table each batch), or keep the aggregate in a "
            "Delta target and load the warehouse from it.",
        )


def bind_warehouse(pipeline: _Pipeline, warehouse: PostgresTarget) -> None:
    """Complete a pipeline's declaration with the warehouse it loads
    (:func:`check_warehouse_pipeline` first): ``warehouse`` set, ``target`` its location,
    and ``auto`` the incremental form (a warehouse target is never read back)."""
    check_warehouse_pipeline(pipeline, warehouse)
    if pipeline.strategy is Strategy.AUTO and pipeline.chooses_strategy:
        object.__setattr__(pipeline, "strategy", Strategy.INCREMENTAL)
    object.__setattr__(pipeline, "warehouse", warehouse)
    object.__setattr__(pipeline, "target", warehouse.location)


__all__ = [
    "bind_warehouse",
    "check_warehouse_pipeline",
    "DEFAULT_STATE_TABLE",
    "LOAD_CHOICES",
    "WAREHOUSE_KINDS",
    "PostgresTarget",
    "WarehouseLoad",
    "warehouse_target",
]
