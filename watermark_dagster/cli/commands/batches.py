"""``watermark batches``, ``batch`` and ``plan --dry-run``: what was and would be planned."""

import argparse
import re
from typing import Any

from watermark_dagster.cli.context import EXIT_OK, Context, Refusal
from watermark_dagster.cli.parser import add_command
from watermark_dagster.cli.render import STATUS_STYLES


def _batch_summary(batch: Any) -> dict[str, Any]:
    return {
        "batch_id": batch.batch_id,
        "seq": batch.seq,
        "kind": batch.kind.value,
        "status": batch.status.value,
        "created_at": f"{batch.created_at:%Y-%m-%d %H:%M:%S}",
        "pipelines": list(batch.pipelines),
        "ranges": {
            u: (str(i.range) if i.range else "NOOP") for u, i in sorted(batch.inputs.items())
        },
    }


def cmd_batches(ctx: Context) -> int:
    from watermark_dagster.store import BatchStatus

    args = ctx.args
    if args.limit is not None and args.limit < 1:
        raise Refusal(f"--limit must be 1 or more, got {args.limit}.")
    status = None
    if args.status:
        try:
            status = BatchStatus(args.status.upper())
        except ValueError:
            valid = [s.value for s in BatchStatus]
            raise Refusal(f"unknown --status {args.status!r}; use one of {valid}.") from None
    found = [b for b in ctx.store.batches() if status is None or b.status is status]
    rows = [_batch_summary(b) for b in found[: args.limit or None]]
    if args.json:
        ctx.console.json(rows)
        return EXIT_OK
    ctx.console.table(
        ["batch", "kind", "status", "created", "pipelines", "ranges"],
        [
            [
                r["batch_id"],
                r["kind"],
                r["status"],
                r["created_at"],
                ",".join(r["pipelines"]),
                " ".join(f"{u}={v}" for u, v in r["ranges"].items()),
            ]
            for r in rows
        ],
    )
    return EXIT_OK


def cmd_batch(ctx: Context) -> int:
    from watermark_dagster.errors import BatchStateError

    batch_id = ctx.args.batch_id
    if not re.fullmatch(r"b\d{6,}", batch_id):
        raise Refusal(f"{batch_id!r} is not a batch id (they look like b000042).")
    try:
        batch = ctx.store.get_batch(batch_id)
    except BatchStateError as e:
        raise Refusal(str(e)) from None
    detail = {
        **_batch_summary(batch),
        "actor": batch.actor,
        "upstreams": [
            {
                "upstream": u,
                "mode": i.mode.value,
                "start_version": i.range.start if i.range else None,
                "end_version": i.snapshot_version,
                "advanced": u in batch.advanced,
            }
            for u, i in sorted(batch.inputs.items())
        ],
        "checkpoints": [
            {
                "pipeline": c.pipeline,
                "attempt": c.attempt,
                "status": c.status.value,
                "rows_read": c.rows_read,
                "rows_written": c.rows_written,
                "run_id": c.run_id,
                "error": c.error,
            }
            for c in ctx.store.checkpoints(batch_id=batch_id)
        ],
    }
    if ctx.args.json:
        ctx.console.json(detail)
        return EXIT_OK
    status = ctx.console.paint(batch.status.value, STATUS_STYLES.get(batch.status.value))
    ctx.console.print(
        f"batch {batch.batch_id} (seq {batch.seq}, {batch.kind.value}) {status}, "
        f"planned {detail['created_at']} by {batch.actor}\n"
    )
    ctx.console.table(
        ["upstream", "mode", "start", "end", "advanced"],
        [list(u.values()) for u in detail["upstreams"]],
    )
    ctx.console.print()
    ctx.console.table(
        ["pipeline", "attempt", "status", "rows read", "rows written", "error"],
        [
            [
                c["pipeline"],
                c["attempt"],
                c["status"],
                c["rows_read"],
                c["rows_written"],
                c["error"].splitlines()[0][:80] if c["error"] else None,
            ]
            for c in detail["checkpoints"]
        ],
    )
    return EXIT_OK


def cmd_plan(ctx: Context) -> int:
    from watermark_dagster.coordinate import look_before_planning
    from watermark_dagster.observe.delta_log import Observer

    if not ctx.args.dry_run:
        raise Refusal(
            "`watermark plan` only previews; add --dry-run (the coordinator sensor or "
            "`watermark run` plans for real)."
        )
    open_batch = ctx.store.open_batch()
    # The coordinator's own look, previewed: start_from points are applied to a copy.
    found = look_before_planning(
        ctx.registry, Observer(), ctx.store, actor="watermark plan", preview=True
    )
    look = found.observation
    plan = look.plan()
    result = {
        "open_batch": open_batch.batch_id if open_batch else None,
        "would_plan": bool(plan.has_work and open_batch is None),
        "pipelines": list(plan.pipelines),
        "full_load": list(plan.full_load),
        "upstreams": [
            {
                "upstream": p.name,
                "committed": p.committed_version,
                "latest": p.latest_version,
                "mode": plan.inputs[p.name].mode.value,
                "range": str(plan.inputs[p.name].range) if plan.inputs[p.name].range else "NOOP",
            }
            for p in look.positions
        ],
        "unavailable": dict(look.errors),
    }
    if ctx.args.json:
        ctx.console.json(result)
        return EXIT_OK
    if open_batch is not None:
        ctx.console.print(
            f"batch {open_batch.batch_id} is open: the coordinator resumes it and plans "
            "nothing new until it completes. The next plan after it would be:"
        )
    elif not plan.has_work:
        ctx.console.print("nothing to plan: no upstream has new versions.")
    else:
        ctx.console.print(f"the coordinator would plan now, running {list(plan.pipelines)}:")
    ctx.console.table(
        ["upstream", "committed", "latest", "mode", "range"],
        [
            [
                u["upstream"],
                "none" if u["committed"] is None else u["committed"],
                u["latest"],
                u["mode"],
                u["range"],
            ]
            for u in result["upstreams"]
        ],
    )
    for name, error in look.errors.items():
        ctx.console.problem(f"unavailable: {name}: {error}", style="warn")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``batches``, ``batch`` and ``plan``."""
    batches = add_command(
        sub,
        "batches",
        cmd_batches,
        help="batches with their ranges, newest first",
        example="watermark batches --status PLANNED --limit 5",
    )
    batches.add_argument("--status", help="PLANNED, COMPLETED, FAILED or ABANDONED")
    batches.add_argument("--limit", type=int, help="only the newest N")

    batch = add_command(
        sub,
        "batch",
        cmd_batch,
        help="one batch: ranges, advances, pipeline attempts and errors",
        example="watermark batch b000042",
    )
    batch.add_argument("batch_id", help="e.g. b000042")

    plan = add_command(
        sub,
        "plan",
        cmd_plan,
        help="what the coordinator would plan now (writes nothing)",
        example="watermark plan --dry-run\nwatermark plan --dry-run --json",
    )
    plan.add_argument("--dry-run", action="store_true", help="required: preview only")
