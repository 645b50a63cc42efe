"""Exactly-once under random histories: the model test (see tests/model/harness.py).

The default suite runs a fixed set of seeds; `pytest -m soak` (or `benchmarks/soak.py`)
runs many more. A failing case prints its seed: `run_case(spark, tmp_path, SEED)` replays it.
"""

import os
from pathlib import Path

import pytest
from deltalake import write_deltalake

from tests.model.harness import Case, Stats, run_case, summary
from watermark_dagster.core.records import BatchStatus

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


def _drain(case: Case) -> None:
    for _ in range(5):
        if not case.cycle():
            return
    raise AssertionError("still planning after 5 cycles")


def test_a_forced_change_after_one_consumer_of_a_shared_upstream_applied_it(
    spark, tmp_path: Path
) -> None:
    """clicks_log (an append) applies the clicks window of batch 2, clicks_copy fails on
    it, so clicks does not advance; `reset -t log --force` abandons the batch. The next
    batch reads the window again: clicks_log must reload in full, not append it twice."""
    case = Case(spark, tmp_path, seed=1)
    case.seed_tables()
    assert case.cycle()
    case._add_clicks(case._new_ids(2), late=False)
    write_deltalake(case.log, case._rows(case._new_ids(2)), mode="append")
    case.failures.failing.add("clicks_copy")
    case.cycle()
    case.failures.failing.clear()
    batch = case.store.open_batch()
    assert batch is not None
    assert "clicks" not in batch.advanced
    case.force("log")
    assert case.store.get_batch(batch.batch_id).status is BatchStatus.ABANDONED
    _drain(case)
    case.verify()
    following = case.store.get_batch(f"b{batch.seq + 1:06d}")
    assert "clicks_log" in following.full_load, following


def test_a_late_first_write_into_a_target_that_did_not_exist_is_reloaded(
    spark, tmp_path: Path
) -> None:
    """Batch 1 is every target's first load; clicks_log and clicks_copy fail, and
    `reset -t src --force` abandons it. Their targets do not exist, so nothing fences
    them, and runs that passed their check before the abandon create them late. The next
    plan finds the batch's write in each target's log and reloads both in full; before,
    the targets looked loaded and the next batch appended the window again."""
    case = Case(spark, tmp_path, seed=2)
    case.seed_tables()
    case.failures.failing.update({"clicks_log", "clicks_copy"})
    case.cycle()
    case.failures.failing.clear()
    batch = case.store.open_batch()
    assert batch is not None
    case.force("src")
    assert case.store.get_batch(batch.batch_id).status is BatchStatus.ABANDONED
    assert case.stats.late_writes == 2
    for target in ("clicks_log", "clicks_copy"):
        assert (tmp_path / target / "_delta_log").exists(), target  # the late writes landed
    _drain(case)
    case.verify()
