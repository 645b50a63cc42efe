"""Warehouse loads: Spark's JDBC writer against a driver-side ``COPY``, per batch size.

One command starts a PostgreSQL server (Debian's, as the tests do:
:func:`tests.support.databases.postgres`) and one local[2] Spark session, then, per size
``N`` and repeat, loads the same rows into ``bench.orders`` through
:func:`~watermark_dagster.write.warehouse.write_warehouse` (staging, checks, the
transaction with its state row, all timed as one call) by each contender, in an order
alternated from repeat to repeat:

* ``jdbc``: ``load: jdbc``, the rows staged by Spark's JDBC writer from the executors;
* ``copy``: ``load: copy``, the rows streamed by the driver with ``COPY ... FROM STDIN``.

Two cases per size, each contender running both in turn on the same data:

* ``first load``: ``N`` rows into an empty database (schema ``bench`` dropped before the
  load, so the table and the state table are created by it);
* ``merge``: ``N/10`` changed rows (half updates of existing ids spread over the table,
  half new ids) into the table of ``N`` rows the contender's first load just left: the
  realistic CDC batch.

The rows (id bigint, customer_id bigint, amount decimal(12,2), status string, updated_at
timestamp with microseconds) are made with ``spark.range``, cached and counted before any
timing. After every load the table is compared with what it must hold (row count, rows of
the batch, and a sum of an md5 of every row's text, computed by Spark from the frames and by
PostgreSQL from the table); a difference stops the run with exit 1. Each load's staging is
timed too (from the load's own "staged" log line), so the table splits a load into staging
and the rest (checks, transaction, commit). One untimed round of each contender warms the
JVM and the driver first.

Prints per size and case the median seconds and min-max of each contender, the paired
ratio copy/jdbc, and the load average; writes JSON with ``--out``. A load that raises stops
the run with exit 1, saying which contender, batch and step (before or after staging).

``--socket-timeout`` raises, for this process only, the seconds the warehouse connection
waits for one statement's answer: the connection keeps its 10 s connect timeout
(``observe/database_state.CONNECT_SECONDS``) as its socket timeout, and the upsert of a
1M-row first load can take longer on a busy machine (a bare ``TimeoutError``).

    .venv/bin/python -m benchmarks.warehouse                      # 100k and 1M rows, 3 repeats
    .venv/bin/python -m benchmarks.warehouse --socket-timeout 300  # as docs/benchmarks.md ran it
    .venv/bin/python -m benchmarks.warehouse --sizes 10k,20k,50k --repeats 5  # the crossover
"""

import argparse
import json
import logging
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.baselines import build_session
from benchmarks.declared import _rows
from benchmarks.incremental import machine, spark_description

CONTENDERS = {
    "jdbc": "load: jdbc, the rows staged by Spark's JDBC writer from the executors "
    "(batchsize 10,000, one connection per partition)",
    "copy": "load: copy, the rows streamed from the driver with COPY ... FROM STDIN "
    "(toLocalIterator, text format)",
}
CASES = {
    "first": "N rows into an empty database (schema dropped before: table and state created)",
    "merge": "N/10 changed rows (half updates of existing ids, half new ids) into the table of "
    "N rows the same contender's first load left",
}
SCHEMA = "bench"
TABLE = f"{SCHEMA}.orders"
PIPELINE = "orders_wh"
ROOT = "bench"
STATUSES = ("new", "paid", "shipped", "returned", "cancelled")
EPOCH_MICROS = 1_767_225_600_000_000  # 2026-01-01 UTC
YEAR_MICROS = 365 * 86_400 * 1_000_000
WARMUP_ROWS = 5_000
LOGGER = "watermark_dagster"


@dataclass
class Load:
    """One timed ``write_warehouse`` call."""

    seconds: float
    stage_seconds: float
    how: str
    inserted: int
    updated: int


class TableMismatch(Exception):
    """The table differs from what the load must leave: the figures are void."""


class LoadFailed(Exception):
    """A load raised: where (contender, batch, before or after staging) and what."""


