"""Pools of real processes, for the tests that race them against one another."""

import contextlib
import multiprocessing
import signal
from collections.abc import Iterator
from multiprocessing.pool import Pool


@contextlib.contextmanager
def spawn_pool(processes: int) -> Iterator[Pool]:
    """A pool of ``processes`` fresh interpreters (``spawn``: no state of the test's own
    process, its Spark session included, is inherited) whose workers SIGTERM ends.

    A process started with SIGTERM ignored (as a CI runner or ``nohup`` may start it)
    passes that on to the processes it starts. ``Pool.terminate``, which leaving the
    block calls, takes the task queue's lock and relies on SIGTERM to end the workers
    still waiting for it: with SIGTERM ignored, the pool's exit waited for them forever
    (a fresh-clone run of tests/scale/test_s3_store.py hung there for 12 minutes, its
    last worker asleep on that lock and ignoring SIGTERM). The workers are started with
    SIGTERM's default action instead.
    """
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        pool = multiprocessing.get_context("spawn").Pool(processes)
    finally:
        signal.signal(signal.SIGTERM, before)
    with pool:
        yield pool
