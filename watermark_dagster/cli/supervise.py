"""Seeing how a run died: the commands that execute runs do their work in a child process
that this one watches.

A process killed with SIGKILL (the kernel's out-of-memory killer, an operator, a lost
container) records nothing, so the next coordinator tick can only tell that the run's
worker process is gone. A parent sees more: the child's exit status. ``watermark run``,
``watermark demo`` and ``watermark replay`` therefore fork before they import Dagster or
start Spark; the child runs the command, the parent waits. When the child dies by a signal,
the parent marks the runs it was executing as died with that signal (the coordinator then
records ``RUN_DIED ... killed by SIGKILL (signal 9)`` in history and retries the batch as a
crash, without spending an attempt), tells the terminal, and exits with 128 + the signal,
as a shell would.

The parent is small and never the one an out-of-memory killer picks. Signals meant for the
command reach the child: SIGTERM, SIGHUP and SIGQUIT sent to the parent are forwarded,
Ctrl-C reaches both from the terminal and the parent ignores it. A child whose parent dies
is killed (``PR_SET_PDEATHSIG``), so killing the command's process still stops its work.
``WATERMARK_SUPERVISE=0`` runs the command in one process.
"""

import argparse
import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable

from watermark_dagster.runtime.lifetime import die_with_parent

ENV = "WATERMARK_SUPERVISE"
# Signals the parent passes on to the child (a terminal's Ctrl-C reaches both already).
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def wanted(args: argparse.Namespace) -> bool:
    """Whether the parsed command executes runs in a supervised child (Linux only)."""
    return (
        bool(getattr(args, "supervised", False))
        and sys.platform.startswith("linux")
        and os.environ.get(ENV, "1") != "0"
    )


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies, and die now if the
    parent is gone already."""
    die_with_parent()
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def supervise(
    command: Callable[[], int],
    on_signal: Callable[[str, int], None],
    *,
    exit_child: Callable[[int], None],
) -> int:
    """Run ``command`` in a forked child and return its exit code.

    Args:
        command: the command, run in the child; returns its exit code.
        on_signal: called in the parent with the child's worker identity and the signal
            when the child died by a signal (marks its runs died).
        exit_child: ends the child with the command's code (it must not return).

    Returns:
        The child's exit code, or 128 + the signal that killed it.
    """
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        _die_with_parent(parent)
        try:
            code = command()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        exit_child(code)
        raise AssertionError("unreachable: exit_child returned")  # pragma: no cover
    # The child's identity as its runs are tagged with it, read while the child exists.
    from watermark_dagster.dagster_defs.runs import worker_identity

    identity = worker_identity(child)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in FORWARDED:
        signal.signal(signum, lambda sig, _frame: _forward(child, sig))
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        on_signal(identity, signum)
        return 128 + signum
    return os.waitstatus_to_exitcode(status)


def _forward(child: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signum)


def mark_killed(args: argparse.Namespace, identity: str, signum: int) -> None:
    """Mark the runs the killed child ``identity`` was executing as died by ``signum``,
    and say so on stderr. Best effort: a failure here is reported, never raised (the
    coordinator still finds the runs dead by their missing worker)."""
    from watermark_dagster.dagster_defs.runs import signal_text

    how = signal_text(signum)
    try:
        marked = _mark(args, identity, how)
    except Exception as e:
        print(
            f"watermark {args.command}: its process was {how}; recording that failed ({e}). "
            "The next `watermark run` finds the run dead by its missing process.",
            file=sys.stderr,
        )
        return
    runs = ", ".join(f"{r[:8]} (batch {b})" for r, b in marked) or "none was running"
    again = (
        "the same `watermark replay` run again resumes its replay batch"
        if args.command == "replay"
        else "the next `watermark run` (or the coordinator, after a backoff) runs the batch "
        "again without spending an attempt"
    )
    print(
        f"watermark {args.command}: its process was {how}. Runs recorded as died: {runs}. "
        f"A death is a crash, not a failure: {again}. A process killed again and again is "
        "most often out of memory.",
        file=sys.stderr,
    )


def _mark(args: argparse.Namespace, identity: str, how: str) -> list[tuple[str, str]]:
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    from watermark_dagster.cli.context import dagster_home, watermark_home
    from watermark_dagster.dagster_defs.runs import (
        PARTITION_NAME_TAG,
        WORKER_RUN_TAG,
        WORKER_TAG,
        mark_died,
    )

    dagster_home(watermark_home(args))
    marked = []
    with DagsterInstance.get() as instance:
        unfinished = [
            DagsterRunStatus.NOT_STARTED,
            DagsterRunStatus.STARTING,
            DagsterRunStatus.STARTED,
        ]
        for run in instance.get_runs(RunsFilter(tags={WORKER_TAG: identity}, statuses=unfinished)):
            if run.tags.get(WORKER_RUN_TAG, run.run_id) != run.run_id:
                continue  # a re-execution that copied the tag: not a run of this child
            mark_died(instance, run, how)
            marked.append((run.run_id, run.tags.get(PARTITION_NAME_TAG, "?")))
    return marked
