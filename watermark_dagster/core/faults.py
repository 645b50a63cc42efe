"""Named fault-injection points for crash tests.

``fault_point("after_target_commit")`` does nothing unless the environment variable
``WATERMARK_FAULTS`` names that point (comma-separated; ``after_target_commit@orders_copy``
arms it only where the caller passes ``where="orders_copy"``, e.g. one pipeline of a
batch), in which case the process kills itself with SIGKILL on the spot — no exception,
no cleanup, no ``finally`` — exactly like a machine dying. Tests set the variable on a
child process and check that the next tick recovers.
"""

import os
import signal

ENV = "WATERMARK_FAULTS"

# Every named point, in flow order. tests/crash/test_crashes.py kills a process at each one
# (or names the module that does: TESTED_ELSEWHERE) and
# fails when a point is called in the code but missing here, or listed here but untested.
FAULT_POINTS = (
    "after_plan_commit",  # store.create_batch: plan committed; no partition, no history row
    "after_run_start",  # pipeline asset: run started, worker tagged; no checkpoint, no Spark
    "after_target_create",  # first load: empty target created (a preparatory commit); no rows
    "after_state_commit",  # maintain: aggregate state brought to the range end; target not written
    "after_warehouse_stage",  # warehouse load: rows staged; nothing applied, no transaction
    "before_warehouse_commit",  # warehouse load: applied in the open transaction; not committed
    "after_target_commit",  # execute: target written; no checkpoint, no materialization
    "after_checkpoint",  # execute: checkpoint SUCCESS; no materialization
    "after_watermark_commit",  # store.advance_many: watermarks moved; no history, rows unmarked
    "before_batch_complete",  # finalizer: every upstream advanced; batch still PLANNED
    "after_replay_start",  # watermark replay: REPLAY batch recorded; no run, not ended
    "after_fence",  # set/reset --force: runs stopped, targets fenced; batch not abandoned yet
    "after_abandon",  # store.set_watermark: open batch abandoned; watermark not moved yet
    "after_manual_watermark_commit",  # store.set_watermark: watermark moved; no history row
)


def fault_point(name: str, *, where: str | None = None) -> None:
    """SIGKILL this process if ``WATERMARK_FAULTS`` names ``name`` (or ``name@where``)."""
    armed = os.environ.get(ENV)
    if armed:
        points = {p.strip() for p in armed.split(",")}
        if name in points or (where is not None and f"{name}@{where}" in points):
            os.kill(os.getpid(), signal.SIGKILL)
    _simulated_crash(name)


class SimulatedCrash(BaseException):  # a crash, not an error: hence no Error suffix
    """Raised by an armed fault point in simulation mode: the in-process stand-in for a
    SIGKILL, used where starting a process per crash is too slow (the model test). Like a
    kill, it must not be caught by error handling: nothing records it as a failure."""


_simulated: set[str] = set()


class simulate_crash_at:  # lower-case: used like a function, as a context manager
    """Within the block, the fault point ``name`` raises :class:`SimulatedCrash` (once)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        _simulated.add(self.name)

    def __exit__(self, *exc: object) -> None:
        _simulated.discard(self.name)


def _simulated_crash(name: str) -> None:
    if name in _simulated:
        _simulated.discard(name)
        raise SimulatedCrash(name)
