"""The commits of an APPEND_ONLY range, classified from the Delta log without a JVM:
the files they appended, the commits that changed rows (which an append-only read cannot
express), and compactions. :mod:`watermark_dagster.read.appended` reads the files.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from watermark_dagster.config.upstream import Upstream
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.errors import UpstreamDataChangedError, reset_command
from watermark_dagster.observe.log import DeltaLog
from watermark_dagster.read.tables import missing_commits_error


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
    log = DeltaLog(upstream.path, upstream.storage_options)
    for version in range(rng.start, rng.end + 1):
        actions = log.actions(version)
        if actions is None:  # log cleanup removed it (found here on an object store)
            raise missing_commits_error(upstream, rng, [version])
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
            f"(delta.enableChangeDataFeed = true) and run `{reset_command(upstream.name)}`."
        ),
    )


def absolute_file(upstream: Upstream, relative: str) -> str:
    """The location of a file named in an ``add`` action (which is URL-encoded)."""
    if "://" in relative or relative.startswith("/"):
        return unquote(relative)
    return f"{upstream.path.rstrip('/')}/{unquote(relative)}"
