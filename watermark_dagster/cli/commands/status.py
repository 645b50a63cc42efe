"""``watermark list`` and ``watermark get``: where every upstream stands."""

import json
from typing import TYPE_CHECKING, Any

from watermark_dagster.cli.commands.landing_files import file_rows, print_files
from watermark_dagster.cli.context import EXIT_OK, Context
from watermark_dagster.cli.render import Styled, cursor_type_of, shown_position
from watermark_dagster.core.records import Checkpoint, CheckpointStatus
from watermark_dagster.errors import NoFileLandedError, WatermarkError

if TYPE_CHECKING:
    from watermark_dagster.operations.warehouse import WarehouseStatus

RECENT_HISTORY = 5


def _look(
    ctx: Context,
    name: str,
    mark: Any,
    observer: Any,
    unreadable: WatermarkError | None,
    floor: int | None = None,
) -> dict[str, Any]:
    """``latest``, ``mode`` and what blocks the upstream: ``unavailable`` (the path holds
    no readable table) or ``blocked`` (dropped and recreated since its watermark, or its
    next range ``unreadable``: ``blocked_by`` says which), with the ``fix``. Cursor
    upstreams have no version but are still checked for availability. ``floor`` is the
    highest version the control root pinned (a landing file log must hold as many)."""
    from watermark_dagster.core.observations import read_mode_of, recreation

    upstream = ctx.registry.upstreams[name]
    found: dict[str, Any] = {"latest": None, "mode": str(upstream.mode), "unavailable": None}
    found.update(blocked=None, blocked_by=None, fix=None, rows_without_cursor=None)
    found.update(cursor_type=None, waiting=None)
    try:
        obs = observer.observe(upstream, floor=floor)
    except NoFileLandedError as e:
        # Nothing is wrong: the folder waits for its first file.
        return {**found, "waiting": e.reason, "fix": e.fix}
    except WatermarkError as e:
        return {**found, "unavailable": str(e), "fix": e.fix}
    found.update(
        latest=None if obs.is_cursor else obs.latest_version,
        mode=read_mode_of(upstream, obs).value,
        rows_without_cursor=obs.rows_without_cursor,
        cursor_type=cursor_type_of(upstream, obs.schema_fingerprint),
    )
    recreated = recreation(obs, mark)
    if recreated is not None:
        found.update(blocked=recreated.reason, blocked_by="recreated", fix=recreated.fix)
    elif unreadable is not None:
        found.update(blocked=unreadable.reason, blocked_by="unreadable_range", fix=unreadable.fix)
    return found


