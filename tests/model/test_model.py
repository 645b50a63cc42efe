"""Exactly-once under random histories: the model test (see tests/model/harness.py).

The default suite runs a fixed set of seeds; `pytest -m soak` (or `benchmarks/soak.py`)
runs many more. A failing case prints its seed: `run_case(spark, tmp_path, SEED)` replays it.
"""

import os
from pathlib import Path

import pytest

from tests.model.harness import Stats, run_case, summary

pytestmark = pytest.mark.spark

SEEDS = [int(s) for s in os.environ.get("WATERMARK_MODEL_SEEDS", "").split(",") if s] or list(
    range(1, 4)
)


@pytest.fixture(scope="module")
def totals() -> Stats:
    stats = Stats()
    yield stats
    print(f"\nmodel cases: {summary(stats)}")


@pytest.mark.parametrize("seed", SEEDS)
def test_random_histories_leave_every_target_exact(
    spark, tmp_path: Path, seed: int, totals: Stats
) -> None:
    totals.add(run_case(spark, tmp_path, seed))


@pytest.mark.soak
def test_soak(spark, tmp_path: Path) -> None:
    cases = int(os.environ.get("WATERMARK_SOAK_CASES", "500"))
    first = int(os.environ.get("WATERMARK_SOAK_FIRST_SEED", "1000"))
    stats = Stats()
    for seed in range(first, first + cases):
        stats.add(run_case(spark, tmp_path, seed, steps=6))
    print(f"\nsoak: {summary(stats)}")
