"""Generated declared SQL pipelines equal DataFusion's answer to the same SQL after every
batch (see tests/model/sql_shapes.py): shapes drawn from a grammar of joins, self-joins,
hops, aggregates, subqueries, windows, CTEs and UNION ALL; the ones the loader accepts run
together over one random history, each pipeline's strategy drawn per batch, and are
compared with DataFusion over the pinned snapshots; the refused ones are counted by reason.

The default suite runs seed 1 (10 shapes, 2 steps); `WATERMARK_SQL_SHAPES_SEEDS=7,8`,
`WATERMARK_SQL_SHAPES_STEPS=4` and `WATERMARK_SQL_SHAPES_COUNT=25` pick others, `pytest -m
soak` runs many cases, and `python -m benchmarks.soak --sql` runs them in worker processes.
A mismatch, a failed batch or a query DataFusion cannot run prints the seed, the SQL, the
keys and key paths, and fails the test after the case has checked the other shapes.
"""

import os
from pathlib import Path

import pytest

from tests.model.sql_shapes import SqlStats, run_sql_case

pytestmark = pytest.mark.spark

SEEDS = [int(s) for s in os.environ.get("WATERMARK_SQL_SHAPES_SEEDS", "").split(",") if s] or [1]
STEPS = int(os.environ.get("WATERMARK_SQL_SHAPES_STEPS", "2"))
SHAPES = int(os.environ.get("WATERMARK_SQL_SHAPES_COUNT", "10"))


def _findings(stats: SqlStats) -> str:
    return "\n\n".join(
        [f"MISMATCH {m}" for m in stats.mismatches]
        + [f"RUN-TIME FAILURE {f}" for f in stats.run_failures]
        + [f"DATAFUSION ERROR {e}" for e in stats.datafusion_errors]
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_sql_pipelines_equal_datafusion_after_every_batch(
    spark, tmp_path: Path, seed: int
) -> None:
    stats = run_sql_case(spark, tmp_path, seed, steps=STEPS, shapes=SHAPES)
    print(f"\nsql shapes seed {seed}: {stats.summary()}")
    findings = _findings(stats)
    assert not findings, findings
    # The case exercised what it claims to: every shape checked after several batches.
    assert stats.accepted == SHAPES, stats.summary()
    assert stats.checked == SHAPES, stats.summary()
    assert stats.batches >= STEPS + 2, stats.summary()
    if seed == 1:  # the default case draws shapes the loader refuses; another seed may not
        assert sum(stats.refused.values()) > 0, stats.summary()
    assert stats.incremental_runs > 0, stats.summary()
    assert stats.maintain_runs > 0, stats.summary()  # maintainable shapes drew it
    assert stats.full_runs > 0, stats.summary()


@pytest.mark.soak
def test_sql_shapes_soak(spark, tmp_path: Path) -> None:
    cases = int(os.environ.get("WATERMARK_SOAK_CASES", "15"))
    first = int(os.environ.get("WATERMARK_SOAK_FIRST_SEED", "1000"))
    stats = SqlStats()
    for seed in range(first, first + cases):
        stats.add(run_sql_case(spark, tmp_path, seed, steps=4, shapes=20))
    print(f"\nsql shapes soak: {stats.summary()}")
    findings = _findings(stats)
    assert not findings, findings
