"""What a rewrite's write costs against a plain overwrite of the same rows.

Builds the demo-shaped upstreams of :mod:`benchmarks.declared` (``--orders`` rows), then,
per paired repeat, writes ``full_orders_enriched`` over the snapshots three ways, in a
rotated order:

* ``plain``: ``DataFrame.write.mode("overwrite")``, what a recompute does;
* ``rewrite``: :func:`watermark_dagster.write.targets.write_target` as a ``rewrite`` batch
  writes it (an existing target, the batch's Delta transaction, ``_wm_seq`` stamped, the
  duplicate-key check in the write's own job);
* ``rewrite_unchecked``: the same without the duplicate-key check (what it costs).

Prints medians with min-max, Spark jobs per write and the load average.

    .venv/bin/python -m benchmarks.rewrite_write --orders 2M --repeats 5
"""

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from benchmarks.baselines import build_session
from benchmarks.declared import _rows, build_upstreams


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--orders", type=_rows, default=2_000_000, help="orders rows (2M)")
    parser.add_argument("--repeats", type=int, default=5, help="paired repeats (5)")
    args = parser.parse_args(argv)

    import watermark_dagster  # noqa: F401 - build_session then uses the project's session
    import watermark_dagster.write.append_overwrite as append_overwrite
    import watermark_dagster.write.targets as targets
    from watermark_dagster.demo.paths import DemoPaths
    from watermark_dagster.demo.pipelines import build_demo_registry, full_orders_enriched

    spark = build_session("local[2]", {"spark.driver.memory": "4g"}, "bench-rewrite-write")
    spark.sparkContext.setLogLevel("ERROR")
    root = Path(tempfile.mkdtemp(prefix="bench-rewrite-"))
    build_upstreams(spark, root / "upstreams", args.orders)
    pipeline = build_demo_registry(DemoPaths(root / "wm")).pipelines["orders_enriched"]
    pipeline = replace(pipeline, target=str(root / "rewritten"))

    def output():
        orders = spark.read.format("delta").load(str(root / "upstreams" / "orders"))
        customers = spark.read.format("delta").load(str(root / "upstreams" / "customers"))
        return full_orders_enriched(orders, customers)

    seq = [0]

    def plain() -> None:
        output().write.format("delta").mode("overwrite").save(str(root / "plain"))

    def rewrite() -> None:
        seq[0] += 1
        targets.write_target(
            spark, output(), pipeline, batch_id=f"b{seq[0]:06d}", write_seq=seq[0], full_load=True
        )

    def rewrite_unchecked() -> None:
        checked = append_overwrite.refusing_duplicate_keys
        append_overwrite.refusing_duplicate_keys = lambda frame, keys: frame  # type: ignore[assignment]
        try:
            rewrite()
        finally:
            append_overwrite.refusing_duplicate_keys = checked

    writes: dict[str, Callable[[], None]] = {
        "plain": plain,
        "rewrite": rewrite,
        "rewrite_unchecked": rewrite_unchecked,
    }
    rewrite()  # the first load: creates the target, so that each measured write rewrites it
    plain()
    tracker = spark.sparkContext.statusTracker()
    seconds: dict[str, list[float]] = {name: [] for name in writes}
    jobs: dict[str, int] = {}
    print(f"orders {args.orders:,}; load average before {os.getloadavg()}", flush=True)
    names = list(writes)
    for repeat in range(args.repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            group = f"{name}-{repeat}"
            spark.sparkContext.setJobGroup(group, group)
            started = time.perf_counter()
            writes[name]()
            seconds[name].append(time.perf_counter() - started)
            jobs[name] = len(tracker.getJobIdsForGroup(group))
    for name, values in seconds.items():
        ratio = [v / p for v, p in zip(values, seconds["plain"], strict=True)]
        print(
            f"  {name:18} median {statistics.median(values):.2f} s "
            f"({min(values):.2f}-{max(values):.2f}), {jobs[name]} jobs, "
            f"/plain {statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f})"
        )
    print(f"load average after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
