"""An upstream's table at a pinned version, with delta-rs (no JVM), and the errors of a
range that cannot be read any more (its table or its commits are gone)."""

import posixpath
from collections.abc import Sequence
from functools import cache
from urllib.parse import unquote, urlsplit

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from watermark_dagster.config.secrets import resolved_options
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


def next_range_fix(upstream: str, retention: str) -> str:
    """The recovery of an upstream whose next range cannot be read, while no batch reads it:
    nothing is open to abandon, so the reset needs no ``--force``."""
    return (
        f"run `{reset_command(upstream, force=False)}`: its watermark is forgotten and every "
        f"pipeline reading '{upstream}' reloads it from a snapshot; to prevent it, keep "
        f"{retention} longer than your batch delay."
    )


def _span(versions: Sequence[int]) -> str:
    """``3``, ``3..5`` (contiguous) or ``3, 5``."""
    if len(versions) == 1:
        return str(versions[0])
    if list(versions) == list(range(versions[0], versions[-1] + 1)):
        return f"{versions[0]}..{versions[-1]}"
    return ", ".join(map(str, versions))


def _whose(rng: VersionRange, planned: bool) -> str:
    if planned:
        return f"the batch's range {rng}"
    return f"its next range {rng} (after its committed watermark {rng.start - 1})"


_NOTHING_PLANNED = " Nothing is planned for it or for the pipelines reading it."


def missing_commits_error(
    upstream: Upstream, rng: VersionRange, missing: Sequence[int], *, planned: bool = True
) -> UpstreamUnreadableError:
    """The error of a range whose commits ``missing`` are gone from the log: a batch's
    (``planned``), or the next range, which is then not planned."""
    return UpstreamUnreadableError(
        f"Upstream '{upstream.name}': commits {_span(missing)} of {_whose(rng, planned)} "
        "are no longer in the Delta log (log cleanup removed them after "
        "delta.logRetentionDuration), so the range cannot be read."
        + ("" if planned else _NOTHING_PLANNED),
        upstream=upstream.name,
        versions=f"range={rng}, missing={_span(missing)}",
        fix=reset_fix(upstream.name)
        if planned
        else next_range_fix(upstream.name, "delta.logRetentionDuration"),
    )


def gone_files_error(
    upstream: Upstream, rng: VersionRange, versions: Sequence[int], files: Sequence[str]
) -> UpstreamUnreadableError:
    """The error of a next range whose changes are read from files that are gone
    (``files``, of the commits ``versions``): VACUUM removed them. Nothing is planned."""
    more = f" and {len(files) - 1} more" if len(files) > 1 else ""
    return UpstreamUnreadableError(
        f"Upstream '{upstream.name}': the change files of commits {_span(versions)} of "
        f"{_whose(rng, False)} are gone (VACUUM removed them after "
        f"delta.deletedFileRetentionDuration; missing file: {files[0]}{more}), so the range "
        "cannot be read." + _NOTHING_PLANNED,
        upstream=upstream.name,
        versions=f"range={rng}, missing files of={_span(versions)}",
        fix=next_range_fix(upstream.name, "delta.deletedFileRetentionDuration"),
    )


@cache
def _load_cached(path: str, version: int, options: tuple[tuple[str, str], ...]) -> DeltaTable:
    return DeltaTable(path, version=version, storage_options=dict(options) or None)


def table_at(upstream: Upstream, version: int) -> DeltaTable:
    """The upstream as of ``version`` with delta-rs (cached: versions never change)."""
    options = tuple(sorted((resolved_options(upstream.storage_options) or {}).items()))
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
        return DeltaTable(upstream.path, storage_options=resolved_options(upstream.storage_options))
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


def comparable_location(location: str) -> str:
    """``location`` as a comparable URI: local paths and ``file:`` URIs as ``file:/path``."""
    parsed = urlsplit(location)
    if parsed.scheme in ("", "file"):
        return "file:" + posixpath.normpath(unquote(parsed.path))
    return f"{parsed.scheme}://{parsed.netloc}{posixpath.normpath(unquote(parsed.path))}"
