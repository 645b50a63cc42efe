"""The database pin's pure parts (no database, no JVM): positions stored as µs since the
epoch in UTC whatever the host's zone, bound back as the column's own type, and the
lexicographic conditions spelled out column by column with their parameters."""

import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from watermark_dagster.read.database_pin import _lexicographic, bound_value, stored_value

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
