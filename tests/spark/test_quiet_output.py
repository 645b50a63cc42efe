"""`watermark demo` is quiet by default, and `-v` shows everything.

Each command is the console script in a subprocess with a fresh Delta jar cache, so Spark
resolves Delta's jars (Ivy's report) and starts its JVM (log4j) as on a first run. Quiet
(the demo, in fresh homes): the resolution is one progress line naming the log, and no Ivy,
log4j or WARN line reaches the terminal; they are in the log. Verbose (`watermark -v
verify` on the demo's home: the flag is the command line's, and verify starts Spark without
running a batch): they reach the terminal, and no log is written.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import SCRIPT

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

# What Spark and its resolver print below Python: Ivy's report, log4j's notices and
# WARN lines, the JVM's own warnings.
NOISE = re.compile(
    r":: resolving dependencies|:: resolution report|Ivy Default Cache|confs: \[default\]"
    r"|log4j|\bWARN\b|^WARNING: |FutureWarning|DeprecationWarning"
)
# The quiet demo prints its progress, the status table and one line per target: a few
# dozen lines at most (Ivy's report alone is about 80).
QUIET_MAX_LINES = 40


def _env(root: Path, jars: str) -> dict[str, str]:
    env = {
        **os.environ,
        "WATERMARK_HOME": str(root / "watermark"),
        "DAGSTER_HOME": str(root / "dagster"),
        "WATERMARK_JARS_CACHE": str(root / jars),  # a new cache: the jars are resolved
        "WATERMARK_SPARK_MASTER": "local[1]",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONWARNINGS": "default",  # warnings would show, were they not sent to the log
    }
    for key in ("WATERMARK_VERBOSE", "WATERMARK_REGISTRY", "WATERMARK_SPARK_REMOTE", "NO_COLOR"):
        env.pop(key, None)
    return env


def _watermark(root: Path, jars: str, *args: str) -> list[str]:
    """``watermark ARGS`` run from inside WATERMARK_HOME; its output lines (it must
    succeed)."""
    out = subprocess.run(
        [str(SCRIPT), *args],
        cwd=root / "watermark",
        env=_env(root, jars),
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    lines = (out.stdout + out.stderr).splitlines()
    assert out.returncode == 0, "\n".join(lines[-80:])
    return lines


def test_the_demo_is_quiet_by_default_and_verbose_with_v(tmp_path: Path) -> None:
    # Started from inside WATERMARK_HOME with --fresh, which deletes that folder first: the
    # demo must not lose its working directory (Spark's launcher needs one).
    (tmp_path / "watermark").mkdir()
    quiet = _watermark(tmp_path, "jars", "demo", "--fresh", "--rounds", "0")
    log = tmp_path / "watermark" / "logs" / "demo.log"
    noisy = [line for line in quiet if NOISE.search(line)]
    assert not noisy, "\n".join(quiet)
    assert len(quiet) <= QUIET_MAX_LINES, "\n".join(quiet)
    [resolving] = [line for line in quiet if "resolving Delta jars" in line]
    assert re.search(rf"first run only; its report goes to {re.escape(str(log))}\)", resolving)
    assert re.search(r"\.\.\. done in \d+ s$", resolving), resolving
    assert any("equals a full recompute" in line for line in quiet), "\n".join(quiet)
    # What was not shown is in the log: Ivy's report and the JVM's notices.
    text = log.read_text()
    assert ":: resolving dependencies" in text

    verbose = _watermark(tmp_path, "jars-verbose", "-v", "verify", "-p", "customer_payments")
    shown = "\n".join(verbose)
    assert ":: resolving dependencies" in shown  # Ivy's report
    assert re.search(r"\bWARN\b", shown)  # log4j's WARN lines (Spark's own configuration)
    assert "resolving Delta jars" not in shown  # verbose: Ivy speaks for itself
    assert any(line.startswith("EQUAL on columns") for line in verbose), shown
    assert len(verbose) > QUIET_MAX_LINES + 50
    assert not (tmp_path / "watermark" / "logs" / "verify.log").exists()
