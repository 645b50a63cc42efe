"""`watermark demo` is quiet by default and shows everything with `-v`.

Each run is the console script in a subprocess with fresh homes and a fresh Delta jar
cache, so Spark resolves Delta's jars (Ivy's report) and starts its JVM (log4j) as on a
first run. Quiet: the resolution is one progress line naming the log, and no Ivy, log4j or
WARN line reaches the terminal; they are in the log. Verbose: they reach the terminal.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

SCRIPT = Path(sys.executable).with_name("watermark")
# What Spark and its resolver print below Python: Ivy's report, log4j's notices and
# WARN lines, the JVM's own warnings.
NOISE = re.compile(
    r":: resolving dependencies|:: resolution report|Ivy Default Cache|confs: \[default\]"
    r"|log4j|\bWARN\b|^WARNING: |FutureWarning|DeprecationWarning"
)
# The quiet demo prints its progress, the status table and one line per target: a few
# dozen lines at most (Ivy's report alone is about 80).
QUIET_MAX_LINES = 40


def _demo(tmp_path: Path, name: str, *flags: str) -> tuple[list[str], Path]:
    root = tmp_path / name
    env = {
        **os.environ,
        "WATERMARK_HOME": str(root / "watermark"),
        "DAGSTER_HOME": str(root / "dagster"),
        "WATERMARK_JARS_CACHE": str(root / "jars"),  # first run: the jars are resolved
        "WATERMARK_SPARK_MASTER": "local[1]",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONWARNINGS": "default",  # warnings would show, were they not sent to the log
    }
    for key in ("WATERMARK_VERBOSE", "WATERMARK_REGISTRY", "WATERMARK_SPARK_REMOTE", "NO_COLOR"):
        env.pop(key, None)
    # Started from inside WATERMARK_HOME with --fresh, which deletes that folder first: the
    # demo must not lose its working directory (Spark's launcher needs one).
    (root / "watermark").mkdir(parents=True)
    out = subprocess.run(
        [str(SCRIPT), *flags, "demo", "--fresh", "--rounds", "0"],
        cwd=root / "watermark",
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    lines = (out.stdout + out.stderr).splitlines()
    assert out.returncode == 0, "\n".join(lines[-80:])
    return lines, root / "watermark" / "logs" / "demo.log"


def test_the_demo_is_quiet_by_default_and_verbose_with_v(tmp_path: Path) -> None:
    quiet, log = _demo(tmp_path, "quiet")
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

    verbose, verbose_log = _demo(tmp_path, "verbose", "-v")
    shown = "\n".join(verbose)
    assert ":: resolving dependencies" in shown  # Ivy's report
    assert re.search(r"\bWARN\b", shown)  # log4j's WARN lines (Spark's own configuration)
    assert "resolving Delta jars" not in shown  # verbose: Ivy speaks for itself
    assert len(verbose) > len(quiet) + 50
    assert not verbose_log.exists()