def status_rows(ctx: Context) -> list[dict[str, Any]]:
    """Every upstream: committed, latest, lag, the open batch's read of it, last change,
    and what holds it: ``unavailable`` or ``blocked`` (its table), or ``stuck`` (the open
    batch reading it, which the coordinator gave up resubmitting), with the ``fix``, or
    ``waiting`` (a landing folder no file reached yet: nothing is wrong); ``state`` names
    which (``ok``, ``waiting``, ``unavailable``, ``blocked`` or ``stuck``), and ``rows``:
    per pipeline reading it, the rows read and written by the batch that set its committed
    watermark (a stage of a chain shows its own counts). With no batch
    open, an upstream whose next range can no longer be read (commits or change files gone)
    is ``blocked`` as the coordinator blocks it (``blocked_by``: ``unreadable_range``, else
    ``recreated``)."""
    from watermark_dagster.observe.observer import Observer
    from watermark_dagster.operations.coordinate import unreadable_next_ranges
    from watermark_dagster.operations.status import stuck_batches

    store = ctx.read_store
    committed = store.committed()
    open_batch = store.open_batch()
    stuck = stuck_batches(store, [open_batch]).get(open_batch.batch_id) if open_batch else None
    # One cache (the coordinator's look below sees what _look saw), writing nothing.
    observer = Observer(read_only=True)
    unreadable = {} if open_batch else unreadable_next_ranges(ctx.registry, observer, store)
    rows = []
    seen: dict[str, list[Checkpoint]] = {}  # batch id -> its checkpoints, read once
    warehouses = _warehouses(ctx)
    for name in sorted(ctx.registry.upstreams):
        mark = committed.get(name)
        version = mark.committed_version if mark else None
        planned = open_batch.inputs.get(name) if open_batch else None
        floor = max(version or 0, (planned.snapshot_version or 0) if planned else 0)
        look = _look(ctx, name, mark, observer, unreadable.get(name), floor)
        latest = look["latest"]
        cursor = mark.committed_cursor if mark else None
        lag = (
            None
            if latest is None or cursor or look["blocked_by"] == "recreated"
            else latest - (-1 if version is None else version)
        )
        upstream = ctx.registry.upstreams[name]
        held = stuck if open_batch and planned and planned.range is not None else None
        if look["blocked"]:
            state = "blocked"
        elif look["unavailable"]:
            state = "unavailable"
        elif look["waiting"]:
            state = "waiting"
        else:
            state = "stuck" if held else "ok"
        rows.append(
            {
                "upstream": name,
                "rows": _rows_of(ctx, name, mark.batch_id if mark else None, seen),
                # A catalog table's name, and the location it resolved to when the code
                # location loaded (what observation reads).
                "table": upstream.table,
                "location": upstream.path,
                "committed": version if cursor is None else list(cursor),
                # A cursor position as its cursor's own type (a timestamp in ISO 8601 UTC),
                # with its tie-break keys; ``committed`` keeps the raw values.
                "committed_shown": (
                    None
                    if cursor is None
                    else shown_position(cursor, look["cursor_type"], _tie_break(upstream))
                ),
                "rows_without_cursor": look["rows_without_cursor"],
                "latest": latest,
                "lag": lag,
                "mode": look["mode"],
                "open_batch": (
                    f"{open_batch.batch_id} {planned.describe()}"
                    if open_batch and planned
                    else None
                ),
                "last_change": (
                    f"{mark.updated_at:%Y-%m-%d %H:%M:%S} {mark.how} by {mark.actor}"
                    if mark
                    else None
                ),
                "state": state,
                "unavailable": look["unavailable"],
                "waiting": look["waiting"],
                "blocked": look["blocked"],
                "blocked_by": look["blocked_by"],
                "stuck": (
                    {"batch_id": open_batch.batch_id}
                    | {k: held[k] for k in ("since", "pipelines", "reason")}
                    if open_batch and held
                    else None
                ),
                "fix": look["fix"] or (held["fix"] if held else None),
                # The warehouse stage of the chain: each warehouse target reading it, where
                # its own state row says it stands.
                "warehouse": [
                    w.as_dict()
                    for p, w in warehouses.items()
                    if name in ctx.registry.pipelines[p].upstreams
                ],
            }
        )
    return rows


def _warehouses(ctx: Context) -> dict[str, "WarehouseStatus"]:
    """Each warehouse target's status, read once (one connection each)."""
    from watermark_dagster.operations.warehouse import warehouse_status

    return {
        name: warehouse_status(ctx.read_store, p)
        for name, p in sorted(ctx.registry.pipelines.items())
        if p.warehouse is not None
    }


def _warehouse_cell(row: dict[str, Any]) -> str | None:
    found = row.get("warehouse") or []
    return "; ".join(f"{w['pipeline']}: {_warehouse_text(w)}" for w in found) or None


def _warehouse_line(w: dict[str, Any]) -> str:
    """``get``'s line for one warehouse target: its table, state, when, and the lake
    versions it holds."""
    versions = ", ".join(f"{u} v{v}" for u, v in w["loaded_versions"].items())
    return (
        f"{w['table']}: {_warehouse_text(w)}"
        + (f", loaded at {w['loaded_at'][:19]}" if w["loaded_at"] else "")
        + (f", lake version {versions}" if versions else "")
    )


def _warehouse_text(w: dict[str, Any]) -> str:
    if w["state"] == "unreachable":
        return f"unreachable ({w['error']})"
    if w["position"] is None:
        return str(w["state"])
    return f"{w['state']} {w['batch_id']}"


def _tie_break(upstream: Any) -> tuple[str, ...]:
    return tuple(getattr(upstream, "tie_break", ()) or ())


def _committed_cell(row: dict[str, Any]) -> Any:
    if row["committed"] is None:
        return None
    return row["committed_shown"] or row["committed"]


def _without_cursor_text(ctx: Context, row: dict[str, Any]) -> str | None:
    """How many rows of a database upstream have no cursor value, and what is done."""
    count = row.get("rows_without_cursor")
    if not count:
        return None
    upstream = ctx.registry.upstreams[row["upstream"]]
    cursor = getattr(upstream, "cursor", "the cursor")
    return (
        f"{count} row(s) have {cursor} NULL: in no window, loaded by no batch (null_cursor: skip)"
    )


