"""A database upstream's columns, compared batch to batch: source schema changes are loud.

Each look records the table's columns as the database's catalog reports them (name, full
type, nullability: :func:`~watermark_dagster.observe.database_state.look_at`) as the
upstream's schema fingerprint in the batch it plans. Before a batch reads the table, its
columns now are compared with those the batch that committed the upstream's position
recorded (the coordinator's look blocks the upstream the same way, so no batch is
planned on columns that changed incompatibly): a new column passes (the extraction's
target gains it); a column dropped, renamed or retyped fails the batch before anything is
read or written, naming the column and the fix, as a Delta upstream's incompatible schema
change does (I6). A merge would otherwise keep the old column, NULL from then on, beside
the new one.
"""

from collections.abc import Callable, Mapping

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.errors import UpstreamSchemaChangedError, reset_command
from watermark_dagster.observe.database_state import columns_of, fingerprint_columns


def column_problems(
    before: Mapping[str, tuple[str, bool]], now: Mapping[str, tuple[str, bool]]
) -> list[str]:
    """What in ``now`` no batch may merge over ``before`` (empty: compatible): each column
    dropped or renamed, or of another type. Added columns and nullability pass."""
    problems: list[str] = []
    added = [n for n in now if n not in before]
    for name, (dtype, _) in before.items():
        if name not in now:
            maybe = f" (renamed to {added[0]!r}?)" if len(added) == 1 else ""
            problems.append(f"column {name!r} was dropped or renamed{maybe}")
        elif now[name][0] != dtype:
            problems.append(f"column {name!r} changed type from {dtype} to {now[name][0]}")
    return problems


def check_batch_columns(
    upstreams: Mapping[str, object], committed: Callable[[str], str | None]
) -> None:
    """:func:`check_source_columns` for each database upstream among ``upstreams`` (name ->
    upstream), against ``committed(name)``: the fingerprint of the batch that committed its
    position.

    Raises:
        UpstreamSchemaChangedError: as :func:`check_source_columns`.
    """
    for name, upstream in upstreams.items():
        if isinstance(upstream, DatabaseUpstream):
            check_source_columns(upstream, committed(name))


def columns_changed(
    upstream: DatabaseUpstream, committed: str | None, now: str | None
) -> UpstreamSchemaChangedError | None:
    """The error of columns ``now`` (a look's fingerprint) that changed incompatibly since
    ``committed`` (the fingerprint of the batch that committed the upstream's position), or
    None: compatible, or either not known."""
    before = fingerprint_columns(committed)
    after = fingerprint_columns(now)
    if not before or not after:
        return None
    problems = column_problems(before, after)
    return _changed(upstream, problems) if problems else None


def _changed(upstream: DatabaseUpstream, problems: list[str]) -> UpstreamSchemaChangedError:
    return UpstreamSchemaChangedError(
        f"Upstream '{upstream.name}': the columns of {upstream.source_table} changed "
        f"incompatibly since its committed batch: {'; '.join(problems)}. Nothing was "
        "read or written.",
        upstream=upstream.name,
        fix=(
            "restore the column in the database (then retry: `watermark run --retry`), or "
            "adapt the pipelines reading it and run "
            f"`{reset_command(upstream.name)}` to reload the table as it now is."
        ),
    )


def check_source_columns(upstream: DatabaseUpstream, committed: str | None) -> None:
    """Refuse to read a database upstream whose columns changed incompatibly since the
    batch that committed its position (``committed``: that batch's schema fingerprint; None
    when there is none, or it was recorded before fingerprints were: nothing to compare).

    Raises:
        UpstreamSchemaChangedError: naming each column and the fix; nothing was read.
        UpstreamUnavailableError: the database did not answer the look at its columns.
    """
    before = fingerprint_columns(committed)
    if not before:
        return
    now = {n: (t, nullable) for n, t, nullable in columns_of(upstream)}
    problems = column_problems(before, now)
    if problems:
        raise _changed(upstream, problems)


__all__ = ["check_batch_columns", "check_source_columns", "column_problems", "columns_changed"]
