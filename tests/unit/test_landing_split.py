"""Which file number a time means for a landing upstream (core/landing_split.py), and how
``watermark set --timestamp`` names the files on each side (operations/landing_set.py)."""

from datetime import UTC, datetime

import pytest

from watermark_dagster.core.landing_split import at_ns, split_at
from watermark_dagster.errors import UsageError
from watermark_dagster.observe.landing_log import LoggedFile
from watermark_dagster.operations.landing_set import FilesAtTime

T = datetime(2026, 1, 2, tzinfo=UTC)
_S = 1_000_000_000


def _files(*mtimes_from_t: float) -> list[LoggedFile]:
    """Files numbered 1.. in the given order, modified that many seconds from T."""
    return [
        LoggedFile(i, f"f{i}.csv", 1, at_ns(T) + int(s * _S))
        for i, s in enumerate(mtimes_from_t, start=1)
    ]


@pytest.mark.parametrize(
    ("mtimes", "version"),
    [
        ((-2, -1, 1), 2),
        ((-2, 0, 1), 2),  # modified exactly at T: applied
        ((-1, -1, -1), 3),
        ((1, 2), 0),  # every file after T
        ((), 0),
        ((-5, -9, 3, 2), 2),  # out of time order on each side: still split
        ((-0.000001, 0.000001), 1),  # microseconds decide
    ],
    ids=["split", "at-t-applied", "all-before", "all-after", "empty", "unordered-sides", "µs"],
)
def test_a_log_split_by_t(mtimes: tuple[float, ...], version: int) -> None:
    split = split_at("drops", _files(*mtimes), T, text="t")
    assert split.version == version
    assert [f.ordinal for f in split.applied] == list(range(1, version + 1))
    assert [f.ordinal for f in split.to_load] == list(range(version + 1, len(mtimes) + 1))


def test_a_log_not_split_by_t_names_the_first_later_and_the_last_earlier_file() -> None:
    # f2 modified after T, f3 and f4 modified before it but numbered later.
    with pytest.raises(UsageError) as raised:
        split_at("drops", _files(-3, 60, -2, -1, 90), T, text="2026-01-02")
    message = str(raised.value)
    assert "'f2.csv' (file 2, modified 2026-01-02T00:01:00+00:00) was modified after" in message
    assert "'f4.csv' (file 4, modified 2026-01-01T23:59:59+00:00)" in message
    assert "`watermark set -t drops --version 1`" in message
    assert "`--version 4`" in message
    assert "nothing was changed" in message


def test_each_side_names_the_files_nearest_t_and_counts_the_rest() -> None:
    files = _files(*range(-12, 0), *range(1, 9))
    split = split_at("drops", files, T, text="t")
    resolution = FilesAtTime(
        timestamp="t",
        resolved_time=T.isoformat(),
        version_committed_at="",
        applied=split.applied,
        to_load=split.to_load,
        logged=20,
        dry_run=True,
    )
    lines = resolution.lines()
    assert "  would log 20 settled files first, as any look does" in lines
    assert (
        "  applied (12 files, 1..12): 7 earlier, then f8.csv, f9.csv, f10.csv, f11.csv, f12.csv"
        in lines
    )
    assert (
        "  still to load (8 files, 13..20): f13.csv, f14.csv, f15.csv, f16.csv, f17.csv, "
        "and 3 later"
    ) in lines
    sides = resolution.sides()
    assert (sides["applied"]["count"], sides["applied"]["numbers"]) == (12, [1, 12])
    assert [s["number"] for s in sides["to_load"]["shown"]] == [13, 14, 15, 16, 17]
    recorded = resolution.as_dict()
    assert (recorded["applied"], recorded["to_load"]) == (12, 8)
    assert (recorded["last_applied"], recorded["first_to_load"]) == ("f12.csv", "f13.csv")
