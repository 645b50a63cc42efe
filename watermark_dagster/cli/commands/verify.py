"""``watermark verify``: a pipeline's target against a recompute from its upstreams.

The recompute feeds the pipeline's transform every upstream as a full snapshot at the
versions the target should reflect (the committed watermarks, or the open batch's ends
when the pipeline already applied that batch). Both sides are compared on the target's
columns without the framework's ``_wm_`` columns: row count and an order-independent
checksum first (two Spark actions), and only when those differ, the rows each side has
that the other has not, with a few example keys.
"""

import argparse
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from watermark_dagster.cli.context import EXIT_FAILED, EXIT_OK, Context, Refusal
from watermark_dagster.cli.parser import add_command
from watermark_dagster.core.columns import RESERVED_PREFIX

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

EXAMPLES = 5


@dataclass(frozen=True)
class Comparison:
    """A target compared with its recompute."""

    columns: tuple[str, ...]
    target_rows: int
    recompute_rows: int
    target_checksum: str
    recompute_checksum: str
    only_in_target: int = 0
    only_in_recompute: int = 0
    columns_only_in_target: tuple[str, ...] = ()
    columns_only_in_recompute: tuple[str, ...] = ()
    example_keys: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        """True when both sides hold the same rows (as a multiset) and the same columns."""
        return (
            self.target_rows == self.recompute_rows
            and self.target_checksum == self.recompute_checksum
            and not self.columns_only_in_target
            and not self.columns_only_in_recompute
        )


def _fingerprint(df: "DataFrame", columns: Sequence[str]) -> tuple[int, str]:
    """Row count and an order-independent checksum: the sum of each row's 64-bit hash."""
    from pyspark.sql import functions as F

    row_hash = F.xxhash64(F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns])))
    [row] = df.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(row_hash.cast("decimal(38,0)")).alias("total"),
    ).collect()
    total = int(row["total"] or 0) % 2**64
    return int(row["rows"]), f"{total:016x}"


def compare_with_recompute(
    target: "DataFrame", recompute: "DataFrame", *, keys: Sequence[str]
) -> Comparison:
    """Compare ``target`` with ``recompute`` on the target's non-``_wm_`` columns.

    The recompute's columns are cast to the target's types, so an int the transform
    produces and the long the target stores compare equal.
    """
    from pyspark import StorageLevel

    wanted = [c for c in target.columns if not c.startswith(RESERVED_PREFIX)]
    produced = [c for c in recompute.columns if not c.startswith(RESERVED_PREFIX)]
    columns = [c for c in wanted if c in produced]
    types = {f.name: f.dataType for f in target.schema.fields}
    left = target.select(*[f"`{c}`" for c in columns])
    right = recompute.select(*[recompute[f"`{c}`"].cast(types[c]).alias(c) for c in columns])
    right = right.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        target_rows, target_sum = _fingerprint(left, columns)
        recompute_rows, recompute_sum = _fingerprint(right, columns)
        result = Comparison(
            columns=tuple(columns),
            target_rows=target_rows,
            recompute_rows=recompute_rows,
            target_checksum=target_sum,
            recompute_checksum=recompute_sum,
            columns_only_in_target=tuple(c for c in wanted if c not in produced),
            columns_only_in_recompute=tuple(c for c in produced if c not in wanted),
        )
        if (target_rows, target_sum) == (recompute_rows, recompute_sum):
            return result
        key_cols = [k for k in keys if k in columns] or columns[:3]
        only_target = left.exceptAll(right)
        only_recompute = right.exceptAll(left)

        def examples(df: "DataFrame") -> list[dict[str, Any]]:
            rows = df.select(*[f"`{k}`" for k in key_cols]).limit(EXAMPLES).collect()
            return [r.asDict() for r in rows]

        return replace(
            result,
            only_in_target=only_target.count(),
            only_in_recompute=only_recompute.count(),
            example_keys={
                "only_in_target": examples(only_target),
                "only_in_recompute": examples(only_recompute),
            },
        )
    finally:
        right.unpersist()


def _versions(ctx: Context, name: str) -> tuple[dict[str, int], str]:
    """The upstream versions the target should reflect now, and why.

    The committed watermarks, unless the pipeline already applied the open batch (its
    other consumers have not yet): then that batch's end versions.
    """
    from watermark_dagster.core.records import CheckpointStatus

    store = ctx.store
    upstreams = ctx.registry.upstreams
    versioned = [u for u in ctx.registry.pipelines[name].upstreams if not upstreams[u].is_cursor]
    batch = store.open_batch()
    if batch is not None and name in batch.pipelines:
        attempts = store.checkpoints(batch_id=batch.batch_id, pipeline=name)
        ends = {
            u: v
            for u in versioned
            if u in batch.inputs and (v := batch.inputs[u].snapshot_version) is not None
        }
        if len(ends) == len(versioned) and any(
            c.status is CheckpointStatus.SUCCESS for c in attempts
        ):
            return ends, f"the open batch {batch.batch_id}, which {name} already applied"
    committed = store.committed_versions()
    found = {u: v for u in versioned if (v := committed.get(u)) is not None}
    missing = [u for u in versioned if u not in found]
    if missing:
        raise Refusal(
            f"upstream(s) {missing} of pipeline {name!r} have nothing committed (never run, or "
            "reset), so there is no version to recompute at. Run a batch first "
            "(`watermark run`), then verify."
        )
    return found, "the committed watermarks"


