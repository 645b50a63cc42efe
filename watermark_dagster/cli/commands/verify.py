"""``watermark verify``: a pipeline's target against a recompute from its upstreams.

The check is :func:`watermark_dagster.operations.verify.verify_pipeline`; this module
prints its result (or its JSON) and turns it into the exit code.
"""

from typing import Any

from watermark_dagster.cli.context import EXIT_FAILED, EXIT_OK, Context
from watermark_dagster.operations.verify import Verification, verify_pipeline


def as_json(found: Verification) -> dict[str, Any]:
    """The ``--json`` output of ``watermark verify``."""
    result: dict[str, Any] = {
        "pipeline": found.pipeline,
        "target": found.target,
        "versions": found.versions,
        "basis": found.basis,
    }
    comparison = found.comparison
    if comparison is None:
        result.update(equal=False, target_exists=False)
        return result
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
    return result


def cmd_verify(ctx: Context) -> int:
    """``watermark verify``: exit 0 when the target equals its recompute, else 1."""
    found = verify_pipeline(ctx.store, ctx.registry, ctx.args.pipeline, open_spark=ctx.spark)
    result = as_json(found)
    if ctx.args.json:
        ctx.console.json(result)
    else:
        _print(ctx, result)
    return EXIT_OK if found.equal else EXIT_FAILED


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
