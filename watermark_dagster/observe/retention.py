"""Warning before VACUUM or log cleanup makes a range unreadable: the retention horizon.

A batch needs an upstream's history from some version on: the start of the range the open
batch pinned, or, with no open batch, the version right after the committed watermark. Delta
keeps that history for a limited time only:

* ``delta.deletedFileRetentionDuration`` (default ``interval 1 week``): VACUUM deletes
  removed data files and change-data files older than this;
* ``delta.logRetentionDuration`` (default ``interval 30 days``): log cleanup deletes commit
  files older than this.

So the needed version stays readable for about ``min(both)`` after it was committed: the
**horizon**. :func:`check_retention` reports where an upstream stands; it fails once the
needed version's age reaches the horizon minus a safety margin, or when its commit file is
already gone. :func:`evaluate_retention` is the decision itself, on plain values. The
needed version is :mod:`~watermark_dagster.observe.needed_version`'s; the two retention
properties are read by :mod:`~watermark_dagster.observe.retention_properties`.

No Dagster here, and no JVM: the table configuration comes from delta-rs, the commit time
from the needed version's commit file (``_delta_log/<version>.json``).
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from watermark_dagster.config.names import quote_table_name
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.config.upstream import Upstream
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.errors import (
    UpstreamUnavailableError,
    missing_table_error,
    reset_command,
)
from watermark_dagster.observe.log import DeltaLog
from watermark_dagster.observe.needed_version import NeededVersion, needed_version
from watermark_dagster.observe.retention_properties import (
    DEFAULT_MARGIN,
    DELETED_FILE_RETENTION,
    LOG_RETENTION,
    margin_for,
    table_retentions,
)


class RetentionState(StrEnum):
    """Where an upstream's needed version stands against the retention horizon."""

    NOTHING_NEEDED = "NOTHING_NEEDED"
    """No version to protect: nothing committed, a cursor upstream, or all caught up."""
    WITHIN_HORIZON = "WITHIN_HORIZON"
    """Readable, with more than the margin left."""
    NEAR_HORIZON = "NEAR_HORIZON"
    """Still readable, but inside the margin: act now."""
    PAST_HORIZON = "PAST_HORIZON"
    """Older than the horizon: the next VACUUM or log cleanup may remove it, or already did."""
    LOG_CLEANED = "LOG_CLEANED"
    """The needed version's commit file is gone: the range cannot be read any more."""


@dataclass(frozen=True)
class RetentionStatus:
    """One upstream's position against its table's retention horizon.

    Attributes:
        upstream: the upstream's name.
        path: the table's location.
        state: the verdict; ``passed`` says whether it is fine.
        message: one paragraph for operators: what, how old, how long left, what to do.
        needed: the needed version and who needs it.
        latest_version: the table's newest version.
        commit_time: when the needed version was committed (None: unknown or not needed).
        now: the moment the ages are measured at.
        deleted_file_retention: the table's ``delta.deletedFileRetentionDuration``.
        log_retention: the table's ``delta.logRetentionDuration``.
        margin: how long before the horizon the check fails.
    """

    upstream: str
    path: str
    state: RetentionState
    message: str
    needed: NeededVersion
    latest_version: int
    commit_time: datetime | None
    now: datetime
    deleted_file_retention: timedelta
    log_retention: timedelta
    margin: timedelta

    @property
    def passed(self) -> bool:
        """True unless the needed version is near or past the horizon, or gone."""
        return self.state in (RetentionState.NOTHING_NEEDED, RetentionState.WITHIN_HORIZON)

    @property
    def horizon(self) -> timedelta:
        """How long the needed version stays readable after its commit: the smaller
        retention (data and change files go with one, commit files with the other)."""
        return min(self.deleted_file_retention, self.log_retention)

    @property
    def age(self) -> timedelta | None:
        """How long ago the needed version was committed."""
        return None if self.commit_time is None else self.now - self.commit_time

    @property
    def time_left(self) -> timedelta | None:
        """Time until the horizon (negative once past it)."""
        age = self.age
        return None if age is None else self.horizon - age

    @property
    def expires_at(self) -> datetime | None:
        """When the needed version reaches the horizon."""
        return None if self.commit_time is None else self.commit_time + self.horizon


