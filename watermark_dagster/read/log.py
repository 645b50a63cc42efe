"""Reading an upstream's Delta log directly: commit actions, appended files, schema checks.

No JVM: these checks run before a pipeline reads anything, so a range that can no longer
be read, or that does not hold what its read mode assumes, fails loudly before Spark
starts reading and before anything is written (I6).
"""

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import unquote

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from watermark_dagster.config.upstream import SchemaChanges, Upstream
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.errors import (
    UpstreamDataChangedError,
    UpstreamRecreatedError,
    UpstreamSchemaChangedError,
    UpstreamUnreadableError,
    recreated_error,
    reset_command,
)


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def reset_fix(upstream: str) -> str:
    """The recovery command for a range that cannot be read any more."""
    return (
        f"run `{reset_command(upstream)}`: the open batch is abandoned and every pipeline "
        f"reading '{upstream}' reloads it from a snapshot."
    )


def _open_log_file(upstream: Upstream, version: int) -> bytes | None:
    name = f"_delta_log/{version:020d}.json"
    if _is_local(upstream.path):
        try:
            with open(os.path.join(_local(upstream.path), name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
    from pyarrow import fs as pafs

    filesystem, root = pafs.FileSystem.from_uri(upstream.path.rstrip("/"))
    try:
        with filesystem.open_input_stream(f"{root}/{name}") as f:
            return f.read()
    except FileNotFoundError:
        return None


def commit_actions(upstream: Upstream, version: int) -> list[dict[str, Any]]:
    """The actions of one commit, from ``_delta_log/<version>.json``.

    Raises:
        UpstreamUnreadableError: the commit file is gone (log cleanup removed it).
    """
    raw = _open_log_file(upstream, version)
    if raw is None:
        raise UpstreamUnreadableError(
            f"Upstream '{upstream.name}': commit {version} is no longer in its Delta log (log "
            "cleanup removed it after delta.logRetentionDuration), so the batch cannot read "
            "which files that commit changed.",
            upstream=upstream.name,
            versions=f"missing commit {version}",
            fix=reset_fix(upstream.name),
        )
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]


def iter_commits(
    upstream: Upstream, rng: VersionRange
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """``(version, actions)`` for every commit of the range, oldest first."""
    for version in range(rng.start, rng.end + 1):
        yield version, commit_actions(upstream, version)


def missing_commits(upstream: Upstream, rng: VersionRange) -> list[int]:
    """The versions of ``rng`` whose commit file is no longer in the Delta log (log cleanup
    removed them), oldest first. One listing of ``_delta_log`` for a local table; one
    lookup per version of the range on an object store."""
    if _is_local(upstream.path):
        try:
            names = set(os.listdir(os.path.join(_local(upstream.path), "_delta_log")))
        except FileNotFoundError:
            names = set()
        return [v for v in range(rng.start, rng.end + 1) if f"{v:020d}.json" not in names]
    from pyarrow import fs as pafs

    filesystem, root = pafs.FileSystem.from_uri(upstream.path.rstrip("/"))
    infos = filesystem.get_file_info(
        [f"{root}/_delta_log/{v:020d}.json" for v in range(rng.start, rng.end + 1)]
    )
    return [rng.start + i for i, info in enumerate(infos) if info.type == pafs.FileType.NotFound]


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


def require_commits(upstream: Upstream, rng: VersionRange) -> None:
    """Fail loudly when a commit file of the range is gone (cheap: one listing locally)."""
    if not _is_local(upstream.path):
        return
    missing = missing_commits(upstream, rng)
    if missing:
        raise missing_commits_error(upstream, rng, missing)


@dataclass(frozen=True)
class AddedFile:
    """A data file that a commit of the range added."""

    path: str
    version: int
    partition_values: Mapping[str, str | None]
    size: int


@dataclass(frozen=True)
class AppendScan:
    """What the commits of a range did, as an APPEND_ONLY read needs it.

    Attributes:
        files: files added with ``dataChange = true`` (OPTIMIZE's rewrites excluded).
        data_changes: ``(version, operation)`` of commits that removed data (update,
            delete, overwrite, merge): an append-only read cannot express them.
        compactions: versions whose commits only rearranged files (``dataChange = false``).
    """

    files: tuple[AddedFile, ...]
    data_changes: tuple[tuple[int, str], ...]
    compactions: tuple[int, ...]


def scan_appends(upstream: Upstream, rng: VersionRange) -> AppendScan:
    """Classify every commit of ``rng``: appended files, data-changing removes, compactions."""
    files: list[AddedFile] = []
    changes: list[tuple[int, str]] = []
    compactions: list[int] = []
    for version, actions in iter_commits(upstream, rng):
        operation = next(
            (a["commitInfo"].get("operation", "?") for a in actions if "commitInfo" in a), "?"
        )
        removed = [a["remove"] for a in actions if "remove" in a]
        added = [a["add"] for a in actions if "add" in a]
        cdc = [a for a in actions if "cdc" in a]
        if any(r.get("dataChange", True) for r in removed) or cdc:
            changes.append((version, operation))
            continue
        rearranged = [a for a in added if not a.get("dataChange", True)]
        if rearranged or (removed and not any(a.get("dataChange", True) for a in added)):
            compactions.append(version)
        for a in added:
            if a.get("dataChange", True):
                files.append(
                    AddedFile(
                        path=a["path"],
                        version=version,
                        partition_values=dict(a.get("partitionValues") or {}),
                        size=int(a.get("size") or 0),
                    )
                )
    return AppendScan(tuple(files), tuple(changes), tuple(compactions))


def data_changed_error(upstream: Upstream, rng: VersionRange, scan: AppendScan) -> Exception:
    """The error of an APPEND_ONLY range that updates or deletes rows."""
    listed = ", ".join(f"v{v} {op}" for v, op in scan.data_changes[:5])
    return UpstreamDataChangedError(
        f"Upstream '{upstream.name}' has no change data feed and is read append-only, but "
        f"commit(s) {listed} in the range {rng} update or delete rows; reading only the "
        "appended files would miss those changes.",
        upstream=upstream.name,
        versions=f"range={rng}, data-changing commits={[v for v, _ in scan.data_changes]}",
        fix=(
            f"either set on_data_change='snapshot' on upstream '{upstream.name}' (such ranges "
            "are then reloaded from a snapshot), or enable the change data feed "
            "(delta.enableChangeDataFeed = true) and run "
            f"`watermark reset -t {upstream.name} --force`."
        ),
    )


def absolute_file(upstream: Upstream, relative: str) -> str:
    """The location of a file named in an ``add`` action (which is URL-encoded)."""
    if "://" in relative or relative.startswith("/"):
        return unquote(relative)
    return f"{upstream.path.rstrip('/')}/{unquote(relative)}"


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
            fix=f"restore the table, or run `{reset_command(upstream.name)}` once it exists again.",
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
            fix=f"restore the table, or run `{reset_command(upstream.name)}` once it exists again.",
        ) from e


def check_identity(upstream: Upstream, rng: VersionRange, planned_table_id: str | None) -> None:
    """Fail when the table was dropped and recreated since the batch was planned.

    Raises:
        UpstreamRecreatedError: its id changed, or it has fewer versions than the range.
    """
    latest = latest_table(upstream)
    unreadable = f"The batch cannot read the range {rng} it pinned; nothing was written."
    if latest.version() < rng.end:
        raise recreated_error(
            upstream.name,
            f"it is at version {latest.version()}, below the end of the batch's range {rng}",
            unreadable,
            versions=f"range={rng}, latest={latest.version()}",
        )
    table_id = str(latest.metadata().id)
    if planned_table_id and table_id != planned_table_id:
        raise recreated_error(
            upstream.name,
            f"its table id is {table_id}, not {planned_table_id} as when the batch was planned",
            unreadable,
            versions=f"range={rng}",
        )


def _fields(dt: DeltaTable) -> dict[str, tuple[str, bool]]:
    schema = json.loads(dt.schema().to_json())
    return {
        f["name"]: (json.dumps(f["type"], sort_keys=True), bool(f.get("nullable", True)))
        for f in schema["fields"]
    }


def schema_problems(
    before: Mapping[str, tuple[str, bool]],
    after: Mapping[str, tuple[str, bool]],
    policy: SchemaChanges,
) -> list[str]:
    """What makes ``after`` incompatible with ``before`` (empty: compatible).

    Additive nullable columns pass under ``additive``; anything else is listed.
    """
    problems: list[str] = []
    for name, (dtype, _) in before.items():
        if name not in after:
            problems.append(f"column {name!r} was dropped or renamed")
        elif after[name][0] != dtype:
            problems.append(f"column {name!r} changed type from {dtype} to {after[name][0]}")
    for name, (_, nullable) in after.items():
        if name in before:
            continue
        if policy is SchemaChanges.STRICT:
            problems.append(f"column {name!r} was added")
        elif not nullable:
            problems.append(f"column {name!r} was added as NOT NULL")
    return problems


def check_schema(upstream: Upstream, rng: VersionRange) -> None:
    """Fail when the schema changed incompatibly between the version before the range and
    its end (see :func:`schema_problems`).

    Raises:
        UpstreamSchemaChangedError: a column was dropped, renamed or retyped.
    """
    if rng.start == 0:
        return
    before = _fields(table_at(upstream, rng.start - 1))
    after = _fields(table_at(upstream, rng.end))
    problems = schema_problems(before, after, SchemaChanges(upstream.schema_changes))
    if problems:
        raise UpstreamSchemaChangedError(
            f"Upstream '{upstream.name}': the schema changed incompatibly inside the batch's "
            f"range {rng}: {'; '.join(problems)}.",
            upstream=upstream.name,
            versions=f"range={rng}",
            fix=(
                "adapt the pipelines reading it to the new schema, then run "
                f"`watermark reset -t {upstream.name} --force` to reload from a snapshot."
            ),
        )


def partition_columns(upstream: Upstream, version: int) -> Sequence[str]:
    """The table's partition columns as of ``version``."""
    return tuple(table_at(upstream, version).metadata().partition_columns)


def configuration(upstream: Upstream, version: int) -> dict[str, str]:
    """The table properties as of ``version``, keys lower-cased."""
    config = table_at(upstream, version).metadata().configuration or {}
    return {k.lower(): str(v) for k, v in config.items()}
