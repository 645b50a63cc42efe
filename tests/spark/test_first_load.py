"""A 2M-row first load at the default Spark settings (slow: `pytest -m slow`)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.spark_sizes import size_bytes
from watermark_dagster.runtime.spark import default_driver_memory


@pytest.mark.spark
@pytest.mark.slow
def test_a_2m_row_first_load_succeeds_at_the_default_settings(tmp_path: Path) -> None:
    """The first load of a 2M-row upstream (id, customer_id, amount, ts, a 50-character
    payload) through the real path — coordinator, Dagster run, SNAPSHOT read, transform,
    MERGE into a new target — in a fresh process at the default Spark settings. At Spark's
    own 1 GiB driver heap this load failed with UNABLE_TO_ACQUIRE_MEMORY (issue 11)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.first_load", str(tmp_path), "2000000"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["errors"] == [], out
    assert out["completed"] == ["b000001"], out
    assert out["target_rows"] == 2_000_000
    # The JVM really got the default heap (maxMemory is the heap less one survivor space).
    configured = size_bytes(default_driver_memory())
    assert 0.85 * configured <= out["driver_max_heap_bytes"] <= configured
