"""A Delta table's retention properties, read: ``delta.deletedFileRetentionDuration`` and
``delta.logRetentionDuration`` with Delta's defaults (:func:`table_retentions`), their
interval strings (:func:`parse_interval`), and the retention check's warning margin
(:func:`margin_for`).
"""

import re
from collections.abc import Mapping
from datetime import timedelta

from watermark_dagster.errors import ConfigurationError

DELETED_FILE_RETENTION = "delta.deletedFileRetentionDuration"
LOG_RETENTION = "delta.logRetentionDuration"
# Delta's own defaults when a table does not set the property.
DEFAULT_DELETED_FILE_RETENTION = "interval 1 week"
DEFAULT_LOG_RETENTION = "interval 30 days"
# Fail this long before the horizon: a fraction of the horizon, or a fixed duration.
DEFAULT_MARGIN = 0.25

_UNITS = {
    "week": timedelta(weeks=1),
    "day": timedelta(days=1),
    "hour": timedelta(hours=1),
    "minute": timedelta(minutes=1),
    "second": timedelta(seconds=1),
    "millisecond": timedelta(milliseconds=1),
    "microsecond": timedelta(microseconds=1),
}
_PART = re.compile(r"(\d+)\s+([a-z]+)")


def parse_interval(value: str, *, upstream: str, prop: str) -> timedelta:
    """A Delta interval property (``interval 7 days``, ``168 hours``, ``interval 1 week``).

    Accepts Delta's calendar-interval strings without months or years: an optional
    ``interval`` keyword, then one or more ``<integer> <unit>`` parts, case-insensitive,
    units singular or plural (week, day, hour, minute, second, millisecond, microsecond).

    Raises:
        ConfigurationError: the value cannot be read; the message names the upstream, the
            property and the value.
    """
    text = value.strip().lower() if isinstance(value, str) else ""
    text = text.removeprefix("interval").strip()
    total = timedelta()
    problem = None if text else "it is empty"
    pos = 0
    while problem is None and pos < len(text):
        m = _PART.match(text, pos)
        if m is None:
            problem = "expected '<integer> <unit>' parts"
            break
        unit = m.group(2)
        if unit.endswith("s") and unit[:-1] in _UNITS:
            unit = unit[:-1]
        if unit not in _UNITS:
            problem = (
                "Delta retention intervals cannot use months or years"
                if unit.rstrip("s") in ("month", "year")
                else f"unknown unit {m.group(2)!r}"
            )
            break
        total += int(m.group(1)) * _UNITS[unit]
        pos = m.end()
        while pos < len(text) and text[pos] in " ,":
            pos += 1
    if problem is not None:
        raise ConfigurationError(
            f"Upstream '{upstream}': table property {prop} = {value!r} is not a Delta interval "
            f"({problem}).",
            upstream=upstream,
            fix=f"set it to a value like 'interval 7 days' or 'interval 168 hours' with "
            f"ALTER TABLE ... SET TBLPROPERTIES ('{prop}' = 'interval 7 days').",
        )
    return total


def table_retentions(
    configuration: Mapping[str, str | None], *, upstream: str
) -> tuple[timedelta, timedelta]:
    """``(deletedFileRetentionDuration, logRetentionDuration)`` of a table, with Delta's
    defaults for unset properties. Property names are matched case-insensitively.

    Raises:
        ConfigurationError: a property is set to something that is not an interval.
    """
    config = {k.lower(): v for k, v in configuration.items() if v is not None}
    return (
        parse_interval(
            config.get(DELETED_FILE_RETENTION.lower(), DEFAULT_DELETED_FILE_RETENTION),
            upstream=upstream,
            prop=DELETED_FILE_RETENTION,
        ),
        parse_interval(
            config.get(LOG_RETENTION.lower(), DEFAULT_LOG_RETENTION),
            upstream=upstream,
            prop=LOG_RETENTION,
        ),
    )


def margin_for(horizon: timedelta, margin: float | timedelta) -> timedelta:
    """The warning margin: a fraction of the horizon (``0.25``) or a fixed duration.

    Raises:
        ConfigurationError: a fraction outside ``[0, 1)`` or a negative duration.
    """
    if isinstance(margin, timedelta):
        if margin < timedelta():
            raise ConfigurationError(
                f"Retention check margin {margin} is negative.", fix="use a duration >= 0."
            )
        return margin
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin < 1:
        raise ConfigurationError(
            f"Retention check margin {margin!r} is not a fraction of the horizon in [0, 1) "
            "nor a duration.",
            fix="use e.g. 0.25 (a quarter of the horizon) or timedelta(days=2).",
        )
    return horizon * margin
