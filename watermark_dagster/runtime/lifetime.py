"""Children that die with the process that started them.

A process killed with SIGKILL runs no cleanup, so whatever it started must end by other
means. ``die_with_parent`` asks the kernel to SIGKILL the calling process when its parent
dies (Linux's ``PR_SET_PDEATHSIG``): called in a ``preexec_fn``, it holds for the program
the child then executes (it survives ``exec``; ``spark-submit`` execs the JVM, so the JVM
itself carries it). The kernel sends it when the *thread* that started the child ends, so
children that must outlive a thread are started from the main thread or a long-lived one.
"""

import contextlib
import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1
# Resolved before any fork: a preexec_fn should not load libraries.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux; elsewhere nothing)."""
    if _LIBC is not None:
        with contextlib.suppress(OSError, AttributeError):
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