class _Staged(logging.Handler):
    """Notes when a load's rows are staged (its "staged in ... by ..." line) and how."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.at: float | None = None
        self.how: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if "staged in" in str(record.msg):
            self.at = time.perf_counter()
            self.how = str(record.args[-1]) if isinstance(record.args, tuple) else None


# ---------------------------------------------------------------------------------------
# The rows.


def orders(spark: SparkSession, first_id: int, rows: int, salt: int) -> DataFrame:
    """``rows`` orders from id ``first_id``, every value derived from the id and ``salt``
    by hashing (a size and salt always give the same rows)."""

    def hashed(modulo: int, offset: int) -> Column:
        return F.pmod(F.xxhash64("id", F.lit(salt * 10 + offset)), F.lit(modulo))

    status = F.element_at(
        F.array(*[F.lit(s) for s in STATUSES]), (hashed(len(STATUSES), 3) + 1).cast("int")
    )
    return spark.range(first_id, first_id + rows).select(
        F.col("id"),
        (hashed(50_000, 1) + 1).alias("customer_id"),
        (hashed(10_000_000, 2) / 100).cast("decimal(12,2)").alias("amount"),
        status.alias("status"),
        F.timestamp_micros(F.lit(EPOCH_MICROS) + hashed(YEAR_MICROS, 4)).alias("updated_at"),
    )


def changes(spark: SparkSession, rows: int) -> DataFrame:
    """``rows/10`` changes to the table of ``rows`` orders: every 20th id updated (new
    values), and as many new ids after the last."""
    updates = orders(spark, 0, rows, salt=2).where(F.col("id") % 20 == 7)
    inserts = orders(spark, rows, rows // 20, salt=2)
    return updates.unionByName(inserts)


def _digest_text(columns: Sequence[Column]) -> Column:
    return F.conv(F.substring(F.md5(F.concat_ws("|", *columns)), 1, 15), 16, 10)


def expected(frame: DataFrame) -> tuple[int, Decimal]:
    """Row count and digest sum of ``frame`` as the table must hold it (the timestamp as
    microseconds since the epoch, the decimal as its text)."""
    digest = _digest_text(
        [
            F.col("id").cast("string"),
            F.col("customer_id").cast("string"),
            F.col("amount").cast("string"),
            F.col("status"),
            F.unix_micros("updated_at").cast("string"),
        ]
    ).cast("decimal(38,0)")
    row = frame.agg(F.count(F.lit(1)), F.sum(digest)).collect()[0]
    return int(row[0]), Decimal(row[1] or 0)


TABLE_DIGEST = (
    "SELECT count(*), coalesce(sum(('x' || substr(md5(concat_ws('|', id::text, "
    "customer_id::text, amount::text, status, ((extract(epoch FROM updated_at) * 1000000)"
    "::bigint)::text)), 1, 15))::bit(60)::bigint::numeric), 0), count(*) FILTER (WHERE "
    "_wm_batch_id = '{batch}') FROM " + TABLE
)


# ---------------------------------------------------------------------------------------
# One load.


class Bench:
    """The server, the session and the sequence of batch positions."""

    def __init__(self, spark: SparkSession, db: Any, out: Callable[[str], None]) -> None:
        from watermark_dagster.config.pipeline import Pipeline
        from watermark_dagster.config.secrets import EnvRef
        from watermark_dagster.config.warehouse import PostgresTarget

        self.spark, self.db, self.out = spark, db, out
        self.seq = 0
        self.staged = _Staged()
        logger = logging.getLogger(LOGGER)
        logger.addHandler(self.staged)
        logger.setLevel(logging.INFO)

        def pipeline(load: str) -> Any:
            target = PostgresTarget(
                url=db.url,
                table=TABLE,
                user=EnvRef("WH_USER"),
                password=EnvRef("WH_PASSWORD"),
                load=load,  # type: ignore[arg-type]
            )
            return Pipeline(
                name=PIPELINE,
                upstreams=("orders",),
                warehouse=target,
                keys=("id",),
                transform=lambda b: None,
            )

        self.pipeline = pipeline

    def reset(self) -> None:
        """Drop the schema (table, state table, any stage): the next load starts empty."""
        self.db.sql(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")

    def load(
        self, contender: str, frame: DataFrame, want: tuple[int, Decimal], batch_rows: int
    ) -> Load:
        """Load ``frame`` by ``contender`` through ``write_warehouse`` (a fresh pipeline),
        timed as one call, then check the table against ``want``.

        Raises:
            TableMismatch: the table does not hold ``want``, or not ``batch_rows`` rows of
                this batch, or the load staged by another route than asked.
            LoadFailed: ``write_warehouse`` raised (the cause chained).
        """
        from watermark_dagster.write.warehouse import write_warehouse

        pipeline = self.pipeline(contender)
        self.seq += 1
        batch_id = f"b{self.seq:06d}"
        self.staged.at = self.staged.how = None
        started = time.perf_counter()
        try:
            result = write_warehouse(
                self.spark,
                frame,
                pipeline,
                batch_id=batch_id,
                write_seq=self.seq,
                full_load=False,
                root=ROOT,
            )
        except Exception as e:  # any error: the figures stop here, saying where
            when = "after staging" if self.staged.at is not None else "before staging ended"
            raise LoadFailed(
                f"{contender} batch {batch_id} ({batch_rows:,} rows) failed "
                f"{time.perf_counter() - started:.1f}s into the load, {when}: "
                f"{type(e).__name__}: {e}"
            ) from e
        ended, staged_at = time.perf_counter(), self.staged.at
        if staged_at is None or self.staged.how != contender:
            raise TableMismatch(
                f"{contender}: the load staged by {self.staged.how!r}, not {contender!r}"
            )
        count, digest, of_batch = self.db.sql(TABLE_DIGEST.format(batch=batch_id))[0]
        found = (int(count), Decimal(digest))
        if found != want or int(of_batch) != batch_rows:
            raise TableMismatch(
                f"{contender} batch {batch_id}: the table holds {found[0]:,} rows (digest "
                f"{found[1]}), {int(of_batch):,} of the batch; expected {want[0]:,} rows "
                f"(digest {want[1]}), {batch_rows:,} of the batch"
            )
        return Load(
            seconds=ended - started,
            stage_seconds=staged_at - started,
            how=contender,
            inserted=result.rows_inserted,
            updated=result.rows_updated,
        )


# ---------------------------------------------------------------------------------------
# Running, summarizing, reporting.


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def run_size(bench: Bench, rows: int, repeats: int, size: dict[str, Any]) -> None:
    """Both cases for ``rows``, ``repeats`` paired repeats (order alternated), recorded
    into ``size`` as they go (a failed load keeps what was measured before it)."""
    out, spark = bench.out, bench.spark
    first = orders(spark, 0, rows, salt=1).cache()
    changed = changes(spark, rows).cache()
    counted = (first.count(), changed.count())
    after = first.join(changed.select("id"), "id", "left_anti").unionByName(changed)
    want = {"first": expected(first), "merge": expected(after)}
    out(f"\n== {counted[0]:,} rows; merge of {counted[1]:,} changed rows ({rows // 20:,} "
        f"updates, {rows // 20:,} new); load average {_load()}")  # fmt: skip
    names = list(CONTENDERS)
    records: list[dict[str, Any]] = []
    size.update(rows=counted[0], changed_rows=counted[1], repeats=records)
    for repeat in range(repeats):
        order = names[repeat % 2 :] + names[: repeat % 2]
        record: dict[str, Any] = {"repeat": repeat + 1, "order": order, "loads": {}}
        for name in order:
            bench.reset()
            loads = {
                "first": bench.load(name, first, want["first"], counted[0]),
                "merge": bench.load(name, changed, want["merge"], counted[1]),
            }
            record["loads"][name] = {case: vars(load) for case, load in loads.items()}
            out(f"  repeat {repeat + 1}/{repeats} {name}: first load "
                f"{loads['first'].seconds:7.2f}s (staged {loads['first'].stage_seconds:.2f}s), "
                f"merge {loads['merge'].seconds:6.2f}s (staged "
                f"{loads['merge'].stage_seconds:.2f}s; {loads['merge'].inserted:,} inserted, "
                f"{loads['merge'].updated:,} updated)")  # fmt: skip
        record["loadavg"] = list(os.getloadavg())
        records.append(record)
    first.unpersist()
    changed.unpersist()
    bench.reset()
    size["summary"] = summarize(records, {"first": counted[0], "merge": counted[1]})


def _values(records: list[dict[str, Any]], name: str, case: str, key: str) -> list[float]:
    return [r["loads"][name][case][key] for r in records]


def summarize(records: list[dict[str, Any]], batch_rows: dict[str, int]) -> dict[str, Any]:
    """Per case: each contender's seconds and staging seconds, and the paired copy/jdbc."""
    summary: dict[str, Any] = {}
    for case, rows in batch_rows.items():
        copy, jdbc = (_values(records, n, case, "seconds") for n in ("copy", "jdbc"))
        summary[case] = {
            "batch_rows": rows,
            "seconds": {n: _spread(_values(records, n, case, "seconds")) for n in CONTENDERS},
            "stage_seconds": {
                n: _spread(_values(records, n, case, "stage_seconds")) for n in CONTENDERS
            },
            "copy/jdbc": _spread([c / j for c, j in zip(copy, jdbc, strict=True)]),
        }
    return summary


