"""Writing targets: same-commit ties, no empty commits, metrics of this write only, and a
merge whose cost follows the change. Real Spark, Delta and Dagster throughout."""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from delta.tables import DeltaTable
from deltalake import write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.lakes import before_images_first
from tests.test_read_modes import Lake, _source_rows, _write
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.read.inputs import UpstreamInput
from watermark_dagster.registry import Upstream

pytestmark = pytest.mark.spark


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        yield Lake(tmp_path, spark, instance)
    finally:
        instance.dispose()


# ------------------------------------------------------------------ same-commit ties


def _restore(lake: Lake, src: str) -> None:
    DeltaTable.forPath(lake.spark, src).restoreToVersion(0)


def _delta_rs_overwrite(lake: Lake, src: str) -> None:
    # No change-data files: Spark derives a delete of every old row and an insert of every
    # new one, all at the same commit version.
    ids = list(range(0, 10))
    write_deltalake(
        src,
        pa.table({"id": pa.array(ids, pa.int64()), "value": pa.array([i * 10 for i in ids])}),
        mode="overwrite",
    )


def _delta_rs_replace_where(lake: Lake, src: str) -> None:
    # delta-rs writes one change-data file holding the inserts, then the deletes.
    ids = [2, 3, 4]
    write_deltalake(
        src,
        pa.table({"id": pa.array(ids, pa.int64()), "value": pa.array([i * 10 for i in ids])}),
        mode="overwrite",
        predicate="id >= 2 AND id <= 4",
    )


def _sync_merge(lake: Lake, src: str) -> None:
    # The "make the table equal this snapshot" MERGE: rows whose value changed do not
    # match, so each is deleted (not matched by source) and re-inserted in one commit.
    wanted = lake.spark.createDataFrame(
        [(i, i * 10 if i % 2 else i) for i in range(0, 9)], "id long, value long"
    )
    (
        DeltaTable.forPath(lake.spark, src)
        .alias("t")
        .merge(wanted.alias("s"), "t.id = s.id AND t.value = s.value")
        .whenNotMatchedInsertAll()
        .whenNotMatchedBySourceDelete()
        .execute()
    )


REWRITES: dict[str, Callable[[Lake, str], None]] = {
    "restore": _restore,
    "delta_rs_overwrite": _delta_rs_overwrite,
    "delta_rs_replace_where": _delta_rs_replace_where,
    "sync_merge": _sync_merge,
}


def _ties(lake: Lake, src: str, start: int, end: int) -> list[Any]:
    """Keys with a delete and an insert at the same commit version in the change feed."""
    feed = (
        lake.spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .option("endingVersion", end)
        .load(src)
    )
    types = F.collect_set("_change_type")
    grouped = feed.groupBy("id", "_commit_version").agg(types.alias("types"))
    both = F.array_contains("types", "delete") & F.array_contains("types", "insert")
    return [r["id"] for r in grouped.where(both).collect()]


@pytest.mark.parametrize("rewrite", sorted(REWRITES))
def test_a_key_removed_and_re_added_in_one_commit_resolves_to_the_state_after_it(
    lake: Lake, rewrite: str
) -> None:
    spark, src = lake.spark, lake.path("src")
    _write(spark, src, range(0, 10), cdf=True)  # v0
    # recompute() reads the pinned snapshot, so ties cannot touch it; one case shows it.
    names = ("copy", "raw", "recomputed") if rewrite == "restore" else ("copy", "raw")
    pipes = [
        {"name": name, "upstreams": ["src"], "target": lake.path(name), "transform": name}
        for name in names
    ]
    spec = lake.spec([{"name": "src", "path": src}], pipes)
    assert len(lake.run(spec).completed) == 1  # the first load

    DeltaTable.forPath(spark, src).update("id = 3", {"value": "300"})  # v1
    REWRITES[rewrite](lake, src)  # v2
    tied = _ties(lake, src, 1, 2)
    assert 3 in tied, f"{rewrite}: expected id 3 deleted and re-added at one version: {tied}"

    [batch_id] = lake.run(spec).completed
    planned = lake.store.get_batch(batch_id).inputs["src"]
    assert (planned.mode, planned.range) == (ReadMode.CDF, VersionRange(1, 2))
    expected = _source_rows(lake, "src")
    for name in names:
        assert lake.rows(name) == expected, f"{rewrite}: target {name} differs"

    # net_changes itself, with the rows served in the order that trips a tie-break on
    # Spark's row order (every delete ahead of the insert of its commit).
    pinned = UpstreamInput.pinned(
        spark, Upstream("src", path=src), PlannedInput("src", ReadMode.CDF, VersionRange(1, 2), 2)
    )
    pinned.__dict__["changes"] = before_images_first(pinned.changes)
    net = {r["id"]: (r["_change_type"], r["value"]) for r in pinned.net_changes(["id"]).collect()}
    assert 3 in net
    for key, (change, value) in net.items():
        assert (change == "delete") == (key not in expected), (rewrite, key, change)
        assert change == "delete" or value == expected[key], (rewrite, key, value)
