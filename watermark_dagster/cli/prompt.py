"""Asking the operator to confirm a change before anything is written."""

import sys
from collections.abc import Sequence
from typing import TextIO

from watermark_dagster.errors import UsageError


def confirm(summary: Sequence[str], *, yes: bool, stream: TextIO | None = None) -> None:
    """Show ``summary`` and ask on the terminal (``stream``, default stderr); ``yes``
    (``--yes``) confirms without asking.

    Raises:
        UsageError: not confirmed, or no terminal to ask on and ``yes`` not given.
    """
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(
            "this change needs a confirmation and stdin is not a terminal; nothing was "
            "changed. Re-run with --yes to confirm (--dry-run shows what would change)."
        )
    # The question goes to stderr, so stdout stays clean for --json.
    stream = stream or sys.stderr
    for line in summary:
        print(line, file=stream)
    print("Proceed? [y/N] ", end="", file=stream, flush=True)
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not confirmed; nothing was changed.")