def _cell(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def print_table(out: Callable[[str], None], sizes: list[dict[str, Any]]) -> None:
    out("\nsize | case | batch rows | jdbc s | copy s | copy/jdbc, paired | staging s jdbc / copy")
    out(" | ".join("---" for _ in range(7)))
    for size in sizes:
        for case, s in size["summary"].items():
            label = "first load" if case == "first" else "merge into filled"
            stage = s["stage_seconds"]
            out(f"{size['rows']:,} | {label} | {s['batch_rows']:,} | {_cell(s['seconds']['jdbc'])}"
                f" | {_cell(s['seconds']['copy'])} | {s['copy/jdbc']['median']:.2f}x "
                f"({s['copy/jdbc']['min']:.2f}-{s['copy/jdbc']['max']:.2f}) | "
                f"{stage['jdbc']['median']:.2f} / {stage['copy']['median']:.2f}")  # fmt: skip


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _sizes(text: str) -> list[int]:
    sizes = sorted({_rows(t) for t in text.split(",") if t.strip()})
    if not sizes:
        raise argparse.ArgumentTypeError(f"no sizes in {text!r}")
    return sizes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.warehouse",
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", type=_sizes, default=[100_000, 1_000_000],
                        help="comma-separated rows of the first load (100k,1M); the merge "
                        "changes a tenth of them")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="paired repeats (3)")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory (4g)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--socket-timeout", type=int, default=None, help="seconds the "
                        "warehouse connection waits for the server's answer to one statement "
                        "(default: the product's, observe/database_state.CONNECT_SECONDS, 10 s, "
                        "which a 1M-row upsert on a busy machine can exceed)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.socket_timeout is not None and args.socket_timeout <= 0:
        parser.error("--socket-timeout must be above 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = lambda line: print(line, flush=True)  # noqa: E731
    started_at, started = datetime.now(UTC), time.monotonic()

    import watermark_dagster  # noqa: F401 - build_session then uses the project's session
    from tests.support.databases import postgres
    from watermark_dagster.observe import database_state
    from watermark_dagster.runtime.jdbc import JDBC_DRIVERS_KEY

    if args.socket_timeout is not None:
        # pg8000 keeps its connect timeout as the socket's timeout for every later read, so
        # one statement answering later than it fails the load with a TimeoutError.
        database_state.CONNECT_SECONDS = args.socket_timeout

    settings = {
        "master": "local[2]",
        "conf": {"spark.driver.memory": args.driver_memory, JDBC_DRIVERS_KEY: "true"},
    }
    spark = build_session(settings["master"], settings["conf"], "bench-warehouse")
    spark.sparkContext.setLogLevel("ERROR")
    result: dict[str, Any] = {
        "benchmark": "warehouse",
        "command": [
            Path(sys.executable).name,
            "-m",
            "benchmarks.warehouse",
            *(sys.argv[1:] if argv is None else argv),
        ],
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": machine(),
        "spark": spark_description(spark, settings),
        "contenders": CONTENDERS,
        "cases": CASES,
        "repeats_requested": args.repeats,
        "socket_timeout_seconds": database_state.CONNECT_SECONDS,
        "loadavg_before": list(os.getloadavg()),
        "sizes": [],
        "stopped": None,
    }
    m = result["machine"]
    out(f"machine: {m['cpus']} cores, {m.get('cpu', '?')}, {m['java']}, commit {m['commit']}; "
        f"load average {_load()}")  # fmt: skip
    code = 0
    try:
        with postgres() as db:
            server = db.sql("SHOW server_version")[0][0]
            result["postgresql"] = server
            out(f"PostgreSQL {server} at {db.url} (fsync off, as the tests start it); "
                f"warehouse socket timeout {database_state.CONNECT_SECONDS:g} s")  # fmt: skip
            os.environ["WH_USER"] = "watermark"
            os.environ["WH_PASSWORD"] = db.password
            bench = Bench(spark, db, out)
            warm = orders(spark, 0, WARMUP_ROWS, salt=9).cache()
            want = expected(warm)
            for name in CONTENDERS:  # untimed: JIT, driver classes, the first connections
                bench.reset()
                bench.load(name, warm, want, WARMUP_ROWS)
            warm.unpersist()
            for rows in args.sizes:
                size: dict[str, Any] = {}
                result["sizes"].append(size)
                run_size(bench, rows, args.repeats, size)
    except TableMismatch as e:
        result["stopped"], code = f"TableMismatch: {e}", 1
    except Exception as e:  # a failed load: reported as where and why the run stopped
        result["stopped"], code = f"{type(e).__name__}: {e}", 1
        result["traceback"] = traceback.format_exc()
        print(result["traceback"], file=sys.stderr, flush=True)
    finally:
        spark.stop()
        result["loadavg_after"] = list(os.getloadavg())
        result["seconds"] = round(time.monotonic() - started, 1)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    done = [s for s in result["sizes"] if "summary" in s]
    if done:
        print_table(out, done)
    if result["stopped"]:
        out(f"\nSTOPPED: {result['stopped']}")
    before = " ".join(f"{v:.2f}" for v in result["loadavg_before"])
    out(f"\nload average {before} before, {_load()} after; total "
        f"{result['seconds'] / 60:.1f} min")  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main())
