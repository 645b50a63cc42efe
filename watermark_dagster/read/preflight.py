"""Checks a pinned range passes before anything is read (I6), without a JVM.

Still the same table (:func:`check_identity`), its commits still in the log
(:func:`require_commits`), its schema still compatible (:func:`check_schema`), and for an
append-only read, no commit that changes rows (:func:`preflight`): a range that cannot be
read as planned fails loudly here, before Spark reads it and before anything is written.
Before planning, :func:`next_range_unreadable` refuses a next range whose commits or change
files are already gone, so it never becomes a batch.
"""

import json
import logging
from collections.abc import Mapping

from deltalake import DeltaTable

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.upstream import DeltaUpstream, OnDataChange, SchemaChanges, Upstream
from watermark_dagster.core.observations import Observation
from watermark_dagster.core.planning import PlannedInput, recreation_found
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.errors import (
    UpstreamSchemaChangedError,
    UpstreamUnreadableError,
    recreated_error,
    reset_command,
)
from watermark_dagster.observe.log import DeltaLog, is_local
from watermark_dagster.read.append_log import AppendScan, data_changed_error, scan_appends
from watermark_dagster.read.tables import (
    gone_files_error,
    latest_table,
    missing_commits_error,
    table_at,
)

log = logging.getLogger("watermark_dagster")


def missing_commits(upstream: Upstream, rng: VersionRange) -> list[int]:
    """The versions of ``rng`` whose commit file is no longer in the Delta log (log cleanup
    removed them), oldest first. One listing of ``_delta_log`` for a local table; one
    lookup per version of the range on an object store."""
    commits = DeltaLog(upstream.path, upstream.storage_options)
    return commits.missing(range(rng.start, rng.end + 1))


def require_commits(upstream: Upstream, rng: VersionRange) -> None:
    """Fail loudly when a commit file of the range is gone (cheap: one listing locally;
    on an object store the read itself finds out)."""
    if not is_local(upstream.path):
        return
    missing = missing_commits(upstream, rng)
    if missing:
        raise missing_commits_error(upstream, rng, missing)


def _gone_commits(upstream: Upstream, obs: Observation, rng: VersionRange) -> list[int]:
    """The commits of ``rng`` gone from the log. Log cleanup removes the oldest commits, so
    the observation's own listing answers for a local table (no I/O here); elsewhere one
    lookup of the range's first commit, and the whole range only when that one is gone."""
    if obs.oldest_version is not None:
        return list(range(rng.start, min(obs.oldest_version - 1, rng.end) + 1))
    if not DeltaLog(upstream.path, upstream.storage_options).missing([rng.start]):
        return []
    return missing_commits(upstream, rng)


def gone_change_files(upstream: Upstream, rng: VersionRange) -> tuple[list[int], list[str]]:
    """The commits of a CDF range whose change files are gone (VACUUM removed them), and
    those files, oldest commit first.

    A commit's changes are read from its ``cdc`` files, or, when it has none, from the files
    it added and removed with ``dataChange`` (Delta's change data feed reads inserts and
    whole-file deletes from those). Reads the range's commit files and looks up each of
    those files once: only for a range about to be planned, never per tick for every
    upstream.
    """
    log = DeltaLog(upstream.path, upstream.storage_options)
    needed: dict[str, int] = {}
    for version in range(rng.start, rng.end + 1):
        actions = log.actions(version) or []
        files = [a["cdc"]["path"] for a in actions if "cdc" in a]
        if not files:
            files = [
                a[kind]["path"]
                for a in actions
                for kind in ("add", "remove")
                if kind in a and a[kind].get("dataChange", True)
            ]
        for path in files:
            needed.setdefault(path, version)
    gone = log.missing_files(list(needed))
    return sorted({needed[path] for path in gone}), gone


def next_range_unreadable(
    upstream: Upstream, obs: Observation, planned: PlannedInput
) -> UpstreamUnreadableError | None:
    """Why the range the coordinator would plan next for ``upstream`` cannot be read, or
    None: its commits are gone from the log, or (CDF) its change files were vacuumed.

    Checked before planning, so such a range is refused like a recreated table (nothing is
    planned for it) instead of becoming a batch that fails and sticks. Cheap: the commits
    come from the observation's listing; change files are looked up for this range only.
    """
    rng = planned.range
    if rng is None or planned.mode not in (ReadMode.CDF, ReadMode.APPEND_ONLY):
        return None
    if isinstance(upstream, LandingUpstream):
        return None  # its files are checked when the batch reads them
    missing = _gone_commits(upstream, obs, rng)
    if missing:
        return missing_commits_error(upstream, rng, missing, planned=False)
    if planned.mode is ReadMode.CDF:
        versions, files = gone_change_files(upstream, rng)
        if files:
            return gone_files_error(upstream, rng, versions, files)
    return None


def check_identity(upstream: Upstream, rng: VersionRange, planned_table_id: str | None) -> None:
    """Fail when the table was dropped and recreated since the batch was planned (see
    :func:`~watermark_dagster.core.planning.recreation_found`).

    Raises:
        UpstreamRecreatedError: its id changed, or it has fewer versions than the range.
    """
    latest = latest_table(upstream)
    version = latest.version()
    found = recreation_found(
        version,
        str(latest.metadata().id),
        floor=rng.end,
        reference=f"the end of the batch's range {rng}",
        expected_table_id=planned_table_id,
    )
    if found is not None:
        raise recreated_error(
            upstream.name,
            found,
            f"The batch cannot read the range {rng} it pinned; nothing was written.",
            versions=f"range={rng}, latest={version}",
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


def check_schema(upstream: DeltaUpstream, rng: VersionRange) -> None:
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
                f"`{reset_command(upstream.name)}` to reload from a snapshot."
            ),
        )


def preflight(
    upstream: Upstream, planned: PlannedInput, *, full_load: bool, table_id: str | None
) -> tuple[ReadMode, AppendScan | None]:
    """Check that a versioned input can be read as planned; return the mode it is read in
    and, for an APPEND_ONLY read, the scan of its commits.

    A full load reads a SNAPSHOT; an append-only range whose commits change rows is read as
    a SNAPSHOT too when the upstream says ``on_data_change="snapshot"``.

    Raises:
        UpstreamRecreatedError, UpstreamUnreadableError, UpstreamSchemaChangedError,
        UpstreamDataChangedError: the range cannot be read as planned (I6).
    """
    if not isinstance(upstream, DeltaUpstream):
        raise TypeError(f"preflight() checks version ranges; {upstream.name!r} is read by cursor")
    mode, rng = planned.mode, planned.range
    if rng is not None:
        check_identity(upstream, rng, table_id)
    if full_load:
        return ReadMode.SNAPSHOT, None
    if mode not in (ReadMode.CDF, ReadMode.APPEND_ONLY):
        return mode, None
    assert rng is not None
    require_commits(upstream, rng)
    check_schema(upstream, rng)
    if mode is ReadMode.CDF:
        return mode, None
    scan = scan_appends(upstream, rng)
    if not scan.data_changes:
        return mode, scan
    if upstream.on_data_change is not OnDataChange.SNAPSHOT:
        raise data_changed_error(upstream, rng, scan)
    log.warning(
        "upstream=%s range=%s: commits %s change rows; reading a snapshot "
        "(on_data_change='snapshot')",
        upstream.name,
        rng,
        [v for v, _ in scan.data_changes],
    )
    return ReadMode.SNAPSHOT, None
