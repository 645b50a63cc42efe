"""The process pools the racing tests use end their workers with SIGTERM even when the
test run was started with SIGTERM ignored (tests/support/processes.py): a pool's exit
waited forever on such workers and hung a fresh-clone CI run. No JVM."""

import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PROBE = f"""
import multiprocessing, signal, sys
sys.path.insert(0, {str(REPO)!r})
from tests.support.processes import spawn_pool

def ignores(_):
    return signal.getsignal(signal.SIGTERM) == signal.SIG_IGN

if __name__ == "__main__":
    # Closed, not terminated: leaving a `with` block here can wait forever (see above).
    plain = multiprocessing.get_context("spawn").Pool(1)
    print(plain.map(ignores, [0])[0])
    plain.close()
    plain.join()
    with spawn_pool(2) as pool:  # leaving the block terminates its idle workers
        print(pool.map(ignores, [0])[0])
"""


def test_pool_workers_end_on_sigterm_though_the_run_ignores_it(tmp_path: Path) -> None:
    def ignore_sigterm() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    # A file, not -c: spawned workers import the main module to find `ignores`.
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    proc = subprocess.run(
        [sys.executable, str(probe)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=ignore_sigterm,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # A plain pool's workers inherit the ignored SIGTERM; spawn_pool's do not.
    assert proc.stdout.split() == ["True", "False"]