def _rows_of(
    ctx: Context, upstream: str, batch_id: str | None, seen: dict[str, list[Checkpoint]]
) -> dict[str, Any]:
    """Per consumer of ``upstream``: rows read and written in batch ``batch_id`` (its
    successful attempt; one batch's checkpoints are one bucket's read, kept in ``seen``)."""
    if batch_id is None:
        return {}
    if batch_id not in seen:
        seen[batch_id] = ctx.read_store.checkpoints(batch_id=batch_id)
    found: dict[str, Any] = {}
    for c in seen[batch_id]:
        if c.pipeline in ctx.registry.consumers(upstream) and c.status is CheckpointStatus.SUCCESS:
            found[c.pipeline] = {"read": c.rows_read, "written": c.rows_written}
    return found


def _rows_cell(row: dict[str, Any]) -> str | None:
    counts = row["rows"]
    if not counts:
        return None
    return ", ".join(f"{p} {c['read']}/{c['written']}" for p, c in sorted(counts.items()))


def _stuck_text(stuck: dict[str, Any]) -> str:
    pipelines = f" ({', '.join(stuck['pipelines'])})" if stuck["pipelines"] else ""
    reason = f": {stuck['reason']}" if stuck["reason"] else ""
    return (
        f"batch {stuck['batch_id']}{pipelines} is stuck since {stuck['since']}, no longer "
        f"resubmitted{reason}"
    )


def _without_fix(message: str, fix: str | None) -> str:
    return message.removesuffix(f" Fix: {fix}") if fix else message


def _lag_cell(row: dict[str, Any]) -> Any:
    if row["blocked"]:
        return Styled("BLOCKED", "bad")
    return Styled(str(row["lag"]), "warn") if row["lag"] else row["lag"]


def _open_batch_cell(row: dict[str, Any]) -> Any:
    if row["stuck"]:
        return Styled(f"{row['open_batch']} STUCK", "bad")
    return row["open_batch"]


def blocked_lines(ctx: Context, rows: list[dict[str, Any]]) -> list[str]:
    """Under a table of upstreams: each blocked or unavailable one, why, and the fix."""
    lines = []
    for r in rows:
        if r["blocked"]:
            lines.append(ctx.console.paint(f"BLOCKED {r['upstream']}: {r['blocked']}", "bad"))
        elif r["stuck"] and not r["unavailable"]:
            text = f"STUCK {r['upstream']}: {_stuck_text(r['stuck'])}"
            lines.append(ctx.console.paint(text, "bad"))
        elif r["unavailable"]:
            reason = _without_fix(r["unavailable"], r["fix"])
            lines.append(ctx.console.paint(f"UNAVAILABLE {r['upstream']}: {reason}", "warn"))
        elif r["waiting"]:
            lines.append(f"WAITING {r['upstream']}: {r['waiting']}")
            continue
        elif (skipped := _without_cursor_text(ctx, r)) is not None:
            lines.append(ctx.console.paint(f"NO CURSOR {r['upstream']}: {skipped}", "warn"))
            continue
        else:
            continue
        if r["fix"]:
            lines.append(f"  fix: {r['fix']}")
    return lines


def print_status(ctx: Context, *, as_json: bool) -> None:
    """The ``watermark list`` table (or JSON)."""
    rows = status_rows(ctx)
    if as_json:
        ctx.console.json(rows)
        return
    headers = [
        "upstream",
        "committed",
        "latest",
        "lag",
        "mode",
        "state",
        "rows read/written",
        "open batch",
        "last change",
    ]
    # Upstreams named by catalog table get two more columns: the name and where it resolved.
    tables = any(r["table"] for r in rows)
    if tables:
        headers[1:1] = ["table", "location"]
    # A location with a warehouse target gets the warehouse stage's column.
    loads = any(r["warehouse"] for r in rows)
    if loads:
        headers.append("warehouse")
    ctx.console.table(
        headers,
        [
            [
                r["upstream"],
                *([r["table"], r["location"]] if tables else []),
                "none" if r["committed"] is None else _committed_cell(r),
                r["latest"] if r["unavailable"] is None else Styled("unavailable", "bad"),
                _lag_cell(r),
                r["mode"],
                r["state"],
                _rows_cell(r),
                _open_batch_cell(r),
                r["last_change"],
                *([_warehouse_cell(r)] if loads else []),
            ]
            for r in rows
        ],
    )
    lines = blocked_lines(ctx, rows)
    if lines:
        ctx.console.print()
        for line in lines:
            ctx.console.print(line)


