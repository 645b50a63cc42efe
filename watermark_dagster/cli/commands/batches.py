"""``watermark batches``, ``batch`` and ``plan --dry-run``: what was and would be planned.

These commands only look: they open the control tables read-only (nothing is created in a
fresh home, nothing is written).
"""

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from watermark_dagster.cli.context import EXIT_OK, Context
from watermark_dagster.cli.render import STATUS_STYLES, Styled
from watermark_dagster.core.records import CheckpointStatus
from watermark_dagster.errors import UsageError, one_line
from watermark_dagster.operations.status import stuck_batches

if TYPE_CHECKING:
    from watermark_dagster.cli.render import Console
    from watermark_dagster.core.planning import Plan
    from watermark_dagster.core.records import Batch
    from watermark_dagster.store import WatermarkStore

STUCK = "STUCK"


def range_text(planned: Any) -> str:
    """What one planned input reads: ``[3, 5]``, a cursor window ``(a .. b]`` or ``NOOP``."""
    if not planned.reads:
        return "NOOP"
    if planned.window is not None:
        return str(planned.window)
    return str(planned.range)


def snapshot_readers(
    inputs: Mapping[str, Any],
    full_load: Sequence[str],
    pipeline_inputs: Mapping[str, Sequence[str]],
) -> dict[str, list[str]]:
    """Upstream -> the pipelines of ``full_load`` that read it: they load it as a snapshot
    whatever its own read mode (a pipeline added later, an overwrite pipeline)."""
    return {
        u: sorted(p for p in full_load if u in pipeline_inputs.get(p, ()))
        for u in inputs
        if any(u in pipeline_inputs.get(p, ()) for p in full_load)
    }


def snapshot_text(planned: Any, pipelines: Sequence[str]) -> str | None:
    """``SNAPSHOT @5 for p_new``: how full-load pipelines read one upstream (None: none does)."""
    if not pipelines:
        return None
    if planned.window is not None:
        end = "?" if planned.window.end is None else ", ".join(map(str, planned.window.end))
        at = f"up to {end}"
    else:
        at = f"@{planned.snapshot_version}"
    return f"SNAPSHOT {at} for {', '.join(pipelines)}"


