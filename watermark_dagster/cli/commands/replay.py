"""``watermark replay``: run an old version range of one upstream through its pipelines again.

A REPLAY batch pins the range, and pins the other upstreams where the scheduled batch
that applied the range's end pinned them. It runs as a Dagster run of the batch job (its
materializations show in the UI), writes at that batch's position so newer rows are left
alone (I5), and never moves a committed watermark. The use case is
:mod:`watermark_dagster.operations.replay`; this module parses, confirms and prints.
"""

from typing import Any

from watermark_dagster.cli.batch_runner import headless_executor
from watermark_dagster.cli.context import EXIT_FAILED, EXIT_OK, Context
from watermark_dagster.cli.prompt import confirm
from watermark_dagster.errors import UsageError
from watermark_dagster.operations.replay import plan_replay, run_replay


def _version(flag: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(
            f"{flag} {text!r} is not a version; give a whole number such as 5."
        ) from None
    if value < 0:
        raise UsageError(f"{flag} {text!r} is negative; Delta versions start at 0.")
    return value


def cmd_replay(ctx: Context) -> int:
    """``watermark replay``: parse the range, check it, confirm, replay, print."""
    from watermark_dagster.core.ranges import VersionRange

    args = ctx.args
    start = _version("--from-version", args.from_version)
    end = _version("--to-version", args.to_version)
    if end < start:
        raise UsageError(f"--to-version {end} is before --from-version {start}; give A <= B.")
    name = ctx.upstream(args.table).name
    plan = plan_replay(
        ctx.store, ctx.registry, name, VersionRange(start, end), pipelines=args.pipeline
    )
    rng, mode, pipelines = plan.range, plan.mode, list(plan.pipelines)
    summary = [
        f"replay {name} {mode.value} {rng} through {pipelines}",
        "  newer rows in the targets are left as they are; no watermark moves",
    ]
    if args.dry_run:
        if args.json:
            ctx.console.json(
                {
                    "upstream": name,
                    "range": str(rng),
                    "mode": mode.value,
                    "pipelines": pipelines,
                    "dry_run": True,
                }
            )
        else:
            ctx.console.print("dry run: nothing written. `watermark replay` would:")
            for line in summary:
                ctx.console.print(line)
        return EXIT_OK
    confirm(summary, yes=args.yes, stream=ctx.console.err)
    done = run_replay(
        ctx.store,
        ctx.registry,
        plan,
        execute=headless_executor(ctx),
        actor=args.actor,
        reason=args.reason,
    )
    batch, status, error = done.batch, done.status, done.error
    result: dict[str, Any] = {
        "batch_id": batch.batch_id,
        "upstream": name,
        "range": str(rng),
        "mode": mode.value,
        "pipelines": pipelines,
        "written_at_position_of": batch.order_seq,
        "status": status.value,
        "error": error,
        "checkpoints": [
            {
                "pipeline": c.pipeline,
                "status": c.status.value,
                "rows_read": c.rows_read,
                "rows_written": c.rows_written,
            }
            for c in done.checkpoints
        ],
        "reason": args.reason,
        "actor": done.actor,
    }
    if args.json:
        ctx.console.json(result)
    else:
        ctx.console.print(
            f"replay batch {batch.batch_id}: {name} {mode.value} {rng} -> {status.value}"
        )
        ctx.console.table(
            ["pipeline", "status", "rows read", "rows written"],
            [[c.pipeline, c.status.value, c.rows_read, c.rows_written] for c in done.checkpoints],
        )
        ctx.console.print(
            f"  written at the position of batch seq {batch.order_seq}: newer rows untouched; "
            f"committed watermark of {name} unchanged ({plan.committed})"
        )
        if error:
            ctx.console.problem(f"FAILED: {error}")
    return EXIT_FAILED if done.failed else EXIT_OK
