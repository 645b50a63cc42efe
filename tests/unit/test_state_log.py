"""Which of a maintained state's labels are believed, over state logs written by hand.

The commits are the dictionaries Delta's history gives (``userMetadata``, ``operation``,
``readVersion``); the Spark tests in ``tests/spark/test_maintain.py`` make the same logs
by racing real runs. Here every shape of log is spelled out: the three-run race that
doubles a delta and adds on top of it, commits that keep the rows (``OPTIMIZE``,
``VACUUM``) anywhere in the chain, rebuilds that lost a race, another definition's or an
older form's labels, and a chain longer than the history read.
"""

from typing import Any

import pytest

from watermark_dagster.read.state_log import (
    RECENT,
    StateLabel,
    added_label,
    believed_in,
    label_prefix,
    parsed,
    rebuilt_label,
)

PREFIX = label_prefix("f00d", "table-1")


def rebuilt(end: int, read: int | None) -> dict[str, Any]:
    commit: dict[str, Any] = {"operation": "WRITE", "userMetadata": rebuilt_label(PREFIX, end, "r")}
    if read is not None:
        commit["readVersion"] = read
    return commit


def added(end: int, base: int, at: int, read: int) -> dict[str, Any]:
    label = added_label(PREFIX, end, base, at, "a")
    return {"operation": "MERGE", "userMetadata": label, "readVersion": read}


def kept(operation: str, read: int) -> dict[str, Any]:
    return {"operation": operation, "readVersion": read}


def log(*commits: dict[str, Any], first: int = 0) -> dict[int, dict[str, Any]]:
    return {first + i: c for i, c in enumerate(commits)}


def test_labels_round_trip_and_other_forms_are_not_read() -> None:
    assert parsed(rebuilt_label(PREFIX, 7, "ab12"), PREFIX) == StateLabel(7, None, None)
    assert parsed(added_label(PREFIX, 9, 7, 3, "ab12"), PREFIX) == StateLabel(9, 7, 3)
    assert parsed(added_label(PREFIX, 9, 7, 3, "x"), label_prefix("beef", "table-1")) is None
    assert parsed(added_label(PREFIX, 9, 7, 3, "x"), label_prefix("f00d", "table-2")) is None
    # The form before ``at=`` was recorded: not believed, so the state is rebuilt once.
    assert parsed(f"{PREFIX}9 from=7 run=ab12", PREFIX) is None
    assert parsed(f"{PREFIX}nine from=7 at=3 run=ab12", PREFIX) is None


def test_a_chain_of_additions_each_on_the_version_before_is_believed() -> None:
    commits = log(rebuilt(10, None), added(11, 10, 0, 0), added(12, 11, 1, 1))
    assert believed_in(commits, 2, PREFIX) == (12, 2)
    assert believed_in(commits, 1, PREFIX) == (11, 1)


def test_three_runs_racing_neither_the_double_nor_what_was_added_on_it_is_believed() -> None:
    """B and A of one batch believed v5; A committed v6; C of the next batch believed v6;
    B's MERGE read v6 (commit v7, the range's deltas twice), C's read v7 (commit v8).
    Checked one link back, v8 looks made on a version labelled with its base."""
    commits = log(
        rebuilt(10, 4),  # v5
        added(11, 10, at=5, read=5),  # v6: A
        added(11, 10, at=5, read=6),  # v7: B, on A's
        added(12, 11, at=6, read=7),  # v8: C, on B's
        first=5,
    )
    assert believed_in(commits, 6, PREFIX) == (11, 6)
    assert believed_in(commits, 7, PREFIX) is None
    assert believed_in(commits, 8, PREFIX) is None


def test_a_merge_that_read_the_version_it_believed_but_committed_later_is_not_believed() -> None:
    # A's MERGE read v0 as its label said, but another commit landed first (Delta let it
    # through): the rows at v2 are not the rows at v0 plus the deltas.
    commits = log(rebuilt(10, None), added(11, 10, 0, 0), added(11, 10, 0, 0))
    assert believed_in(commits, 2, PREFIX) is None


@pytest.mark.parametrize("operation", ["OPTIMIZE", "VACUUM START", "SET TBLPROPERTIES"])
def test_commits_that_keep_the_rows_sit_anywhere_in_the_chain(operation: str) -> None:
    commits = log(
        rebuilt(10, None),  # v0
        kept(operation, 0),  # v1
        added(11, 10, at=1, read=1),  # v2: the writer believed v0 through v1
        kept("OPTIMIZE", 2),  # v3
        kept("VACUUM START", 3),  # v4
        kept("VACUUM END", 4),  # v5
    )
    # The rows at v5 are v2's: a run reads v5, whose files VACUUM kept.
    assert believed_in(commits, 5, PREFIX) == (11, 5)
    # An addition whose at names the compacted version, not the labelled one, is believed.
    assert believed_in({**commits, 6: added(12, 11, at=5, read=5)}, 6, PREFIX) == (12, 6)
    # One that names the labelled version below them read a newer one: not believed.
    assert believed_in({**commits, 6: added(12, 11, at=2, read=5)}, 6, PREFIX) is None


def test_a_write_that_is_not_a_state_commit_is_never_looked_through() -> None:
    commits = log(rebuilt(10, None), kept("WRITE", 0))
    assert believed_in(commits, 1, PREFIX) is None
    commits = log(rebuilt(10, None), kept("DELETE", 0), added(11, 10, at=1, read=1))
    assert believed_in(commits, 2, PREFIX) is None


def test_a_rebuild_is_believed_only_right_after_the_version_it_read() -> None:
    assert believed_in(log(rebuilt(10, None)), 0, PREFIX) == (10, 0)
    assert believed_in(log(rebuilt(9, None), rebuilt(10, 0)), 1, PREFIX) == (10, 1)
    # An overwrite that read v0 while another run committed v1 may have kept v1's files.
    commits = log(rebuilt(9, None), added(10, 9, at=0, read=0), rebuilt(10, 0))
    assert believed_in(commits, 2, PREFIX) is None


def test_another_definitions_label_and_a_chain_beyond_the_history_are_not_believed() -> None:
    other = label_prefix("beef", "table-1")
    assert believed_in(log(rebuilt(10, None)), 0, other) is None
    # Only the newest RECENT commits are read: the rows below them are unknown.
    commits = log(*(kept("OPTIMIZE", i) for i in range(RECENT)), first=1)
    assert believed_in(commits, RECENT, PREFIX) is None
    assert believed_in({**commits, 0: rebuilt(10, None)}, RECENT, PREFIX) == (10, RECENT)


def test_a_compaction_carrying_a_runs_label_is_looked_through() -> None:
    """Delta's auto-compaction runs inside the MERGE that triggered it and commits under
    the same label; the property set of a range whose changes cancel out is a state commit."""
    merge = added(11, 10, at=0, read=0)
    compaction = {**kept("OPTIMIZE", 1), "userMetadata": merge["userMetadata"]}
    assert believed_in(log(rebuilt(10, None), merge, compaction), 2, PREFIX) == (11, 2)
    empty = {**kept("SET TBLPROPERTIES", 2), "userMetadata": added_label(PREFIX, 12, 11, 2, "e")}
    commits = log(rebuilt(10, None), merge, compaction, empty)
    assert believed_in(commits, 3, PREFIX) == (12, 3)
    # Unlabelled, a property set is a user's: it keeps the rows below it.
    assert believed_in({**commits, 3: kept("SET TBLPROPERTIES", 2)}, 3, PREFIX) == (11, 3)
