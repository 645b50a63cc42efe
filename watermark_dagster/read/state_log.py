"""What a maintained aggregate's state table proves it holds, read from its Delta log.

Every commit the ``maintain`` strategy makes to a state is labelled (Delta's
``userMetadata``) with the upstream version the state's rows are the aggregate of::

    watermark-state <definition> <table id> v=<end> rebuilt run=<id>
    watermark-state <definition> <table id> v=<end> from=<base> at=<state version> run=<id>

``rebuilt``: the rows were written from the upstream's snapshot at ``end``. ``from``: the
range's deltas were added to the state of version ``at``, whose rows reflect ``base``.
``run`` is unique to the run that made the commit, so a run finds its own.

A label is **believed** only when its commit shows it was made on what it names. Delta
records each commit's ``readVersion`` (the table version its transaction read):

* an added commit must have read exactly ``at`` and be the version right after it, and
  the rows at ``at`` must reflect ``base``;
* a rebuild must be the version right after the one it read (an overwrite that lost a race
  with another run's commit could keep that run's files).

``at`` is the newest state version when the writer read and believed the label below it,
so each believed commit was checked against its own base by its writer, and the newest by
its reader: the whole chain back to the last rebuild is checked, one link per writer. A
MERGE that read a newer version than the label its run believed (another run committed
in between, which Delta does not see as a conflict when the MERGE's transaction starts
after that commit) is not believed, nor is anything added on top of it.

Commits that keep a table's rows (``OPTIMIZE``, auto-compaction, ``VACUUM``, a table
property) may sit anywhere in the chain: the rows at such a version are those of the
version before it. A compaction is never taken for a state commit, even under a state
label (auto-compaction runs inside the MERGE that triggered it and inherits its label). A
run reads the state at the newest version (whose files ``VACUUM`` kept), never at the
labelled one below it.

Versions come from :func:`~watermark_dagster.observe.log.commit_history`: delta-rs alone
would number the history of a table loaded before another run's commit one short.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deltalake import DeltaTable as RsDeltaTable

from watermark_dagster.observe.log import commit_history

STATE_LABEL = "watermark-state "
# The state's newest commits read for its labels: the chain's links and the commits that
# keep rows around them. Beyond it, the state is not believed (rebuilt).
RECENT = 20
# Operations that leave a table's rows as they were. A compaction is never a state commit,
# whatever its label: Delta's auto-compaction runs inside the MERGE that triggered it and
# inherits the session's label. A table property set is one when labelled (the commit a
# range whose changes cancel out makes), else a user's.
COMPACTIONS = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END"})
KEEPS_ROWS = COMPACTIONS | {"SET TBLPROPERTIES", "UNSET TBLPROPERTIES"}


@dataclass(frozen=True)
class StateLabel:
    """One state commit's label: the rows are the aggregate of the upstream at ``end``;
    ``base`` and ``at`` (None for a rebuild): what the deltas were added to."""

    end: int
    base: int | None
    at: int | None


def label_prefix(definition: str, table_id: str | None) -> str:
    """The start of every label of one definition's state of one upstream table."""
    return f"{STATE_LABEL}{definition} {table_id} v="


def rebuilt_label(prefix: str, end: int, run: str) -> str:
    """The label of ``run``'s rebuild of the state from the snapshot at ``end``."""
    return f"{prefix}{end} rebuilt run={run}"


def added_label(prefix: str, end: int, base: int, at: int, run: str) -> str:
    """The label of ``run``'s deltas of ``(base, end]`` added to the state version ``at``."""
    return f"{prefix}{end} from={base} at={at} run={run}"


def parsed(label: str, prefix: str) -> StateLabel | None:
    """``label`` read under ``prefix``; None for another definition, table or form."""
    if not label.startswith(prefix):
        return None
    words = label[len(prefix) :].split()
    if not words or not words[-1].startswith("run="):
        return None
    try:
        if len(words) == 3 and words[1] == "rebuilt":
            return StateLabel(int(words[0]), None, None)
        if len(words) == 4 and words[1].startswith("from=") and words[2].startswith("at="):
            return StateLabel(int(words[0]), int(words[1].removeprefix("from=")), int(words[2][3:]))
    except ValueError:
        return None
    return None


def _label_of(commit: Mapping[str, Any] | None) -> str:
    return str((commit or {}).get("userMetadata") or "")


def _rows_at(
    commits: Mapping[int, Mapping[str, Any]], version: int, prefix: str
) -> tuple[int, StateLabel] | None:
    """The state commit whose rows the table has at ``version`` (through commits that keep
    rows), and its label; None when that is not a state commit of ``prefix`` or is beyond
    the history read."""
    while version in commits:
        commit = commits[version]
        label = _label_of(commit)
        if label.startswith(STATE_LABEL) and commit.get("operation") not in COMPACTIONS:
            found = parsed(label, prefix)
            return None if found is None else (version, found)
        if commit.get("operation") not in KEEPS_ROWS:
            return None
        version -= 1
    return None


def made_on(
    commits: Mapping[int, Mapping[str, Any]], version: int, label: StateLabel, prefix: str
) -> bool:
    """Whether the commit at ``version``, labelled ``label``, was made on what it names."""
    read = commits[version].get("readVersion")
    if label.at is None:  # a rebuild: the table's first version, or right after its read
        return (version == 0 and read is None) or read == version - 1
    if read != label.at or version != label.at + 1:
        return False
    under = _rows_at(commits, label.at, prefix)
    return under is not None and under[1].end == label.base


def history(table: RsDeltaTable) -> dict[int, Mapping[str, Any]]:
    """The state's newest commits by version (the table brought up to date)."""
    commits = commit_history(table, RECENT)
    return {c["version"]: c for c in commits if isinstance(c.get("version"), int)}


def believed(table: RsDeltaTable | None, prefix: str) -> tuple[int, int] | None:
    """``(upstream version the state reflects, the state table's newest version)``, when
    the rows at its newest version are those of a believed commit of ``prefix``; else
    None (no state, another definition's, or one that must be rebuilt)."""
    if table is None:
        return None
    commits = history(table)
    return believed_in(commits, table.version(), prefix)


def believed_in(
    commits: Mapping[int, Mapping[str, Any]], top: int, prefix: str
) -> tuple[int, int] | None:
    """:func:`believed` over a state's newest ``commits`` by version, ``top`` the newest."""
    found = _rows_at(commits, top, prefix)
    if found is None or not made_on(commits, found[0], found[1], prefix):
        return None
    return found[1].end, top


def own_commit(table: RsDeltaTable, label: str, prefix: str) -> int | None:
    """The version of this run's commit labelled ``label`` (it names the run) when it is
    believed; None when it is missing or was not made on what it names."""
    commits = history(table)
    mine = [
        v
        for v, c in commits.items()
        if _label_of(c) == label and c.get("operation") not in COMPACTIONS
    ]
    found = parsed(label, prefix)
    if len(mine) != 1 or found is None or not made_on(commits, mine[0], found, prefix):
        return None
    return mine[0]
