"""First load of a large upstream through the real pipeline path, in a fresh process at the
default Spark settings: ``python -m tests.support.first_load ROOT ROWS [CONF_JSON]`` (a JSON
object of Spark settings overrides a default, e.g. ``{"spark.driver.memory": "1g"}``).

The upstream (id, customer_id, amount, ts, a 50-character payload; change data feed on) is
written with delta-rs, so the only JVM is the one the pipeline's run starts through the
code location's default ``SparkSessionResource``. Prints one JSON line: the run's outcome,
the target's row count and the driver's maximum heap.
"""

import hashlib
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from dagster import DagsterInstance
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.dagster_defs.definitions import build_definitions
from watermark_dagster.dagster_defs.headless import HeadlessRunner
from watermark_dagster.dagster_defs.resources import SparkSessionResource, held_spark_sessions

CHUNK = 500_000


def write_upstream(path: str, rows: int) -> None:
    """``rows`` rows in commits of 500k, change data feed on; values as varied as real data
    (a distinct timestamp per row, a payload with a 32-character hash in it)."""
    start = datetime(2025, 1, 1, tzinfo=UTC)
    for offset in range(0, rows, CHUNK):
        ids = range(offset, min(rows, offset + CHUNK))
        digests = [hashlib.md5(str(i).encode()).hexdigest() for i in ids]
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "customer_id": pa.array([(i * 7919) % 100_000 for i in ids], pa.int64()),
                "amount": pa.array([(i * 104_729) % 10_000_000 / 100 for i in ids], pa.float64()),
                "ts": pa.array(
                    [start + timedelta(seconds=(i * 37) % 31_536_000) for i in ids],
                    pa.timestamp("us", tz="UTC"),
                ),
                # 1 + 12 + 1 + 32 + 4 = 50 characters
                "payload": pa.array(
                    [f"p{i:012d}-{d}-{i % 1000:03d}" for i, d in zip(ids, digests, strict=True)]
                ),
            }
        )
        write_deltalake(
            path,
            table,
            mode="append",
            configuration={"delta.enableChangeDataFeed": "true"},
        )


def project(batch):  # BatchContext -> DataFrame
    """A per-row projection of the latest change per id."""
    from pyspark.sql import functions as F

    changes = batch["events"].net_changes(["id"])
    return changes.select(
        "id",
        "customer_id",
        (F.col("amount") * 100).cast("long").alias("amount_cents"),
        "ts",
        F.upper("payload").alias("payload"),
        "_change_type",
        "_commit_version",
    )


def main(root: str, rows: int, conf: dict[str, str] | None = None) -> None:
    base = Path(root)
    upstream = str(base / "events")
    target = str(base / "events_projected")
    write_upstream(upstream, rows)
    registry = Registry(
        upstreams=[DeltaUpstream(name="events", path=upstream)],
        pipelines=[
            Pipeline(
                name="events_projected",
                upstreams=("events",),
                target=target,
                keys=("id",),
                transform=project,
            )
        ],
    )
    # The code location's defaults: the resource as build_definitions would make it.
    defs = build_definitions(
        registry, control_root=str(base / "control"), spark=SparkSessionResource(conf=conf or {})
    )
    os.environ["DAGSTER_HOME"] = str(base / "dagster")
    (base / "dagster").mkdir(exist_ok=True)
    # The outer scope keeps the run's session open after the cycle, to count the target.
    with held_spark_sessions():
        runner = HeadlessRunner(
            defs, DagsterInstance.get(), log=lambda m: print(m, file=sys.stderr)
        )
        report = runner.run_until_idle(max_ticks=3)
        spark = SparkSession.getActiveSession()
        rows_in_target = heap = None
        if spark is not None:
            heap = int(spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory())  # type: ignore[union-attr]
            if report.completed:
                rows_in_target = spark.read.format("delta").load(target).count()
    print(
        json.dumps(
            {
                "completed": report.completed,
                "errors": [r.error for r in report.runs if not r.success],
                "target_rows": rows_in_target,
                "driver_max_heap_bytes": heap,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else None)
