"""The database pin's pure parts (no database, no JVM): positions stored as µs since the
epoch in UTC whatever the host's zone, bound back as the column's own type, the
lexicographic conditions spelled out column by column with their parameters, and the
lag's ceiling for each cursor type."""

import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.upstream_kinds import declare_upstream
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.read.database_pin import (
    _Ceiling,
    _ceiling,
    _lexicographic,
    bound_value,
    stored_value,
)

AT = datetime(2026, 1, 15, 3, 0, 0, 123456)
MICROS = int(AT.replace(tzinfo=UTC).timestamp()) * 1_000_000 + 123456


@pytest.fixture(params=["UTC", "Asia/Tokyo", "America/New_York"])
def host_zone(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


def test_a_timestamp_is_stored_as_utc_micros_whatever_the_host_zone(host_zone: str) -> None:
    assert stored_value(AT) == MICROS  # no zone: UTC's wall clock
    paris = timezone(timedelta(hours=1))
    assert stored_value(AT.replace(tzinfo=UTC).astimezone(paris)) == MICROS
    assert stored_value(date(1970, 1, 11)) == 10
    assert stored_value(Decimal("1.50")) == Decimal("1.50")
    assert stored_value("a") == "a"


@pytest.mark.parametrize(
    ("type_name", "expected"),
    [
        ("timestamp(6) without time zone", AT),
        ("timestamp with time zone", AT.replace(tzinfo=UTC)),
        ("datetime(6)", AT),
        ("timestamp(6)", AT),  # MariaDB's: read in the session's zone, pinned to UTC
    ],
)
def test_a_stored_timestamp_is_bound_as_the_column_s_type(
    type_name: str, expected: datetime, host_zone: str
) -> None:
    assert bound_value(type_name, MICROS) == expected
    assert stored_value(bound_value(type_name, MICROS)) == MICROS


def test_other_values_are_bound_as_they_are_stored() -> None:
    assert bound_value("date", 10) == date(1970, 1, 11)
    assert bound_value("bigint", 10) == 10
    assert bound_value("character varying(10)", "a") == "a"
    assert bound_value("boolean", True) is True


def test_a_lexicographic_condition_names_each_column_and_binds_each_value() -> None:
    sql, params = _lexicographic(['"t"', '"id"', '"code"'], [1, 2, "a"], ">")
    assert sql == '(("t" > %s OR ("t" = %s AND ("id" > %s OR ("id" = %s AND "code" > %s)))))'
    assert params == [1, 1, 2, 2, "a"]
    sql, params = _lexicographic(['"t"', '"id"'], [1, 2], "<=")
    assert sql == '(("t" < %s OR ("t" = %s AND "id" <= %s)))'
    assert params == [1, 1, 2]
    assert _lexicographic(['"t"'], [1], ">") == ('("t" > %s)', [1])


def _upstream(lag: float) -> DatabaseUpstream:
    found = declare_upstream(
        name="orders_db",
        kind="database",
        url="jdbc:postgresql://db.internal:5432/shop",
        source_table="public.orders",
        cursor="id",
        lag_seconds=lag,
    )
    assert isinstance(found, DatabaseUpstream)
    return found


NOW = datetime(2026, 1, 15, 0, 30, tzinfo=UTC)


def test_a_date_cursor_s_lag_ends_at_the_last_day_that_ended_the_lag_ago() -> None:
    # 00:30 minus 1 h is the 14th, 23:30: the 13th is the last day over an hour ago.
    ceiling = _ceiling(_upstream(3600), "date", NOW, None)
    assert ceiling.cursor == stored_value(date(2026, 1, 13))
    assert ceiling.recheck_after is not None
    # A row of the 14th is read once the 14th has been over for the lag: the 15th, 01:00.
    at = int(datetime(2026, 1, 15, 1, tzinfo=UTC).timestamp()) * 1_000_000
    assert ceiling.recheck_after(date(2026, 1, 14)) == at
    assert _ceiling(_upstream(0), "date", NOW, None).cursor is None  # no lag: no ceiling


def test_an_integer_cursor_s_lag_ends_where_the_sightings_say() -> None:
    seen = [(NOW - timedelta(seconds=90), "db:4"), (NOW - timedelta(seconds=10), "db:9")]
    asked: list[datetime] = []

    def sightings(before: datetime) -> list[tuple[datetime, str | None]]:
        asked.append(before)
        return seen

    ceiling = _ceiling(_upstream(60), "bigint", NOW, sightings)
    assert asked == [NOW - timedelta(seconds=60)]
    assert (ceiling.cursor, ceiling.closed) == (4, False)
    assert ceiling.recheck_at == int((NOW + timedelta(seconds=50)).timestamp()) * 1_000_000
    # Nothing sighted the lag ago: no row may be read yet.
    assert _ceiling(_upstream(60), "bigint", NOW, lambda _: seen[1:]).closed
    assert _ceiling(_upstream(0), "bigint", NOW, None) == _Ceiling()


def test_a_lag_on_a_cursor_of_another_type_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="id is text"):
        _ceiling(_upstream(60), "text", NOW, None)