def format_duration(td: timedelta) -> str:
    """``7d``, ``1d 18h``, ``2h 5m``, ``2s``, ``500ms``; negative durations get a minus."""
    sign = "-" if td < timedelta() else ""
    td = abs(td)
    if td == timedelta():
        return "0s"
    if td < timedelta(seconds=1):
        return f"{sign}{round(td.total_seconds() * 1000)}ms"
    seconds = int(td.total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{u}" for n, u in ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return sign + " ".join(parts[:2])


def _alter_table(path: str, deleted: timedelta, log: timedelta, age: timedelta) -> str:
    """The ALTER TABLE that keeps comfortably more history: a horizon of at least twice the
    needed version's age and twice the current one, in whole days; the log retention is
    only raised when it would otherwise be the smaller of the two."""
    want = max(min(deleted, log) * 2, age * 2, timedelta(days=1))
    days = f"interval {math.ceil(want / timedelta(days=1))} days"
    props = [f"'{DELETED_FILE_RETENTION}' = '{days}'"]
    if log < want:
        props.append(f"'{LOG_RETENTION}' = '{days}'")
    return f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({', '.join(props)})"


def evaluate_retention(
    *,
    upstream: str,
    path: str,
    needed: NeededVersion,
    latest_version: int,
    commit_time: datetime | None,
    configuration: Mapping[str, str | None],
    now: datetime,
    margin: float | timedelta = DEFAULT_MARGIN,
) -> RetentionStatus:
    """Decide whether an upstream's needed version is safely inside its retention horizon.

    Fails (a state whose ``passed`` is False) when ``now - commit_time >= horizon - margin``,
    or when the needed version is at most the latest but ``commit_time`` is None (its commit
    file is gone). Passes when nothing is needed or the needed version is past the latest.

    Args:
        upstream: the upstream's name (for messages).
        path: the table's location (for messages and the ALTER TABLE hint).
        needed: from :func:`needed_version`.
        latest_version: the table's newest version.
        commit_time: when ``needed.version`` was committed; None when its commit file is
            missing (ignored when nothing is needed).
        configuration: the table's properties.
        now: the moment to measure ages at (timezone-aware).
        margin: a fraction of the horizon, or a fixed duration.

    Raises:
        ConfigurationError: a retention property or the margin cannot be read.
    """
    deleted, log = table_retentions(configuration, upstream=upstream)
    horizon = min(deleted, log)
    margin_td = margin_for(horizon, margin)
    version = needed.version

    def status(state: RetentionState, message: str, when: datetime | None) -> RetentionStatus:
        return RetentionStatus(
            upstream=upstream,
            path=path,
            state=state,
            message=message,
            needed=needed,
            latest_version=latest_version,
            commit_time=when,
            now=now,
            deleted_file_retention=deleted,
            log_retention=log,
            margin=margin_td,
        )

    retentions = (
        f"{DELETED_FILE_RETENTION} = {format_duration(deleted)}, "
        f"{LOG_RETENTION} = {format_duration(log)}"
    )
    if version is None:
        return status(
            RetentionState.NOTHING_NEEDED,
            f"Upstream '{upstream}': no version to protect ({needed.why}).",
            None,
        )
    if version > latest_version:
        return status(
            RetentionState.NOTHING_NEEDED,
            f"Upstream '{upstream}': caught up; version {version}, {needed.why}, does not "
            f"exist yet (latest {latest_version}), so no old version is needed.",
            None,
        )
    skipped = (
        f"version {version}"
        if version == latest_version
        else f"versions {version}..{latest_version}"
    )
    force = " --force" if needed.batch_id else ""
    skip = (
        f"`{reset_command(upstream, force=bool(needed.batch_id))}` (reload it from a snapshot), "
        f"or `watermark set "
        f"-t {upstream} --version {latest_version}{force}` (skip {skipped} knowingly)"
        + (f"; --force because batch {needed.batch_id} is open" if needed.batch_id else "")
    )
    if commit_time is None:
        return status(
            RetentionState.LOG_CLEANED,
            f"Upstream '{upstream}': version {version}, {needed.why}, is no longer in "
            f"the Delta log (its commit file _delta_log/{version:020d}.json is gone: log "
            f"cleanup removed it; {retentions}). The range from version {version} cannot be "
            f"read any more and a batch that needs it will fail. Fix: {skip}; then keep more "
            f"history with {_alter_table(path, deleted, log, timedelta())}.",
            None,
        )
    age = now - commit_time
    left = horizon - age
    facts = (
        f"Upstream '{upstream}': version {version}, {needed.why}, was committed "
        f"{commit_time.isoformat(timespec='seconds')} ({format_duration(age)} ago); the "
        f"retention horizon is {format_duration(horizon)} ({retentions})"
    )
    if age < horizon - margin_td:
        return status(
            RetentionState.WITHIN_HORIZON,
            f"{facts}, so {format_duration(left)} left (the check fails "
            f"{format_duration(margin_td)} before the horizon).",
            commit_time,
        )
    act = (
        f"Fix: run the pending pipelines now (`watermark run`, or let the coordinator sensor "
        f"run them) so the watermark moves past version {version}; or keep history longer "
        f"with {_alter_table(path, deleted, log, age)}; "
        f"or give the range up with {skip}."
    )
    if left <= timedelta():
        return status(
            RetentionState.PAST_HORIZON,
            f"{facts}, which it passed {format_duration(-left)} ago: the next VACUUM or log "
            f"cleanup may remove the files this range needs, or already did. {act}",
            commit_time,
        )
    return status(
        RetentionState.NEAR_HORIZON,
        f"{facts}: only {format_duration(left)} left before VACUUM or log cleanup may remove "
        f"the files this range needs (the check fails {format_duration(margin_td)} before the "
        f"horizon). {act}",
        commit_time,
    )


def commit_time(upstream: Upstream, version: int) -> datetime | None:
    """When ``version`` of an upstream was committed; None when its commit file is gone.

    Reads ``_delta_log/<version>.json`` (local paths and object stores alike): the commit's
    ``inCommitTimestamp`` when the table records one, else its ``timestamp``; a commit
    without commitInfo falls back to the file's modification time, which is what log
    cleanup itself goes by.
    """
    log = DeltaLog(upstream.path, upstream.storage_options)
    actions = log.actions(version)
    if actions is None:
        return None
    for action in actions:
        if "commitInfo" not in action:
            continue
        info = action["commitInfo"] or {}
        millis = info.get("inCommitTimestamp", info.get("timestamp"))
        if isinstance(millis, int):
            return datetime.fromtimestamp(millis / 1000, tz=UTC)
    return log.modified(version)


def check_retention(
    upstream: Upstream,
    *,
    committed: int | None,
    open_input: PlannedInput | None = None,
    batch_id: str | None = None,
    now: datetime | None = None,
    margin: float | timedelta = DEFAULT_MARGIN,
) -> RetentionStatus:
    """Where an upstream stands against its retention horizon (see the module docstring).

    Args:
        upstream: the upstream to check.
        committed: its committed watermark (None: nothing committed).
        open_input: what the open batch pins for it, if a batch is open and reads it.
        batch_id: that batch's id (for messages).
        now: the moment to measure ages at (default: the current time).
        margin: fail this long before the horizon: a fraction of it or a duration.

    Raises:
        UpstreamUnavailableError: the table cannot be loaded, or no catalog table had the
            upstream's name when the code location loaded.
        ConfigurationError: a retention property or the margin cannot be read.

    Example:
        >>> status = check_retention(orders, committed=store.committed_versions()["orders"])
        >>> status.passed, status.message
    """
    needed = needed_version(committed=committed, open_input=open_input, batch_id=batch_id)
    if upstream.table_parts is not None and not upstream.path.strip():
        raise missing_table_error(upstream.name, quote_table_name(upstream.table_parts))
    try:
        dt = DeltaTable(upstream.path, storage_options=resolved_options(upstream.storage_options))
    except TableNotFoundError as e:
        raise UpstreamUnavailableError(
            f"Upstream '{upstream.name}' at {upstream.path!r} is not a readable Delta table "
            f"({str(e).splitlines()[0]}); its retention cannot be checked.",
            upstream=upstream.name,
            fix="check the path in the registry, or create the table.",
        ) from e
    except (DeltaError, OSError) as e:
        raise UpstreamUnavailableError(
            f"Upstream '{upstream.name}' at {upstream.path!r} could not be loaded "
            f"({type(e).__name__}: {e}); its retention cannot be checked.",
            upstream=upstream.name,
            fix="check the path and storage options, then run the check again.",
        ) from e
    latest = dt.version()
    version = needed.version
    when = commit_time(upstream, version) if version is not None and version <= latest else None
    return evaluate_retention(
        upstream=upstream.name,
        path=upstream.path,
        needed=needed,
        latest_version=latest,
        commit_time=when,
        configuration=dt.metadata().configuration or {},
        now=datetime.now(UTC) if now is None else now if now.tzinfo else now.replace(tzinfo=UTC),
        margin=margin,
    )
