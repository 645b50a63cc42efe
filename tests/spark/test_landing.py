"""Landing-folder upstreams with real Spark, Delta and Dagster: each file is loaded once.

Each location is driven by the real coordinator and finalizer sensors (HeadlessRunner);
the target is compared with a full read of every file after each batch.
"""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.support.spark_lake import Lake, batch_metadata, open_lake
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.core.records import BatchStatus

pytestmark = pytest.mark.spark


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


def write_csv(
    folder: Path, name: str, rows: list[tuple[int, int]], *, mtime: float | None = None
) -> Path:
    """A small CSV file of ``id,value`` rows (no header)."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{i},{v}\n" for i, v in rows))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def landing_spec(lake: Lake, folder: Path, **settings: object) -> dict:
    upstream = {
        "name": "drops",
        "kind": "landing",
        "path": str(folder),
        "format": "csv",
        "file_schema": "id BIGINT, value BIGINT",
        "settle_seconds": 0,
        **settings,
    }
    pipes = [
        {
            "name": "drops_copy",
            "upstreams": ["drops"],
            "target": lake.path("copy"),
            "transform": "copy",
        }
    ]
    return lake.spec([upstream], pipes)


def all_files(lake: Lake, folder: Path) -> dict[int, int]:
    """The ids and values of a full read of every file in the folder."""
    rows = (
        lake.spark.read.schema("id BIGINT, value BIGINT")
        .csv([str(p) for p in sorted(folder.rglob("*.csv"))])
        .collect()
    )
    return {r["id"]: r["value"] for r in rows}


def test_new_files_are_loaded_once_batch_after_batch(lake: Lake) -> None:
    folder = lake.root / "landing"
    write_csv(folder, "a.csv", [(1, 10), (2, 20)])
    write_csv(folder, "b.csv", [(3, 30)])
    spec = landing_spec(lake, folder)
    [b1] = lake.run(spec).completed
    assert lake.rows("copy") == all_files(lake, folder)
    first = lake.store.get_batch(b1).inputs["drops"]
    assert (first.mode, first.range) == (ReadMode.SNAPSHOT, VersionRange(0, 2))

    # A file copied in with an old modification time is new all the same.
    write_csv(folder, "old/c.csv", [(4, 40)], mtime=1_000_000)
    write_csv(folder, "d.csv", [(5, 50), (1, 11)])
    [b2] = lake.run(spec).completed
    second = lake.store.get_batch(b2).inputs["drops"]
    assert (second.mode, second.range) == (ReadMode.APPEND_ONLY, VersionRange(3, 4))
    assert batch_metadata(lake, "drops_copy", b2)["drops/rows_read"] == 3
    assert lake.rows("copy") == all_files(lake, folder)
    assert lake.run(spec).completed == []  # nothing new: no batch
    assert lake.store.get_batch(b2).status is BatchStatus.COMPLETED
    assert lake.store.committed_versions()["drops"] == 4
    print(json.dumps({"ok": True}))
