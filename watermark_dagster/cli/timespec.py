"""Turning what an operator types into a point in time, and a point in time into a version.

Pure functions, no I/O: :func:`parse_when` reads ``--timestamp`` values, and
:func:`version_at` picks a Delta version from a table's commit history.
"""

import re
from datetime import UTC, datetime, timedelta

from watermark_dagster.core.commits import version_at

ACCEPTED_FORMS = (
    "an ISO 8601 time such as 2026-08-09, 2026-08-09T20:00:01, '2026-08-09 20:00:01+02:00' "
    "or 2026-08-09T18:00:01Z (no zone means UTC), or a time ago such as 90m, 36h, 7d, "
    "1week, '2 weeks' or '1 day'"
)

_UNITS = {
    "s": "seconds",
    "sec": "seconds",
    "secs": "seconds",
    "second": "seconds",
    "seconds": "seconds",
    "m": "minutes",
    "min": "minutes",
    "mins": "minutes",
    "minute": "minutes",
    "minutes": "minutes",
    "h": "hours",
    "hr": "hours",
    "hrs": "hours",
    "hour": "hours",
    "hours": "hours",
    "d": "days",
    "day": "days",
    "days": "days",
    "w": "weeks",
    "wk": "weeks",
    "wks": "weeks",
    "week": "weeks",
    "weeks": "weeks",
}
_RELATIVE = re.compile(r"^(\d+)\s*([a-z]+)(?:\s+ago)?$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TimestampError(ValueError):
    """A ``--timestamp`` value that is neither ISO 8601 nor a relative time."""


def parse_when(text: str, *, now: datetime) -> datetime:
    """The instant ``text`` names, in UTC.

    Args:
        text: an ISO 8601 date or date-time (a naive one is taken as UTC), or a time ago:
            a whole number and a unit (s, m/min, h/hr, d/day, w/week, singular or plural,
            with or without a space, optionally followed by "ago"): ``7d``, ``1week``,
            ``2 weeks``, ``36h``, ``90m``, ``1 day``.
        now: the current time (timezone-aware), from which relative times count back.

    Returns:
        A timezone-aware datetime in UTC.

    Raises:
        TimestampError: ``text`` is neither form; the message names it and the accepted forms.

    Example:
        >>> parse_when("7d", now=datetime(2026, 8, 9, tzinfo=UTC))
        datetime.datetime(2026, 8, 2, 0, 0, tzinfo=datetime.timezone.utc)
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    raw = text.strip()
    relative = _RELATIVE.match(raw.lower())
    if relative:
        amount, unit = int(relative.group(1)), relative.group(2)
        if unit not in _UNITS:
            raise TimestampError(
                f"--timestamp {text!r}: unknown unit {unit!r} (months and years vary in "
                f"length; count them in days or weeks). Give {ACCEPTED_FORMS}."
            )
        return (now - timedelta(**{_UNITS[unit]: amount})).astimezone(UTC)
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise TimestampError(
            f"--timestamp {text!r} is not a time. Give {ACCEPTED_FORMS}."
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


__all__ = ["ACCEPTED_FORMS", "TimestampError", "parse_when", "version_at"]