def _batch_summary(batch: Any, stuck: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {
        "batch_id": batch.batch_id,
        "seq": batch.seq,
        "kind": batch.kind.value,
        "status": STUCK if stuck else batch.status.value,
        "created_at": f"{batch.created_at:%Y-%m-%d %H:%M:%S}",
        "pipelines": list(batch.pipelines),
        "full_load": list(batch.full_load),
        "ranges": {u: range_text(i) for u, i in sorted(batch.inputs.items())},
        **({"stuck": dict(stuck)} if stuck else {}),
    }


def cmd_batches(ctx: Context) -> int:
    """List batches, newest first, filtered by ``--status`` (``STUCK`` included) and ``--limit``.

    Prints a table, or the rows as JSON with ``--json``; rejects an unknown status or a
    limit below 1 as a usage error.
    """
    from watermark_dagster.core.records import BatchStatus

    args = ctx.args
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be 1 or more, got {args.limit}.")
    status = None
    if args.status:
        wanted = args.status.upper()
        if wanted != STUCK:
            try:
                status = BatchStatus(wanted)
            except ValueError:
                valid = [s.value for s in BatchStatus] + [STUCK]
                raise UsageError(f"unknown --status {args.status!r}; use one of {valid}.") from None
    store = ctx.read_store
    # Only the newest buckets that hold the batches shown are read (open ones: the few
    # files that hold open rows), so this costs the same at batch 5,000 as at batch 50.
    stuck = stuck_batches(store, store.open_batches())
    if args.status and args.status.upper() == STUCK:
        found = [b for b in reversed(store.open_batches()) if b.batch_id in stuck]
    elif status is BatchStatus.PLANNED:
        found = list(reversed(store.open_batches()))
    else:
        found = store.batches(limit=args.limit or None, status=status)
    rows = [_batch_summary(b, stuck.get(b.batch_id)) for b in found[: args.limit or None]]
    if args.json:
        ctx.console.json(rows)
        return EXIT_OK
    ctx.console.table(
        ["batch", "kind", "status", "created", "pipelines", "full load", "ranges"],
        [
            [
                r["batch_id"],
                r["kind"],
                r["status"],
                r["created_at"],
                ",".join(r["pipelines"]),
                ",".join(r["full_load"]),
                " ".join(f"{u}={v}" for u, v in r["ranges"].items()),
            ]
            for r in rows
        ],
    )
    for r in rows:
        if "stuck" in r:
            ctx.console.print(f"\n{r['batch_id']} is stuck: `watermark batch {r['batch_id']}`")
    return EXIT_OK


def _say(ctx: Context, text: str) -> None:
    """A line of prose: wrapped to the terminal's width on a terminal, whole elsewhere."""
    console = ctx.console
    if console.terminal and console.width:
        text = textwrap.fill(
            text, width=console.width, subsequent_indent="    ", break_on_hyphens=False
        )
    console.print(text)


def _print_errors(ctx: Context, checkpoints: Sequence[dict[str, Any]]) -> None:
    """The attempts table. Off a terminal each error is shown whole on its row; on a
    terminal the row shows what fits and the full errors follow, wrapped."""
    console = ctx.console
    headers = ["pipeline", "attempt", "status", "rows read", "rows written", "error"]
    rows = [
        [c["pipeline"], c["attempt"], c["status"], c["rows_read"], c["rows_written"]]
        for c in checkpoints
    ]
    errors = [one_line(c["error"]) if c["error"] else None for c in checkpoints]
    if not console.terminal or console.width is None:
        console.table(headers, [r + [e] for r, e in zip(rows, errors, strict=True)])
        return
    fixed = [
        max([len(h)] + [len("" if r[i] is None else str(r[i])) for r in rows])
        for i, h in enumerate(headers[:-1])
    ]
    room = max(20, console.width - sum(fixed) - 2 * len(fixed))
    cut = [None if e is None else e if len(e) <= room else e[: room - 1] + "…" for e in errors]
    console.table(headers, [r + [e] for r, e in zip(rows, cut, strict=True)])
    long = [(c, e) for c, e in zip(checkpoints, errors, strict=True) if e and len(e) > room]
    if long:
        console.print()
        console.print(console.paint("errors", "bold"))
        for c, e in long:
            _say(ctx, f"{c['pipeline']} attempt {c['attempt']}: {e}")


def cmd_batch(ctx: Context) -> int:
    """Show one batch: its ranges per upstream, checkpoints and, if stuck, why.

    Rejects text that is not a batch id, and an unknown batch, as usage errors.
    """
    from watermark_dagster.errors import BatchStateError

    batch_id = ctx.args.batch_id
    if not re.fullmatch(r"b\d{6,}", batch_id):
        raise UsageError(f"{batch_id!r} is not a batch id (they look like b000042).")
    store = ctx.read_store
    try:
        batch = store.get_batch(batch_id)
    except BatchStateError as e:
        raise UsageError(str(e)) from None
    stuck = stuck_batches(store, [batch]).get(batch_id)
    died = _deaths(store, batch_id)
    readers = snapshot_readers(batch.inputs, batch.full_load, ctx.registry.pipeline_inputs())
    detail = {
        **_batch_summary(batch, stuck),
        "actor": batch.actor,
        "upstreams": [
            {
                "upstream": u,
                "mode": i.mode.value,
                "start_version": i.range.start if i.range else None,
                "end_version": i.snapshot_version,
                "window": _window(i.window),
                "snapshot_for": readers.get(u, []),
                "advanced": u in batch.advanced,
            }
            for u, i in sorted(batch.inputs.items())
        ],
        "checkpoints": [
            {
                "pipeline": c.pipeline,
                "attempt": c.attempt,
                # An attempt left RUNNING by a run that died is shown as what it is.
                "status": "DIED" if dead else c.status.value,
                "rows_read": c.rows_read,
                "rows_written": c.rows_written,
                "run_id": c.run_id,
                "error": f"the run died: {dead} (a crash, not an attempt)" if dead else c.error,
            }
            for c in store.checkpoints(batch_id=batch_id)
            for dead in [died.get(c.run_id or "") if c.status is CheckpointStatus.RUNNING else None]
        ],
    }
    if ctx.args.json:
        ctx.console.json(detail)
        return EXIT_OK
    shown = detail["status"]
    status = ctx.console.paint(shown, STATUS_STYLES.get(shown))
    ctx.console.print(
        f"batch {batch.batch_id} (seq {batch.seq}, {batch.kind.value}) {status}, "
        f"planned {detail['created_at']} by {batch.actor}"
    )
    if stuck:
        counts = []
        if stuck["failed_runs"]:
            counts.append(f"{stuck['failed_runs']} failed runs")
        if stuck["deaths"]:
            counts.append(f"{len(stuck['deaths'])} runs that died")
        runs = f" after {' and '.join(counts)}" if counts else ""
        ctx.console.print(
            ctx.console.paint(f"stuck since {stuck['since']}{runs}", "bad")
            + (f"; pipelines {stuck['pipelines']} unfinished" if stuck["pipelines"] else "")
        )
        if stuck["reason"]:
            _say(ctx, f"  reason: {one_line(stuck['reason'])}")
        _say(ctx, f"  fix: {stuck['fix']}")
    ctx.console.print()
    ctx.console.table(
        ["upstream", "mode", "start", "end", "full load", "advanced"],
        [
            [
                u["upstream"],
                u["mode"],
                u["start_version"] if u["window"] is None else _position(u["window"]["start"]),
                u["end_version"] if u["window"] is None else _position(u["window"]["end"]),
                snapshot_text(batch.inputs[u["upstream"]], u["snapshot_for"]),
                u["advanced"],
            ]
            for u in detail["upstreams"]
        ],
    )
    ctx.console.print()
    _print_errors(ctx, detail["checkpoints"])
    return EXIT_OK


def _deaths(store: "WatermarkStore", batch_id: str) -> dict[str, str]:
    """Run id -> how it died, from the batch's ``RUN_DIED`` history rows."""
    found = {}
    for row in store.history(batch_id=batch_id):
        if row["event"] == "RUN_DIED" and row.get("detail"):
            detail = json.loads(row["detail"])
            found[str(detail.get("run_id"))] = str(detail.get("how") or "its worker was lost")
    return found


def _position(value: Any) -> Any:
    """A cursor position as text (``2026-01-01T00:00:00, 7``); other values unchanged."""
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return value


def _window(window: Any) -> dict[str, Any] | None:
    """A cursor window as JSON: its start and end positions (None: open or not pinned)."""
    if window is None:
        return None
    return {
        "start": None if window.start is None else list(window.start),
        "end": None if window.end is None else list(window.end),
    }


def cmd_plan(ctx: Context) -> int:
    """Preview what the coordinator would plan now, without writing anything.

    Runs the coordinator's own look in preview mode and shows, per upstream, the committed
    and latest versions, the read mode and range, and which upstreams are blocked or
    unavailable. Needs ``--dry-run``.
    """
    from watermark_dagster.observe.observer import Observer
    from watermark_dagster.operations.coordinate import look_before_planning
    from watermark_dagster.operations.idle import IdleReason

    if not ctx.args.dry_run:
        raise UsageError(
            "`watermark plan` only previews; add --dry-run (the coordinator sensor or "
            "`watermark run` plans for real)."
        )
    store = ctx.read_store
    open_batch = store.open_batch()
    observer = Observer(read_only=True)
    # The coordinator's own look, previewed: start_from points are applied to a copy.
    # With no batch open, a next range whose commits or change files are gone is BLOCKED,
    # as the coordinator blocks it.
    found = look_before_planning(
        ctx.registry,
        observer,
        store,
        actor="watermark plan",
        preview=True,
        check_ranges=open_batch is None,
    )
    look = found.observation
    plan = look.plan()
    pipeline_inputs = ctx.registry.pipeline_inputs()
    readers = snapshot_readers(plan.inputs, plan.full_load, pipeline_inputs)
    held = {
        name: {
            "reason": error.reason,
            "fix": error.fix,
            "pipelines": sorted(p for p, ups in pipeline_inputs.items() if name in ups),
        }
        for name, error in sorted(look.blocked.items())
    }
    unavailable = {n: e for n, e in sorted(look.errors.items()) if n not in look.blocked}
    upstreams = []
    for p in look.positions:
        planned = plan.inputs[p.name]
        mark = look.marks.get(p.name)
        cursor = mark.committed_cursor if mark else None
        upstreams.append(
            {
                "upstream": p.name,
                "committed": list(cursor) if cursor is not None else p.committed_version,
                "latest": None if planned.is_cursor else p.latest_version,
                "mode": planned.mode.value,
                "range": range_text(planned),
                "snapshot_for": readers.get(p.name, []),
                "state": "ok",
            }
        )
    for name in sorted(set(look.errors)):
        mark = look.marks.get(name)
        latest = None
        if name in look.blocked:
            latest = observer.observe(ctx.registry.upstreams[name]).latest_version
        upstreams.append(
            {
                "upstream": name,
                "committed": mark.committed_version if mark else None,
                "latest": latest,
                "mode": "BLOCKED" if name in look.blocked else "UNAVAILABLE",
                "range": None,
                "snapshot_for": [],
                "state": "blocked" if name in look.blocked else "unavailable",
            }
        )
    stuck = stuck_batches(store, [open_batch]).get(open_batch.batch_id) if open_batch else None
    # Why the coordinator plans nothing now: the text its sensor skips with.
    idle = IdleReason.of(look).text if open_batch is None and not plan.has_work else None
    result = {
        "open_batch": open_batch.batch_id if open_batch else None,
        # The open batch the coordinator gave up resubmitting: why, and what to do.
        "open_batch_stuck": stuck,
        "would_plan": bool(plan.has_work and open_batch is None),
        "idle_reason": idle,
        "pipelines": list(plan.pipelines),
        "full_load": list(plan.full_load),
        "upstreams": upstreams,
        "blocked": held,
        "unavailable": unavailable,
    }
    if ctx.args.json:
        ctx.console.json(result)
        return EXIT_OK
    console = ctx.console
    stopped = sorted({p for h in held.values() for p in h["pipelines"]})
    stopped += sorted(
        {p for n in unavailable for p, ups in pipeline_inputs.items() if n in ups} - set(stopped)
    )
    _plan_headline(console, open_batch, stuck, plan, stopped, len(held) + len(unavailable), idle)
    console.table(
        ["upstream", "committed", "latest", "mode", "range", "full load"],
        [
            [
                u["upstream"],
                "none" if u["committed"] is None else _position(u["committed"]),
                u["latest"],
                Styled(u["mode"], "bad") if u["state"] != "ok" else u["mode"],
                u["range"],
                snapshot_text(plan.inputs[u["upstream"]], u["snapshot_for"])
                if u["state"] == "ok"
                else None,
            ]
            for u in upstreams
        ],
    )
    notes: list[str] = []
    for name, h in held.items():
        notes.append(console.paint(f"BLOCKED {name}: {h['reason']}", "bad"))
        notes.append(f"  fix: {h['fix']}")
    for name, message in unavailable.items():
        notes.append(console.paint(f"UNAVAILABLE {name}: {message}", "warn"))
    if notes:
        console.print()
        for line in notes:
            console.print(line)
    return EXIT_OK


def _plan_headline(
    console: "Console",
    open_batch: "Batch | None",
    stuck: Mapping[str, Any] | None,
    plan: "Plan",
    stopped: list[str],
    blocked: int,
    idle: str | None,
) -> None:
    """``watermark plan``'s first line: the open batch (stuck or not), what would be planned,
    or why nothing is."""
    if open_batch is not None and stuck is not None:
        console.print(
            console.paint(
                f"batch {open_batch.batch_id} is open and STUCK since {stuck['since']}: the "
                "coordinator no longer resubmits it, and plans nothing new until it completes "
                "or is abandoned.",
                "bad",
            )
        )
        if stuck["reason"]:
            console.print(f"  reason: {one_line(stuck['reason'])}")
        console.print(f"  fix: {stuck['fix']}")
        console.print("The next plan after it would be:")
    elif open_batch is not None:
        console.print(
            f"batch {open_batch.batch_id} is open: the coordinator resumes it and plans "
            "nothing new until it completes. The next plan after it would be:"
        )
    elif plan.has_work:
        console.print(f"the coordinator would plan now, running {list(plan.pipelines)}:")
    elif stopped:
        console.print(
            console.paint(
                f"nothing can be planned for {stopped}: {blocked} upstream(s) blocked (see below).",
                "bad",
            )
        )
    else:
        console.print(f"nothing to plan: {idle}.")
