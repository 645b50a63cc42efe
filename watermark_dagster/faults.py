"""Named fault-injection points for crash tests.

``fault_point("after_target_commit")`` does nothing unless the environment variable
``WATERMARK_FAULTS`` names that point (comma-separated), in which case the process kills
itself with SIGKILL on the spot — no exception, no cleanup, no ``finally`` — exactly like a
machine dying. Tests set the variable on a child process and check that the next tick
recovers.
"""

import os
import signal

ENV = "WATERMARK_FAULTS"


def fault_point(name: str) -> None:
    """SIGKILL this process if ``WATERMARK_FAULTS`` names ``name``."""
    armed = os.environ.get(ENV)
    if armed and name in {p.strip() for p in armed.split(",")}:
        os.kill(os.getpid(), signal.SIGKILL)
