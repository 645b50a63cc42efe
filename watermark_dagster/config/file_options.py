"""The settings as a registry file and a component's ``defs.yaml`` write them, made from
the declarations (:mod:`~watermark_dagster.config.options`).

An upstream entry takes a :class:`~watermark_dagster.config.upstream.DeltaUpstream`'s
settings, or with ``mode: timestamp`` a
:class:`~watermark_dagster.config.upstream.CursorUpstream`'s; a pipeline entry takes a
:class:`~watermark_dagster.config.pipeline.Pipeline`'s, with ``full:`` for its full
transform and ``sql:`` for a query.
"""

from dataclasses import replace

from watermark_dagster.config.options import Kind, Option, file_only, options_of
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream, Upstream, UpstreamMode


def _upstream_options() -> tuple[Option, ...]:
    """The settings of an upstream entry in a file: a Delta upstream's, and with
    ``mode: timestamp`` a cursor upstream's."""
    shared = {o.key for o in options_of(Upstream)}
    by_version = "by version"
    by_cursor = "`mode: timestamp`"
    found: list[Option] = []
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
                doc=f"{option.doc} With ``upstreams`` mapped to key paths and no "
                "``transform``, it declares the pipeline instead (as "
                ":func:`~watermark_dagster.config.pipeline.declared_pipeline`): the "
                "incremental form is derived.",
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
