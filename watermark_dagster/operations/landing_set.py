"""``watermark set -t LANDING --timestamp T``: the files modified at or before T marked
applied, so that only later files load.

The files must be in the file log first, so the command makes the log current as any look
does (its settled files logged, numbered in modification-time order); a dry run computes
the same numbering without writing it. A file not logged yet because it is still settling
and modified at or before T is refused: logged later, it would be numbered after the
files marked applied and would load. T then maps to the number N that splits the log
(:func:`~watermark_dagster.core.landing_split.split_at`: refused, naming both files, when
the numbering is not split by T), and N is set as any ``--version N`` is (the same
preview, confirmation, open-batch refusal, ``--force`` and history).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from watermark_dagster.core.landing_split import at_ns, split_at
from watermark_dagster.errors import UsageError
from watermark_dagster.operations.manual import TimestampResolution

if TYPE_CHECKING:
    from watermark_dagster.config.registry import Registry
    from watermark_dagster.observe.landing_log import LoggedFile

SHOWN = 5
"""How many files each side lists by name (the ones nearest T); the rest are counted."""


@dataclass(frozen=True)
class FilesAtTime(TimestampResolution):
    """How a ``--timestamp`` became a file number: the files on each side of it, and how
    many settled files the look logged (or, in a dry run, would log) first."""

    applied: tuple["LoggedFile", ...] = ()
    to_load: tuple["LoggedFile", ...] = ()
    logged: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The resolution as recorded in history: counts and the files at the boundary,
        not the lists (which may hold thousands of files)."""
        last = self.applied[-1] if self.applied else None
        first = self.to_load[0] if self.to_load else None
        return {
            "timestamp": self.timestamp,
            "resolved_time": self.resolved_time,
            "applied": len(self.applied),
            "to_load": len(self.to_load),
            "last_applied": last.path if last else None,
            "last_applied_modified": last.mtime.isoformat() if last else None,
            "first_to_load": first.path if first else None,
            "first_to_load_modified": first.mtime.isoformat() if first else None,
            "logged_first": self.logged,
        }

    def sides(self) -> dict[str, dict[str, Any]]:
        """Each side's count, numbers and the files it names (``--json``)."""

        def side(files: Sequence["LoggedFile"], shown: Sequence["LoggedFile"]) -> dict[str, Any]:
            return {
                "count": len(files),
                "numbers": [files[0].ordinal, files[-1].ordinal] if files else None,
                "shown": [
                    {"number": f.ordinal, "file": f.path, "mtime": f.mtime.isoformat()}
                    for f in shown
                ],
            }

        return {
            "applied": side(self.applied, self.applied[-SHOWN:]),
            "to_load": side(self.to_load, self.to_load[:SHOWN]),
        }

    def summary(self) -> str:
        """One line for the applied change: what counts as applied, what still loads."""
        last = self.applied[-1]
        return (
            f"  files 1..{last.ordinal} count as applied (the last, {last.path!r}, modified "
            f"{last.mtime.isoformat()}); {len(self.to_load)} logged file"
            f"{'s' if len(self.to_load) != 1 else ''} still to load"
        )

    def lines(self) -> list[str]:
        """The resolution and both sides, for the preview and the confirmation."""
        n = len(self.applied)
        out = [
            f"  --timestamp {self.timestamp!r} is {self.resolved_time}: the files modified at "
            f"or before it count as applied (file {n} is the last), later files load"
        ]
        if self.logged:
            verb = "would log" if self.dry_run else "logged"
            out.append(
                f"  {verb} {self.logged} settled file{'s' if self.logged != 1 else ''} first, "
                "as any look does"
            )
        out.append("  " + _side("applied", self.applied, newest_first=False))
        out.append("  " + _side("still to load", self.to_load, newest_first=True))
        return out


