"""The incremental benchmark (``benchmarks/incremental.py``): its quick run works end to end
and its correctness check catches a target that differs. No timing is asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from benchmarks.baselines import recompute
from benchmarks.incremental import (
    CONTENDERS,
    RATIOS,
    RECENT_SHARE,
    TargetMismatch,
    build_upstream,
    check_targets,
    commit_change,
)
from tests.conftest import REPO

# A smoke run of a benchmark (minutes on 2 cores): kept out of the default suite, run
# with `pytest -m slow tests/bench/test_benchmark_incremental.py`.
pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_quick_run_has_every_contender_apply_the_same_commit(tmp_path: Path) -> None:
    out = tmp_path / "incremental.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.incremental", "--quick", "--out", str(out),
         "--root", str(tmp_path / "work")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["correct"] is True
    assert result["stopped"] is None
    assert result["spark"]["spark.master"] == "local[2]"
    assert result["contenders"] == list(CONTENDERS)
    [size] = result["sizes"]
    assert size["rows"] == 50_000
    assert len(size["loadavg_before"]) == len(size["loadavg_after"]) == 3
    assert size["first_check"]["equal"] == sorted(CONTENDERS)
    [change] = size["changes"]
    assert change["fraction"] == 0.01
    [repeat] = change["repeats"]
    # One upstream MERGE commit of 1% of 50k rows: 40% updates, 30% deletes, 30% inserts.
    assert repeat["upstream_change"] == {"updated": 200, "deleted": 150, "inserted": 150}
    assert sorted(repeat["order"]) == sorted(CONTENDERS)
    assert set(repeat["seconds"]) == set(CONTENDERS)
    assert all(seconds > 0 for seconds in repeat["seconds"].values())
    # Every target was checked against the recompute of the measured commit.
    assert repeat["check"] == {
        "version": repeat["upstream_version"],
        "rows": 50_000,
        "equal": sorted(CONTENDERS),
    }
    # Delta's own metrics: each merging contender applied exactly that commit, once.
    for name in ("ours_warm", "ours_cold", "ours_connect", "streaming_warm", "streaming_cold"):
        merge = repeat["merge"][name]
        assert merge["merge_commits"] >= 1, name
        assert merge["numTargetRowsUpdated"] == 200, name
        assert merge["numTargetRowsDeleted"] == 150, name
        assert merge["numTargetRowsInserted"] == 150, name
        assert "numTargetRowsCopied" in merge, name
        assert "numTargetFilesAdded" in merge, name
    summary = change["summary"]
    assert set(summary["seconds"]) == set(CONTENDERS)
    assert set(summary["ratios"]) == {label for label, _, _ in RATIOS}
    for spread in [*summary["seconds"].values(), *summary["ratios"].values()]:
        assert spread["min"] <= spread["median"] <= spread["max"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert result["plot"].startswith("no plot: matplotlib is missing")
    else:
        assert Path(result["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_check_targets_fails_loudly_on_any_difference(spark: SparkSession, tmp_path: Path) -> None:
    upstream = str(tmp_path / "upstream")
    version = build_upstream(spark, upstream, 100)
    changed, duplicated = str(tmp_path / "changed"), str(tmp_path / "duplicated")
    for path in (changed, duplicated):
        recompute(spark, upstream, path, version)
    both = {"changed": changed, "duplicated": duplicated}
    assert check_targets(spark, upstream, version, both)["equal"] == ["changed", "duplicated"]

    DeltaTable.forPath(spark, changed).update(
        condition=F.col("id") == 7, set={"amount_cents": F.lit(-1)}
    )
    with pytest.raises(TargetMismatch, match=r"target of changed .*'amount_cents': -1"):
        check_targets(spark, upstream, version, both)

    one_row = spark.read.format("delta").load(duplicated).where(F.col("id") == 3)
    one_row.write.format("delta").mode("append").save(duplicated)
    with pytest.raises(TargetMismatch, match=r"target of duplicated .*101 rows against 100"):
        check_targets(spark, upstream, version, {"duplicated": duplicated})


def test_recent_changes_update_and_delete_only_the_newest_ids(
    spark: SparkSession, tmp_path: Path
) -> None:
    upstream = str(tmp_path / "upstream")
    version = build_upstream(spark, upstream, 2_000)
    change = commit_change(
        spark, upstream, size=2_000, fraction=0.01, salt=1, next_id=2_000, pattern="recent"
    )
    assert (change.updated, change.deleted, change.inserted) == (8, 6, 6)
    rows = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", change.version)
        .load(upstream)
        .where(F.col("_change_type").isin("update_preimage", "delete"))
    )
    assert rows.count() == 14
    # Every updated or deleted id is among the newest RECENT_SHARE of the 2,000 ids.
    assert rows.agg(F.min("id")).first()[0] >= 2_000 * (1 - RECENT_SHARE)
    assert version == change.version - 1
