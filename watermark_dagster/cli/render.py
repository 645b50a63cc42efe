"""Output of the command line: aligned tables, colours on a terminal only, JSON for scripts.

Colours follow the usual conventions: only when the stream is a terminal, never when
``NO_COLOR`` is set to anything (https://no-color.org) or ``TERM`` is ``dumb``.
"""

import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal, TextIO

Style = Literal["ok", "warn", "bad", "dim", "bold"]

_CODES: dict[str, str] = {
    "ok": "32",  # green
    "warn": "33",  # yellow
    "bad": "31",  # red
    "dim": "2",
    "bold": "1",
}
# Words the tables colour wherever they appear as a whole cell.
STATUS_STYLES: dict[str, Style] = {
    "COMPLETED": "ok",
    "SUCCESS": "ok",
    "PLANNED": "warn",
    "STUCK": "bad",
    "BLOCKED": "bad",
    "RUNNING": "warn",
    "FAILED": "bad",
    "DIED": "warn",
    "ABANDONED": "bad",
}


def cursor_type_of(upstream: object, fingerprint: str | None) -> str | None:
    """A cursor upstream's cursor type as its look found it: ``timestamp``, ``date`` or
    another type's name (None: not known, e.g. a source whose look reads no schema)."""
    from watermark_dagster.observe.database_state import fingerprint_columns, is_timestamp_type

    cursor = getattr(upstream, "cursor", None)
    columns = fingerprint_columns(fingerprint) or {}
    if cursor is None or cursor not in columns:
        return None
    type_name = columns[cursor][0]
    if is_timestamp_type(type_name):
        return "timestamp"
    return "date" if type_name.lower() == "date" else type_name


def shown_position(
    position: Sequence[object], cursor_type: str | None, tie_break: Sequence[str] = ()
) -> str:
    """A committed cursor position as its cursor's own type: a timestamp (microseconds
    since the epoch) in ISO 8601 UTC, a date (days) as a date, then each tie-break key as
    ``name=value``; raw values where the type is not known."""
    if not position:
        return "[]"
    first, *keys = position
    if isinstance(first, int) and not isinstance(first, bool) and cursor_type == "timestamp":
        moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=first)
        shown = moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
    elif isinstance(first, int) and not isinstance(first, bool) and cursor_type == "date":
        shown = (date(1970, 1, 1) + timedelta(days=first)).isoformat()
    else:
        shown = str(first)
    names = list(tie_break) + [f"key{i + 1}" for i in range(len(tie_break), len(keys))]
    return ", ".join([shown, *(f"{n}={v}" for n, v in zip(names, keys, strict=False))])


def colour_enabled(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal and the environment does not ask for plain text."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@dataclass(frozen=True)
class Styled:
    """A table cell or text with a style; plain when colours are off."""

    text: str
    style: Style


def paint(text: str, style: Style | None, *, enabled: bool) -> str:
    """``text`` wrapped in the ANSI codes of ``style`` when ``enabled``."""
    if not enabled or style is None:
        return text
    return f"\033[{_CODES[style]}m{text}\033[0m"


def _cell(value: Any) -> tuple[str, Style | None]:
    if isinstance(value, Styled):
        return value.text, value.style
    text = "" if value is None else str(value)
    return text, STATUS_STYLES.get(text)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, colour: bool = False) -> str:
    """Rows under headers, columns aligned on the visible text (colour codes excluded)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i][0]) for r in cells]) for i, h in enumerate(headers)]

    def line(parts: Sequence[tuple[str, Style | None]]) -> str:
        padded = [
            paint(text.ljust(w), style, enabled=colour) if text else " " * w
            for (text, style), w in zip(parts, widths, strict=True)
        ]
        return "  ".join(padded).rstrip()

    out = [line([(h, "bold") for h in headers]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(out)


def fields(pairs: Sequence[tuple[str, Any]], *, colour: bool = False) -> str:
    """``key  value`` lines, keys aligned."""
    width = max((len(k) for k, _ in pairs), default=0)
    lines = []
    for key, value in pairs:
        text, style = _cell(value)
        lines.append(f"{key.ljust(width)}  {paint(text, style, enabled=colour)}".rstrip())
    return "\n".join(lines)


def to_json(value: Any) -> str:
    """Indented JSON; datetimes and other values as their text."""
    return json.dumps(value, indent=2, default=str)


class Console:
    """Where a command writes: stdout for results, stderr for problems, colours decided once."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.colour = colour_enabled(self.out)
        self.err_colour = colour_enabled(self.err)
        isatty = getattr(self.out, "isatty", None)
        # On a terminal long texts may be cut to fit and are repeated in full below;
        # elsewhere (pipes, files, logs) nothing is ever cut.
        self.terminal = bool(isatty and isatty())
        self.width = shutil.get_terminal_size().columns if self.terminal else None

    def print(self, text: str = "") -> None:
        """A line of results."""
        print(text, file=self.out)

    def json(self, value: Any) -> None:
        """A result as JSON (never coloured)."""
        print(to_json(value), file=self.out)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """An aligned table of results."""
        self.print(table(headers, rows, colour=self.colour))

    def paint(self, text: str, style: Style | None) -> str:
        """``text`` styled for stdout."""
        return paint(text, style, enabled=self.colour)

    def problem(self, message: str, *, style: Style = "bad") -> None:
        """``watermark: message`` on stderr."""
        print(paint(f"watermark: {message}", style, enabled=self.err_colour), file=self.err)
