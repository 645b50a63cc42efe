"""An upstream's table at a pinned version, with delta-rs (no JVM), and the errors of a
range that cannot be read any more (its table or its commits are gone)."""

from collections.abc import Sequence
from functools import cache

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from watermark_dagster.config.upstream import Upstream
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.errors import UpstreamRecreatedError, UpstreamUnreadableError, reset_command


def reset_fix(upstream: str) -> str:
    """The recovery of a range that cannot be read any more."""
    return (
        f"run `{reset_command(upstream)}`: the open batch is abandoned and every pipeline "
        f"reading '{upstream}' reloads it from a snapshot."
    )


def _gone_fix(upstream: str) -> str:
    return f"restore the table, or run `{reset_command(upstream)}` once it exists again."


def missing_commits_error(
    upstream: Upstream, rng: VersionRange, missing: Sequence[int], *, planned: bool = True
) -> UpstreamUnreadableError:
    """The error of a range whose commits ``missing`` are gone from the log."""
    whose = "the batch's range" if planned else "the range that would be planned,"
    return UpstreamUnreadableError(
        f"Upstream '{upstream.name}': commits {missing[0]}..{missing[-1]} of {whose} {rng} "
        "are no longer in the Delta log (log cleanup removed them after "
        "delta.logRetentionDuration), so the range cannot be read.",
        upstream=upstream.name,
        versions=f"range={rng}, missing={missing[0]}..{missing[-1]}",
        fix=reset_fix(upstream.name),
    )


@cache
def _load_cached(path: str, version: int, options: tuple[tuple[str, str], ...]) -> DeltaTable:
    return DeltaTable(path, version=version, storage_options=dict(options) or None)


def table_at(upstream: Upstream, version: int) -> DeltaTable:
    """The upstream as of ``version`` with delta-rs (cached: versions never change)."""
    options = tuple(sorted((upstream.storage_options or {}).items()))
    try:
        return _load_cached(upstream.path, version, options)
    except TableNotFoundError as e:
        raise UpstreamRecreatedError(
            f"Upstream '{upstream.name}' at {upstream.path!r} is no longer a Delta table "
            f"(needed at version {version}).",
            upstream=upstream.name,
            versions=f"version={version}",
            fix=_gone_fix(upstream.name),
        ) from e
    except (DeltaError, OSError) as e:
        raise UpstreamUnreadableError(
            f"Upstream '{upstream.name}': version {version} cannot be loaded ({e}); the log "
            "versions it needs were cleaned up, or the table was recreated with fewer versions.",
            upstream=upstream.name,
            versions=f"version={version}",
            fix=reset_fix(upstream.name),
        ) from e


def latest_table(upstream: Upstream) -> DeltaTable:
    """The upstream's latest version with delta-rs (not cached)."""
    try:
        return DeltaTable(
            upstream.path, storage_options=dict(upstream.storage_options or {}) or None
        )
    except (TableNotFoundError, DeltaError, OSError) as e:
        raise UpstreamRecreatedError(
            f"Upstream '{upstream.name}' at {upstream.path!r} cannot be loaded ({e}).",
            upstream=upstream.name,
            fix=_gone_fix(upstream.name),
        ) from e


def partition_columns(upstream: Upstream, version: int) -> tuple[str, ...]:
    """The table's partition columns as of ``version``."""
    return tuple(table_at(upstream, version).metadata().partition_columns)


def configuration(upstream: Upstream, version: int) -> dict[str, str]:
    """The table properties as of ``version``, keys lower-cased."""
    config = table_at(upstream, version).metadata().configuration or {}
    return {k.lower(): str(v) for k, v in config.items()}
