"""The console scripts as the tests start them: `watermark` in a child process with a demo
home's environment, on a pseudo-terminal, and what its control tables hold before and after."""

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

from watermark_dagster.demo import DemoPaths
from watermark_dagster.store import WatermarkStore

# The console scripts installed beside the interpreter running the tests.
SCRIPT = Path(sys.executable).with_name("watermark")
DAEMON = Path(sys.executable).with_name("dagster-daemon")


def home_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a command on the demo home ``home`` (and its Dagster home), with
    ``NO_COLOR`` left out and ``extra`` on top."""
    env = {**os.environ, "WATERMARK_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}
    env.pop("NO_COLOR", None)
    return {**env, **extra}


def control_versions(home: Path) -> dict[str, int]:
    """The version of each control table of the demo home ``home``."""
    store = WatermarkStore(DemoPaths(home).control_root)
    return {
        t: store.table_version(t)
        for t in ("batches", "committed_watermarks", "pipeline_checkpoints", "history")
    }


def on_terminal(
    home: Path, *args: str, answer: bytes = b"", stdout_tty: bool = False, **env: str
) -> tuple[int, str, str]:
    """Run the console script with a pseudo-terminal as stdin (and stdout if asked)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [str(SCRIPT), *args],
        env=home_env(home, **env),
        stdin=slave,
        stdout=slave if stdout_tty else subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    os.close(slave)
    if answer:
        os.write(master, answer)
    screen = b""
    while stdout_tty:
        ready, _, _ = select.select([master], [], [], 1)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            screen += chunk
        elif proc.poll() is not None:
            break
    out, err = proc.communicate(timeout=120)
    os.close(master)
    stdout = screen.decode() if stdout_tty else out.decode()
    return proc.returncode, stdout, err.decode()
