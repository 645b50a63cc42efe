"""``watermark replay``: run an old version range of one upstream through its pipelines again.

A REPLAY batch pins the range, and pins the other upstreams where the scheduled batch
that applied the range's end pinned them. It runs as a Dagster run of the batch job (its
materializations show in the UI), writes at that batch's position so newer rows are left
alone (I5), and never moves a committed watermark.
"""

import argparse
from typing import Any

from watermark_dagster.cli.commands.manual import _confirm
from watermark_dagster.cli.context import EXIT_FAILED, EXIT_OK, Context, Refusal
from watermark_dagster.cli.parser import add_command
from watermark_dagster.errors import WatermarkError


def _version(flag: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise Refusal(f"{flag} {text!r} is not a version; give a whole number such as 5.") from None
    if value < 0:
        raise Refusal(f"{flag} {text!r} is negative; Delta versions start at 0.")
    return value


def _pipelines(ctx: Context, table: str) -> list[str]:
    """The pipelines to replay through, checked: merge pipelines reading ``table``."""
    from watermark_dagster.config.pipeline import WriteMode

    consumers = ctx.consumers(table)
    wanted = ctx.args.pipeline or consumers
    unknown = [p for p in wanted if p not in consumers]
    if unknown:
        raise Refusal(
            f"pipeline(s) {unknown} do not read {table!r}; pipelines reading it: {consumers}."
        )
    refused = {
        p: WriteMode(ctx.registry.pipelines[p].write).value
        for p in wanted
        if ctx.registry.pipelines[p].write is not WriteMode.MERGE
    }
    if refused:
        raise Refusal(
            f"pipeline(s) {sorted(refused)} write with {sorted(set(refused.values()))}: a replay "
            "can only re-apply changes to a merge target (an append target has the rows "
            "already and Delta would skip them; an overwrite target would go back in time). "
            f"Leave them out with -p, or rebuild with `watermark reset -t {table}`."
        )
    return sorted(wanted)


def cmd_replay(ctx: Context) -> int:
    from dagster import DagsterInstance, RunRequest, SensorResult

    from watermark_dagster.core.ranges import ReadMode, VersionRange
    from watermark_dagster.core.records import BatchStatus, default_actor
    from watermark_dagster.dagster_defs.assets import BATCHES_PARTITIONS_NAME
    from watermark_dagster.dagster_defs.headless import CycleReport, HeadlessRunner
    from watermark_dagster.dagster_defs.runs import ATTEMPT_TAG, BATCH_TAG
    from watermark_dagster.observe.delta_log import Observer, read_mode_of

    args = ctx.args
    start = _version("--from-version", args.from_version)
    end = _version("--to-version", args.to_version)
    if end < start:
        raise Refusal(f"--to-version {end} is before --from-version {start}; give A <= B.")
    upstream = ctx.upstream(args.table)
    name = upstream.name
    if upstream.is_cursor:
        raise Refusal(f"upstream {name!r} is read by a cursor column and has no versions.")
    pipelines = _pipelines(ctx, name)
    committed = ctx.store.committed_versions().get(name)
    if committed is None or end > committed:
        raise Refusal(
            f"--to-version {end} is beyond the committed watermark of {name!r} ({committed}); "
            "only versions the pipelines applied can be replayed. Give a range up to "
            f"{committed}, or let the scheduled batches apply the newer versions."
        )
    try:
        observed = Observer().observe(upstream)
    except WatermarkError as e:
        raise Refusal(str(e)) from None
    mode = read_mode_of(upstream, observed)
    if mode is ReadMode.SNAPSHOT:
        raise Refusal(f"upstream {name!r} is snapshot-only: there are no changes to replay.")
    rng = VersionRange(start, end)
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
    _confirm(ctx, summary)
    actor = args.actor or default_actor()
    try:
        batch = ctx.store.create_replay_batch(
            name,
            rng,
            mode=mode,
            pipelines=pipelines,
            all_upstreams=sorted(
                {u for p in pipelines for u in ctx.registry.pipelines[p].upstreams}
            ),
            actor=actor,
            reason=args.reason,
        )
    except WatermarkError as e:
        raise Refusal(str(e)) from None
    instance = DagsterInstance.get()
    instance.add_dynamic_partitions(BATCHES_PARTITIONS_NAME, [batch.batch_id])
    runner = HeadlessRunner(ctx.defs, instance)
    report = CycleReport()
    keys = {p: runner.pipeline_key(p) for p in pipelines}
    spark = ctx.spark()
    try:
        runner.execute_requests(
            SensorResult(
                run_requests=[
                    RunRequest(
                        partition_key=batch.batch_id,
                        asset_selection=list(keys.values()),
                        tags={ATTEMPT_TAG: "1", BATCH_TAG: batch.batch_id},
                    )
                ]
            ),
            report,
        )
    finally:
        spark.stop()
    failed = report.failed_runs
    error = "; ".join(r.error or "run failed" for r in failed) or None
    status = BatchStatus.FAILED if failed else BatchStatus.COMPLETED
    ctx.store.set_batch_status(batch.batch_id, status, actor=actor, error=error)
    checkpoints = [
        c for c in ctx.store.checkpoints(batch_id=batch.batch_id) if c.status.value != "RUNNING"
    ]
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
            for c in checkpoints
        ],
        "reason": args.reason,
        "actor": actor,
    }
    if args.json:
        ctx.console.json(result)
    else:
        ctx.console.print(
            f"replay batch {batch.batch_id}: {name} {mode.value} {rng} -> {status.value}"
        )
        ctx.console.table(
            ["pipeline", "status", "rows read", "rows written"],
            [[c.pipeline, c.status.value, c.rows_read, c.rows_written] for c in checkpoints],
        )
        ctx.console.print(
            f"  written at the position of batch seq {batch.order_seq}: newer rows untouched; "
            f"committed watermark of {name} unchanged ({committed})"
        )
        if error:
            ctx.console.problem(f"FAILED: {error}")
    return EXIT_FAILED if failed else EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``replay``."""
    replay = add_command(
        sub,
        "replay",
        cmd_replay,
        help="run an applied version range of an upstream through its pipelines again",
        description=(
            "Plan a REPLAY batch over versions A..B of one upstream (already applied: at most\n"
            "its committed watermark) and run it through the merge pipelines that read it\n"
            "(or those given with -p). The other upstreams are pinned where the scheduled\n"
            "batch that applied B pinned them; rows the targets hold from newer batches are\n"
            "left alone, deleted keys stay deleted, and no committed watermark moves.\n"
            "Starts Spark. Exit 0 when every pipeline succeeded, 1 otherwise."
        ),
        example=(
            "watermark replay -t orders --from-version 3 --to-version 5 --reason 'fixed join'\n"
            "watermark replay -t orders --from-version 3 --to-version 5 -p orders_enriched "
            "--dry-run"
        ),
    )
    replay.add_argument("-t", "--table", required=True, help="upstream name")
    replay.add_argument("--from-version", required=True, help="first version (A)")
    replay.add_argument("--to-version", required=True, help="last version (B), inclusive")
    replay.add_argument("-p", "--pipeline", action="append", help="only this pipeline (repeatable)")
    replay.add_argument("--reason", help="why; recorded in history")
    replay.add_argument("--dry-run", action="store_true", help="show the plan; write nothing")
    replay.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    replay.add_argument("--actor", help="who is replaying (default: user@host)")
