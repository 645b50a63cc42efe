"""The home's engine as the tests run it: `watermark engine` (a Spark Connect server with
Delta) as a console-script subprocess in its own process group, stopped and killed with
everything it started when the test is done."""

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO
from tests.support.cli import SCRIPT
from watermark_dagster.runtime.connect import EngineRecord, read_record


@dataclass
class Engine:
    """A `watermark engine` process for one home."""

    process: subprocess.Popen
    home: Path
    env: dict[str, str]
    ready: dict
    output: Path

    @property
    def folder(self) -> Path:
        return self.home / "engine"

    def record(self) -> EngineRecord:
        found = read_record(self.folder)
        assert found is not None, self.output.read_text()[-3000:]
        return found

    def stop(self) -> int:
        """SIGTERM, as `watermark dev` and an operator stop it; its exit code."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # anything left in its group


@contextlib.contextmanager
def running_engine(home: Path, env: dict[str, str], output: Path) -> Iterator[Engine]:
    """`watermark engine` for ``home`` run with ``env`` (its stderr in ``output``), once it
    printed its ready object; stopped (SIGTERM, then SIGKILL of its group) on leaving."""
    with output.open("w") as out:
        process = subprocess.Popen(
            [str(SCRIPT), "engine", "--json"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=out,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
    try:
        assert process.stdout is not None
        text, ready = "", None
        for line in process.stdout:  # the ready object, once the server listens
            text += line
            with contextlib.suppress(json.JSONDecodeError):
                ready = json.loads(text)
                break
        assert ready, f"engine exited {process.wait()}: {output.read_text()[-3000:]}"
        yield Engine(process, home, env, ready, output)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
