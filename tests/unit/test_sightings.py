"""An integer cursor's lag (no database, no JVM): the window ends at the greatest cursor
value a look that planned a batch saw at least ``lag_seconds`` ago, and rows above it are
re-checked when the next sighting above it passes the lag."""

from datetime import UTC, datetime, timedelta

import pytest

from watermark_dagster.core.sightings import SightedCeiling, sighted_ceiling, sighted_cursor

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _micros(at: datetime) -> int:
    return int(at.timestamp()) * 1_000_000


@pytest.mark.parametrize(
    ("state", "cursor"),
    [("db:42", 42), ("db:42|a|b", 42), ("db:-3", -3), ("db:empty", None), ("v12", None)],
)
def test_a_look_s_state_shows_its_integer_cursor(state: str, cursor: int | None) -> None:
    assert sighted_cursor(state) == cursor
    assert sighted_cursor(None) is None


def test_the_ceiling_is_the_greatest_cursor_seen_at_least_the_lag_ago() -> None:
    sightings = [
        (T0, "db:2"),
        (T0 + timedelta(seconds=30), "db:empty"),
        (T0 + timedelta(seconds=40), "db:5"),
        (T0 + timedelta(seconds=90), "db:9"),
    ]
    # Nothing seen 60 s before T0 + 30 s: no row may be read; the first sighting passes
    # the lag at T0 + 60 s.
    assert sighted_ceiling(sightings, T0 + timedelta(seconds=30), 60) == SightedCeiling(
        None, _micros(T0 + timedelta(seconds=60))
    )
    assert sighted_ceiling(sightings, T0 + timedelta(seconds=60), 60) == SightedCeiling(
        2, _micros(T0 + timedelta(seconds=100))
    )
    assert sighted_ceiling(sightings, T0 + timedelta(seconds=100), 60) == SightedCeiling(
        5, _micros(T0 + timedelta(seconds=150))
    )
    assert sighted_ceiling(sightings, T0 + timedelta(seconds=150), 60) == SightedCeiling(9, None)


def test_a_top_that_went_down_keeps_the_greatest_ceiling_seen() -> None:
    sightings = [(T0, "db:7"), (T0 + timedelta(seconds=10), "db:4")]
    # Seen 7 then 4 (rows deleted): every id up to 7 was taken 60 s ago; 4 is no newer.
    assert sighted_ceiling(sightings, T0 + timedelta(seconds=70), 60) == SightedCeiling(7, None)
    assert sighted_ceiling([], T0, 60) == SightedCeiling(None, None)
