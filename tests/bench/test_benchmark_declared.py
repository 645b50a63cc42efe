"""The cost of a declared pipeline (``benchmarks/declared.py``): its batch does no more work
than the same pipeline written by hand, measured with Spark's own plan metrics on the
production path. No timing is asserted."""

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from benchmarks.declared import (
    KEYS,
    PIPELINES,
    JobCounter,
    Lab,
    Ours,
    PlanWork,
    build_upstreams,
    check_targets,
    commit_changes,
    measuring,
)

# Builds three upstreams and runs two production cycles per contender (minutes on 2 cores):
# kept out of the default suite like the other benchmark tests, run with
# `pytest -m slow tests/bench/test_benchmark_declared.py`.
pytestmark = [pytest.mark.spark, pytest.mark.slow]

ORDERS = 2_000  # customers 200, payments 1,000
# The upstreams each pipeline reads whole key by key (they hold the target's keys).
DIRECT = {"orders_enriched": ("orders",), "customer_payments": ("customers", "payments")}


def test_declared_batch_does_no_more_work_than_the_handwritten_one(
    spark: SparkSession, tmp_path: Path
) -> None:
    upstreams = tmp_path / "upstreams"
    sizes = build_upstreams(spark, upstreams, ORDERS)
    names = ["declared", "handwritten"]
    lab = Lab(spark, tmp_path, names)
    work: dict[str, dict[str, list[PlanWork]]] = {n: {} for n in names}
    # Each contender's pipelines measured as the run calls them (the derived transform for
    # the declared ones), on its own control tables and targets.
    ours = {
        n: Ours(spark, measuring(lab.ours[n].registry, work[n]), lab.paths[n].control_root)
        for n in names
    }
    counter = JobCounter(spark)
    for n in names:  # first loads
        while ours[n].cycle(counter, n) is not None:
            pass
        work[n].clear()

    commits = commit_changes(spark, upstreams, fraction=0.01, salt=1)
    versions = {t: c.version for t, c in commits.items()}
    written = {}
    for n in names:
        outcome = ours[n].cycle(counter, n)
        assert outcome is not None
        assert ours[n].committed() == versions
        written[n] = outcome.rows_written
    assert check_targets(spark, upstreams, versions, lab)["equal"] == names
    # The same changes reached the targets.
    assert written["declared"] == written["handwritten"]

    for pipeline in PIPELINES:
        [declared] = work["declared"][pipeline]
        [handwritten] = work["handwritten"][pipeline]
        context = f"{pipeline}: declared {declared}, hand-written {handwritten}"
        # No more upstream files and rows read than by hand.
        assert declared.scans <= handwritten.scans, context
        assert declared.files_scanned <= handwritten.files_scanned, context
        assert declared.rows_scanned <= handwritten.rows_scanned, context
        # No join or aggregate larger than by hand: the direct upstreams' snapshots are cut
        # down to the touched keys before the full transform runs, as the hand-written
        # transform cuts them, so no operator sees a whole direct upstream.
        assert declared.largest_intermediate <= handwritten.largest_intermediate, context
        assert declared.join_rows <= handwritten.join_rows, context
        smallest_direct = min(sizes[u] for u in DIRECT[pipeline])
        assert 0 < declared.largest_intermediate < smallest_direct, context
    assert set(versions) == set(KEYS)


def test_recent_changes_touch_only_the_newest_keys_and_the_floor_matches_the_recompute(
    spark: SparkSession, tmp_path: Path
) -> None:
    from deltalake import DeltaTable as RsTable

    from benchmarks.declared import RECENT_SHARE

    upstreams = tmp_path / "upstreams"
    sizes = build_upstreams(spark, upstreams, ORDERS)
    lab = Lab(spark, tmp_path, ["floor", "recompute"])
    versions = {t: RsTable(str(upstreams / t)).version() for t in KEYS}
    for name in lab.names:
        lab.setup(name, versions)
    commits = commit_changes(spark, upstreams, fraction=0.05, salt=3, profile="recent")
    for table, commit in commits.items():
        # Mostly inserts of new keys; the rest of the changes among the newest keys.
        assert commit.inserted > 2 * (commit.updated + commit.deleted), (table, commit)
        changed = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", commit.version)
            .option("endingVersion", commit.version)
            .load(str(upstreams / table))
            .where("_change_type IN ('update_preimage', 'delete')")
            .select(KEYS[table])
        )
        oldest = min(r[0] for r in changed.collect())
        assert oldest > sizes[table] * (1 - 2 * RECENT_SHARE), (table, oldest)
    versions = {t: c.version for t, c in commits.items()}
    outcome = lab.process("floor", versions)
    # Each pipeline's floor ran in its own job group, and both targets equal the recompute.
    assert set(outcome.pipeline_jobs) == set(PIPELINES)
    assert all(jobs > 0 for jobs in outcome.pipeline_jobs.values())
    lab.process("recompute", versions)
    assert check_targets(spark, upstreams, versions, lab)["equal"] == ["floor", "recompute"]
