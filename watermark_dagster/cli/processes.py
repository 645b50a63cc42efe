"""Child process trees that stop as a whole: ``watermark dev`` runs ``dagster dev`` (and the
home's Spark Connect engine) this way.

Each child is started in a process group of its own, which every process it starts joins:
``dagster dev``'s webserver, daemon and code servers, the run processes the code servers
launch and the Spark JVMs those start (none of them leaves the group on POSIX). Stopping
sends the group the interrupt a terminal's Ctrl-C would, waits a grace period, then SIGTERM
and finally SIGKILL for whatever is left, so nothing outlives the command however a child
handles its signals. ``dagster dev`` alone, signalled directly, waits up to 60 s for its
webserver and then 60 s for its daemon, and never signals the run processes: its code
servers shut down only once their in-flight runs finish (the gRPC server's "shutdown once
executions finish"), so with a run in flight it does not end before the run does.

A command killed outright (SIGKILL) stops nothing, so each group also holds a watcher: a
small process started first, leading the new group that the child then joins (both stay in
this process's session: a process may only join a group of its own session). The watcher
reads a pipe whose other end only this process holds. When this process dies, however it
dies, the pipe closes and the watcher SIGKILLs the whole group, itself included. The
watcher ignores the signals a stop sends, so it stays on guard until the group is stopped;
then it is released and exits alone.
"""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# How long the processes get to stop on the interrupt, then on SIGTERM, before SIGKILL:
# with the wait after SIGKILL, within the 10 s `docker stop` allows before it kills.
GRACE_SECONDS = 4.5
TERM_SECONDS = 2.0
_POLL_SECONDS = 0.1


# The watcher: on guard against the interrupt and SIGTERM the group is stopped with; the
# group dies when its pipe ends without a word (the command died), else it exits alone.
_WATCHER = (
    "import os, signal\n"
    "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
    "if not os.read(0, 1):\n"
    "    os.killpg(0, signal.SIGKILL)\n"
)


def _group_members(pgid: int, exclude: frozenset[int] = frozenset()) -> set[int] | None:
    """The live (not zombie) processes of group ``pgid`` but ``exclude``, None when /proc
    cannot tell."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    members: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the command name, which may hold spaces: state ppid pgrp ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.add(int(entry.name))
    members -= exclude
    return members


class ProcessGroup:
    """A command started as the leader of its own process group.

    Args:
        argv: the command.
        **popen: further :class:`subprocess.Popen` arguments (stdout, env...).
    """

    def __init__(self, argv: Sequence[str], **popen: Any) -> None:
        self.watcher: subprocess.Popen | None = None
        self._guard = -1
        if not Path("/proc").is_dir():  # no way to tell the watcher from the group's work
            self.proc = subprocess.Popen(list(argv), start_new_session=True, **popen)
            self.pgid = self.proc.pid
            return
        guard, self._guard = os.pipe()  # neither end is inherited by other children
        try:
            self.watcher = subprocess.Popen(
                [sys.executable, "-c", _WATCHER], stdin=guard, process_group=0
            )
        finally:
            os.close(guard)
        self.pgid = self.watcher.pid
        try:
            self.proc = subprocess.Popen(list(argv), process_group=self.pgid, **popen)
        except BaseException:
            self.release()
            raise

    def _watchers(self) -> frozenset[int]:
        return frozenset({self.watcher.pid}) if self.watcher else frozenset()

    def members(self) -> set[int] | None:
        """The live processes of the group but its watcher, None when /proc cannot tell."""
        return _group_members(self.pgid, self._watchers())

    def release(self) -> None:
        """Send the watcher away: the group is stopped (or left to the caller)."""
        if self._guard < 0 or self.watcher is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._guard, b"x")
        os.close(self._guard)
        self._guard = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.watcher.wait(timeout=TERM_SECONDS)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every process of the group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    def running(self) -> bool:
        """Whether the leader or any process of its group is still alive."""
        if self.proc.poll() is None:
            return True
        # The group's first process (the watcher, else the leader) is reaped only once
        # released (or, the leader, here): its pid, the group id, is not reused meanwhile.
        members = self.members()
        if members is not None:
            return bool(members)
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _label(pid: int) -> str:
    """A short name for a process: ``dagster_webserver`` for ``python -m dagster_webserver``,
    ``multiprocessing.spawn`` for a run process, ``java`` for a JVM, else the program's
    name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    if "-m" in argv[:-1]:
        module = argv[argv.index("-m") + 1]
        rest = [a for a in argv[argv.index("-m") + 2 :] if a and not a.startswith("-")]
        return " ".join([module, *rest[:1]])
    if "-c" in argv[:-1]:  # multiprocessing's children: name the module they run
        found = re.search(r"from ([\w.]+) import", argv[argv.index("-c") + 1])
        return found.group(1) if found else "python -c"
    names = [Path(a).name for a in argv if a]
    if len(names) > 1 and names[0].startswith("python"):
        return " ".join(names[1:3])
    return names[0] if names else "?"


def survivors(groups: Sequence[tuple[ProcessGroup, int]]) -> list[str]:
    """``name (pid)`` of each process still alive in ``groups`` (empty without /proc)."""
    found: list[str] = []
    for group, _ in groups:
        for pid in sorted(group.members() or ()):
            found.append(f"{_label(pid)} ({pid})")
    return found


def stop_groups(
    groups: Sequence[tuple[ProcessGroup, int]],
    *,
    grace: float = GRACE_SECONDS,
    term: float = TERM_SECONDS,
) -> list[tuple[int, list[str]]]:
    """Stop every group: its first signal (the interrupt for ``dagster dev``), then after
    ``grace`` seconds SIGTERM, then after ``term`` more SIGKILL; wait until no process of
    any group is left.

    Returns:
        Each signal that had to follow the first one, with the processes it was sent to
        (empty when all stopped in time).
    """
    try:
        return _stop(groups, grace=grace, term=term)
    finally:
        for group, _ in groups:
            group.release()


def _stop(
    groups: Sequence[tuple[ProcessGroup, int]], *, grace: float, term: float
) -> list[tuple[int, list[str]]]:
    escalated: list[tuple[int, list[str]]] = []
    for group, first in groups:
        group.signal(first)
    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, term)):
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(g.running() for g, _ in groups):
            time.sleep(_POLL_SECONDS)
        if not any(g.running() for g, _ in groups):
            return escalated
        escalated.append((signum, survivors(groups)))
        for group, _ in groups:
            if group.running():
                group.signal(signum)
    # SIGKILL cannot be refused; wait for the kernel to finish the processes off.
    deadline = time.monotonic() + term
    while time.monotonic() < deadline and any(g.running() for g, _ in groups):
        time.sleep(_POLL_SECONDS)
    return escalated


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived: the command stops its children and ends."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interrupts_raise() -> Any:
    """Within the block, SIGINT and SIGTERM raise :class:`Interrupted` (which also breaks
    a blocking wait); the previous handlers are restored afterwards."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextlib.contextmanager
def interrupts_ignored() -> Any:
    """Within the block (stopping the children), further SIGINT and SIGTERM are ignored:
    the stop already ends in SIGKILL within its deadline."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