def cmd_verify(ctx: Context) -> int:
    from deltalake import DeltaTable

    from watermark_dagster.operations.run_pipeline import recompute_pipeline

    name = ctx.args.pipeline
    pipeline = ctx.registry.pipelines.get(name)
    if pipeline is None:
        raise Refusal(
            f"unknown pipeline {name!r}; the code location has {sorted(ctx.registry.pipelines)}."
        )
    versions, basis = _versions(ctx, name)
    storage = dict(pipeline.storage_options or {}) or None
    exists = DeltaTable.is_deltatable(pipeline.target, storage_options=storage)
    result: dict[str, Any] = {
        "pipeline": name,
        "target": pipeline.target,
        "versions": versions,
        "basis": basis,
    }
    if exists:
        spark = ctx.spark()
        try:
            with contextlib.suppress(Exception):  # Spark Connect has no SparkContext
                spark.sparkContext.setLogLevel("ERROR")
            target = spark.read.format("delta").load(pipeline.target)
            recompute = recompute_pipeline(spark, ctx.registry, name, versions)
            comparison = compare_with_recompute(target, recompute, keys=pipeline.keys)
        finally:
            spark.stop()
        result.update(
            equal=comparison.equal,
            target_exists=True,
            columns=list(comparison.columns),
            target_rows=comparison.target_rows,
            recompute_rows=comparison.recompute_rows,
            target_checksum=comparison.target_checksum,
            recompute_checksum=comparison.recompute_checksum,
            only_in_target=comparison.only_in_target,
            only_in_recompute=comparison.only_in_recompute,
            columns_only_in_target=list(comparison.columns_only_in_target),
            columns_only_in_recompute=list(comparison.columns_only_in_recompute),
            example_keys=dict(comparison.example_keys),
        )
    else:
        result.update(equal=False, target_exists=False)
    if ctx.args.json:
        ctx.console.json(result)
        return EXIT_OK if result["equal"] else EXIT_FAILED
    _print(ctx, result)
    return EXIT_OK if result["equal"] else EXIT_FAILED


def _print(ctx: Context, r: dict[str, Any]) -> None:
    at = ", ".join(f"{u}={v}" for u, v in r["versions"].items())
    ctx.console.print(f"pipeline {r['pipeline']}: target {r['target']}")
    ctx.console.print(f"recomputed from its upstreams at {at} ({r['basis']})\n")
    if not r["target_exists"]:
        ctx.console.print(ctx.console.paint("DIFFERENT: the target table does not exist", "bad"))
        return
    ctx.console.table(
        ["", "target", "recompute"],
        [
            ["rows", r["target_rows"], r["recompute_rows"]],
            ["checksum", r["target_checksum"], r["recompute_checksum"]],
        ],
    )
    ctx.console.print()
    if r["equal"]:
        ctx.console.print(ctx.console.paint("EQUAL", "ok") + f" on columns {r['columns']}")
        return
    ctx.console.print(
        ctx.console.paint("DIFFERENT", "bad")
        + f": {r['only_in_target']} row(s) only in the target, "
        f"{r['only_in_recompute']} row(s) only in the recompute"
    )
    for side in ("target", "recompute"):
        if r[f"columns_only_in_{side}"]:
            ctx.console.print(f"  columns only in the {side}: {r[f'columns_only_in_{side}']}")
    for side, label in (("only_in_target", "target"), ("only_in_recompute", "recompute")):
        keys = r["example_keys"].get(side) or []
        if keys:
            shown = "; ".join(", ".join(f"{k}={v}" for k, v in row.items()) for row in keys)
            ctx.console.print(f"  e.g. only in the {label}: {shown}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``verify``."""
    verify = add_command(
        sub,
        "verify",
        cmd_verify,
        help="compare a pipeline's target with a recompute at the committed versions",
        description=(
            "Recompute a pipeline's target from its upstreams at their committed versions\n"
            "(every upstream read as a snapshot) and compare it with the target: row count,\n"
            "an order-independent checksum over the columns that are not _wm_ columns, and\n"
            "when they differ, the rows only in one side with example keys. Starts Spark.\n"
            "Exit 0 when equal, 1 when different."
        ),
        example="watermark verify -p orders_enriched\nwatermark verify -p orders_enriched --json",
    )
    verify.add_argument("-p", "--pipeline", required=True, help="pipeline name")
