"""Every read mode through the project's read path on a Spark Connect session, and the
session check: ``python -m tests.connect_probe ROOT sc://127.0.0.1:PORT``.

Run in its own process: a Connect client switches PySpark into Connect mode for the whole
process, which must not leak into the test session's classic Spark. Upstreams are written
with delta-rs and pyarrow; the server reads them. Prints one JSON line.
"""

import json
import sys
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream
from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import CursorWindow, ReadMode, VersionRange
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.read.inputs import UpstreamInput
from watermark_dagster.runtime.spark import build_spark_session, session_settings


def _rows(ids: list[int]) -> pa.Table:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "ts": pa.array(
                [start + timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")
            ),
        }
    )


def main(root: Path, remote: str) -> None:
    cdf, appended, cursor = str(root / "cdf"), str(root / "appended"), root / "cursor"
    for i in range(3):  # versions 0, 1, 2 of two rows each
        ids = [i * 10, i * 10 + 1]
        write_deltalake(
            cdf, _rows(ids), mode="append", configuration={"delta.enableChangeDataFeed": "true"}
        )
        write_deltalake(appended, _rows(ids), mode="append")
    cursor.mkdir()
    pq.write_table(_rows(list(range(10))), cursor / "part-0.parquet")

    out: dict[str, object] = {}
    try:
        build_spark_session(remote=remote)
        out["session"] = "accepted"
    except ConfigurationError as e:
        out["session"] = f"refused: {e}"
    # A plain client session (the settings our builder would send) for the reads.
    builder = SparkSession.builder.remote(remote)
    for key, value in session_settings(remote=remote).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    cases = {
        "CDF": (
            DeltaUpstream(name="cdf", path=cdf),
            PlannedInput("cdf", ReadMode.CDF, VersionRange(1, 2), 2),
        ),
        "APPEND_ONLY": (
            DeltaUpstream(name="appended", path=appended),
            PlannedInput("appended", ReadMode.APPEND_ONLY, VersionRange(1, 2), 2),
        ),
        "SNAPSHOT": (
            DeltaUpstream(name="cdf", path=cdf),
            PlannedInput("cdf", ReadMode.SNAPSHOT, VersionRange(0, 1), 1),
        ),
        "TIMESTAMP": (
            CursorUpstream(
                name="cursor",
                path=str(cursor),
                cursor="ts",
                format="parquet",
                tie_break=("id",),
            ),
            PlannedInput("cursor", ReadMode.TIMESTAMP, None, None, CursorWindow(None, None)),
        ),
    }
    for name, (upstream, planned) in cases.items():
        try:
            bound = UpstreamInput.pinned(
                spark, upstream, planned, pin=lambda end, _at: CursorWindow(None, end or ())
            )
            out[name] = {
                "rows": bound.count_rows(),
                "net": bound.net_changes(["id"]).count(),
                "snapshot": bound.snapshot.count(),
                "files_read": bound.files_read,
            }
            bound.release()
        except Exception as e:  # reported to the test, which names the mode
            out[name] = "".join(traceback.format_exception_only(type(e), e)).strip()[:800]
    spark.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
