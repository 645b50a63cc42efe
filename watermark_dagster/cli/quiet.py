"""Quiet by default: what Spark, its JVM and Dagster write goes to a log file, the command's
own output to the terminal; ``-v``/``--verbose`` (or ``WATERMARK_VERBOSE=1``) shows all.

A command that may start Spark points file descriptor 2 at ``<WATERMARK_HOME>/logs/
<command>.log`` before anything starts: the JVM and every other child inherit it (Ivy's
dependency report, log4j, JVM notices), and so do Python's ``sys.stderr`` writers
(Dagster's console logs, warnings from pyspark and pandas). The command keeps a stream on
the terminal's stderr (:attr:`Console.err`) for its problems, questions and progress. A
verbose command changes nothing, and ``WATERMARK_VERBOSE=1`` is exported so the Spark
sessions it starts keep Spark's own logging (:mod:`watermark_dagster.runtime.spark`).
"""

import os
import sys
from pathlib import Path
from typing import TextIO

VERBOSE_ENV = "WATERMARK_VERBOSE"


def verbose_requested(flag: bool) -> bool:
    """``-v`` given, or ``WATERMARK_VERBOSE`` set to anything but ``""``/``0``."""
    return flag or os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0")


def log_path(home: Path, command: str) -> Path:
    """Where a quiet ``command`` writes what it does not show: the last run's only."""
    return home / "logs" / f"{command}.log"


def terminal_stderr() -> TextIO:
    """A new text stream on the current stderr (the terminal), which stays there when file
    descriptor 2 is pointed elsewhere."""
    sys.stderr.flush()
    return os.fdopen(
        os.dup(2),
        "w",
        buffering=1,
        encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
        errors="backslashreplace",
    )


def redirect_stderr(path: Path) -> None:
    """Point file descriptor 2 at ``path`` (emptied), for this process and its children."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 2)
    finally:
        os.close(fd)