def _side(label: str, files: Sequence["LoggedFile"], *, newest_first: bool) -> str:
    """``label (K files, a..b): names``: the files nearest T by name, the rest counted."""
    count = len(files)
    if not files:
        return f"{label} (0 files): none"
    plural = "s" if count != 1 else ""
    head = f"{label} ({count} file{plural}, {files[0].ordinal}..{files[-1].ordinal})"
    if newest_first:  # the files just after T, then how many later ones
        shown = ", ".join(f.path for f in files[:SHOWN])
        rest = f", and {count - SHOWN} later" if count > SHOWN else ""
        return f"{head}: {shown}{rest}"
    shown = ", ".join(f.path for f in files[-SHOWN:])
    rest = f"{count - SHOWN} earlier, then " if count > SHOWN else ""
    return f"{head}: {rest}{shown}"


def files_at_time(
    registry: "Registry",
    name: str,
    when: datetime,
    *,
    text: str,
    now: datetime,
    dry_run: bool,
    floor: int = 0,
) -> tuple[int, FilesAtTime]:
    """The file number ``when`` means for landing upstream ``name`` (``text``: as typed),
    after logging its settled files (``dry_run``: numbered as they would be, nothing
    written; ``floor``: the highest file number the control root committed or pinned,
    which the log must hold).

    Raises:
        UsageError: ``when`` is in the future; a file modified by then is still settling;
            no file was modified by then; the log's numbering is not split by ``when``.
        LandingFileChangedError: a logged file changed or moved (as a look refuses it).
        LandingLogBehindError: the log holds fewer files than ``floor``.
    """
    from watermark_dagster.config.landing import LandingUpstream
    from watermark_dagster.observe.landing import look_at_folder
    from watermark_dagster.observe.landing_log import (
        FileLog,
        LoggedFile,
        LogState,
        refuse_log_behind,
    )

    if when > now:
        raise UsageError(
            f"--timestamp {text!r} ({when.isoformat()}) is in the future (a time without a "
            "zone is UTC): files landing until then would be numbered after the ones marked "
            "applied, and load. Give a past time, or `--version latest` to skip every file "
            "logged so far."
        )
    upstream = registry.upstreams[name]
    assert isinstance(upstream, LandingUpstream)
    log = FileLog(upstream)
    state = log.state(create=False) or LogState("", 0)
    refuse_log_behind(upstream, log, state, floor)
    look = look_at_folder(upstream, state)
    new, settling = look.new, look.settling
    limit = at_ns(when)
    early = sorted((f for f in settling if f.mtime_ns <= limit), key=lambda f: f.mtime_ns)
    if early:
        f = early[0]
        raise UsageError(
            f"upstream {name!r}: {f.path!r} (modified "
            f"{LoggedFile(0, f.path, f.size, f.mtime_ns).mtime.isoformat()}, at or before "
            f"--timestamp {text!r}) is still settling (settle_seconds="
            f"{upstream.settle_seconds:g}), so it is not in the file log yet"
            + (f", nor {len(early) - 1} more" if len(early) > 1 else "")
            + ": logged later, it would be numbered after the files marked applied and "
            "would load. Nothing was changed. Run the command again once it settled, or "
            "give an earlier time."
        )
    if new and not dry_run:
        files = list(log.register(new, floor=floor).by_path.values())
    else:
        files = [
            *state.by_path.values(),
            *(
                LoggedFile(state.latest + 1 + i, f.path, f.size, f.mtime_ns)
                for i, f in enumerate(new)
            ),
        ]
    split = split_at(name, files, when, text=text)
    if split.version == 0:
        first = min(files, key=lambda f: (f.mtime_ns, f.ordinal), default=None)
        where = (
            f"the earliest modified is {first.path!r} (file {first.ordinal}, modified "
            f"{first.mtime.isoformat()})"
            if first is not None
            else f"no file has landed in {upstream.path} yet"
        )
        raise UsageError(
            f"--timestamp {text!r} ({when.isoformat()}) is before every file of upstream "
            f"{name!r} ({where}): there is no file to mark applied; nothing was changed. "
            "With nothing committed yet every file loads without a set; to load every file "
            f"again from the start, use `watermark reset -t {name}`."
        )
    return split.version, FilesAtTime(
        timestamp=text,
        resolved_time=when.isoformat(),
        version_committed_at=split.applied[-1].mtime.isoformat(),
        applied=split.applied,
        to_load=split.to_load,
        logged=len(new),
        dry_run=dry_run,
    )
