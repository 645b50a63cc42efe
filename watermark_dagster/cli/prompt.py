"""Asking the operator to confirm a change before anything is written."""

import sys
from collections.abc import Sequence

from watermark_dagster.errors import UsageError


def confirm(summary: Sequence[str], *, yes: bool) -> None:
    """Show ``summary`` and ask on the terminal; ``yes`` (``--yes``) confirms without asking.

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
    for line in summary:
        print(line, file=sys.stderr)
    print("Proceed? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not confirmed; nothing was changed.")
