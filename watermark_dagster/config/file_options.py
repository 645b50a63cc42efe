"""The settings as a registry file and a component's ``defs.yaml`` write them, made from
the declarations (:mod:`~watermark_dagster.config.options`).

An upstream entry takes a :class:`~watermark_dagster.config.upstream.DeltaUpstream`'s
settings, with ``mode: timestamp`` (or ``kind: cursor``) a
:class:`~watermark_dagster.config.upstream.CursorUpstream`'s, with ``kind: landing`` a
:class:`~watermark_dagster.config.landing.LandingUpstream`'s and with ``kind: database`` a
:class:`~watermark_dagster.config.database.DatabaseUpstream`'s; a pipeline entry takes a
:class:`~watermark_dagster.config.pipeline.Pipeline`'s, with ``full:`` for its full
transform and ``sql:`` for a query.
"""

from dataclasses import replace

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.options import Kind, Option, file_only, options_of
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream, Upstream, UpstreamMode
from watermark_dagster.config.upstream_kinds import UPSTREAM_KINDS
from watermark_dagster.config.warehouse import WAREHOUSE_KINDS, PostgresTarget


def _upstream_options() -> tuple[Option, ...]:
    """The settings of an upstream entry in a file: ``kind``, a Delta upstream's, with
    ``mode: timestamp`` a cursor upstream's, with ``kind: landing`` a landing folder's (a
    key two kinds share is listed once, applying to both) and with ``kind: database`` a
    database upstream's."""
    shared = {o.key for o in options_of(Upstream)}
    by_version = "by version"
    by_cursor = "`mode: timestamp`"
    by_landing = "`kind: landing`"
    found: list[Option] = [
        file_only(
            "kind",
            Kind.CHOICE,
            "What the upstream is: ``delta`` (default; ``cursor`` with ``mode: timestamp``), "
            "``cursor`` (a table or folder read by a cursor column), ``landing`` (a folder "
            "whose files are each loaded once) or ``database`` (a database table read through "
            "JDBC by a cursor column).",
            choices=tuple(UPSTREAM_KINDS),
        )
    ]
    for option in options_of(DeltaUpstream):
        if option.key == "mode":
            option = replace(
                option,
                choices=(*option.choices, str(UpstreamMode.TIMESTAMP)),
                doc=f"{option.doc} ``timestamp``: read in windows of a cursor column (the "
                f"settings for {by_cursor} apply).",
            )
        found.append(option if option.key in shared else replace(option, applies=by_version))
    found += [
        replace(o, applies=by_cursor) for o in options_of(CursorUpstream) if o.key not in shared
    ]
    for option in options_of(LandingUpstream):
        if option.key in shared:
            continue
        at = next((i for i, o in enumerate(found) if o.key == option.key), None)
        if at is None:
            found.append(replace(option, applies=by_landing))
        else:
            known = found[at]
            found[at] = replace(
                known,
                applies=f"{known.applies} or {by_landing}",
                kind=Kind.OPTIONS if option.kind is Kind.OPTIONS else known.kind,
                doc=f"{known.doc} For {by_landing}: {option.doc}",
                choices=(),
                default=None,
            )
    listed = {o.key for o in found}
    found += [
        replace(o, applies="`kind: database`")
        for o in options_of(DatabaseUpstream)
        if o.key not in listed
    ]
    return tuple(found)


UPSTREAM_OPTIONS = _upstream_options()
"""Every setting an upstream entry of a registry file or a component may give."""


def _pipeline_options() -> tuple[Option, ...]:
    """The settings of a pipeline entry in a file: the :class:`Pipeline`'s, where ``full:``
    also declares a pipeline whose upstreams map to key paths, and ``sql:``."""
    found: list[Option] = []
    for option in options_of(Pipeline):
        if option.key == "full":
            option = replace(
                option,
                doc=f"{option.doc} With key paths as ``upstreams`` and no ``transform``, "
                "it declares the pipeline.",
            )
        found.append(option)
    found.append(
        file_only(
            "sql",
            Kind.TEXT,
            "One Spark SQL query over the upstreams, the target from scratch, with "
            "``upstreams`` mapped to key paths (as "
            ":func:`~watermark_dagster.config.pipeline.sql_pipeline`): the incremental form "
            "is derived.",
            shape="text (one Spark SQL query over the upstreams)",
        )
    )
    return tuple(found)


PIPELINE_OPTIONS = _pipeline_options()
"""Every setting a pipeline entry of a registry file or a component may give."""


WAREHOUSE_OPTIONS = (
    file_only(
        "kind",
        Kind.CHOICE,
        "The warehouse's dialect: ``postgres`` (PostgreSQL; docs/warehouse.md#redshift says "
        "what a Redshift dialect would change).",
        choices=WAREHOUSE_KINDS,
    ),
    *options_of(PostgresTarget),
)
"""Every setting of a warehouse target (a pipeline's ``target: {kind: postgres, ...}``)."""