def cmd_list(ctx: Context) -> int:
    """Print every upstream's committed and latest version, lag, read mode and open batch."""
    print_status(ctx, as_json=ctx.args.json)
    return EXIT_OK


def _consumer_status(ctx: Context, name: str) -> list[dict[str, Any]]:
    """Each pipeline reading ``name`` and where it stands in the open batch."""
    batch = ctx.read_store.open_batch()
    checkpoints = ctx.read_store.checkpoints(batch_id=batch.batch_id) if batch else []
    out = []
    for pipeline in ctx.registry.consumers(name):
        if batch is None:
            state = None
        elif pipeline not in batch.pipelines:
            state = "not in batch"
        else:
            attempts = [c for c in checkpoints if c.pipeline == pipeline]
            state = attempts[-1].status.value if attempts else "not run yet"
        out.append({"pipeline": pipeline, "open_batch_status": state})
    return out


def _history_rows(history: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for h in history:
        detail = json.loads(h["detail"]) if h.get("detail") else {}
        rows.append(
            [
                f"{h['at']:%Y-%m-%d %H:%M:%S}",
                h["event"],
                h["batch_id"],
                h["old_value"],
                h["new_value"],
                h["actor"],
                detail.get("reason") if isinstance(detail, dict) else None,
            ]
        )
    return rows


def cmd_get(ctx: Context) -> int:
    """Show one upstream in detail: its watermark, who set it, the pipelines reading it and
    where they stand in the open batch, and its recent (or, with ``--history``, whole)
    history.
    """
    name = ctx.upstream(ctx.args.table).name
    [row] = [r for r in status_rows(ctx) if r["upstream"] == name]
    mark = ctx.read_store.committed().get(name)
    # The recent rows read the newest buckets only; --history reads the whole audit.
    limit = None if ctx.args.history else RECENT_HISTORY
    history = ctx.read_store.history(upstream=name, limit=limit)
    out = {
        **row,
        "path": ctx.registry.upstreams[name].path,
        "batch_id": mark.batch_id if mark else None,
        "how": mark.how.value if mark else None,
        "consumers": _consumer_status(ctx, name),
        "history": history,
    }
    files = file_rows(ctx, name) if ctx.args.show_files else None
    if files is not None:
        out["files"] = files
    if ctx.args.json:
        ctx.console.json(out)
        return EXIT_OK
    consumers = ", ".join(
        c["pipeline"] + (f" ({c['open_batch_status']})" if c["open_batch_status"] else "")
        for c in out["consumers"]
    )
    table = ctx.registry.upstreams[name].table
    pairs = [
        ("upstream", name),
        *([("table", table)] if table else []),
        ("path", out["path"]),
        (
            "committed",
            "none (next batch loads a snapshot)"
            if row["committed"] is None
            else _committed_cell(row),
        ),
        *(
            [("without cursor", skipped)]
            if (skipped := _without_cursor_text(ctx, row)) is not None
            else []
        ),
        ("set by", f"{out['how']} {out['batch_id'] or ''}".strip() if mark else None),
        ("latest", row["latest"] if row["unavailable"] is None else Styled("unavailable", "bad")),
        ("lag", _lag_cell(row)),
        ("open batch", _open_batch_cell(row) or "none"),
        ("consumers", consumers),
        ("last change", row["last_change"]),
        *[(f"warehouse {w['pipeline']}", _warehouse_line(w)) for w in row["warehouse"]],
    ]
    if row["state"] == "waiting":
        pairs += [("state", "WAITING"), ("why", row["waiting"])]
    elif row["state"] != "ok":
        if row["blocked"] or row["unavailable"]:
            reason = row["blocked"] or _without_fix(str(row["unavailable"]), row["fix"])
        else:
            reason = _stuck_text(row["stuck"])
        pairs += [
            ("state", Styled(row["state"].upper(), "bad")),
            ("why", reason),
            ("fix", row["fix"]),
        ]
    from watermark_dagster.cli.render import fields

    ctx.console.print(fields(pairs, colour=ctx.console.colour))
    ctx.console.print()
    title = "history" if ctx.args.history else f"recent history (last {RECENT_HISTORY})"
    ctx.console.print(ctx.console.paint(title, "bold"))
    ctx.console.table(
        ["at", "event", "batch", "old", "new", "actor", "reason"], _history_rows(history)
    )
    if files is not None:
        print_files(ctx, files)
    return EXIT_OK
