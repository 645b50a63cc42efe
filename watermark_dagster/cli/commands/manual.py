"""``watermark set`` and ``watermark reset``: moving a committed watermark by hand.

Both are validated before anything is written, refused while an open batch reads the
table unless ``--force`` (which abandons that batch), confirmed on a terminal unless
``--yes``, previewed by ``--dry-run``, and recorded in ``history`` with old value, new
value, actor and reason. The use cases are :mod:`watermark_dagster.operations.manual`;
this module parses, confirms and prints.
"""

from datetime import UTC, datetime
from typing import Any

from watermark_dagster.cli.context import EXIT_OK, Context
from watermark_dagster.cli.prompt import confirm
from watermark_dagster.cli.timespec import TimestampError, parse_when
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.errors import BatchStateError, UsageError
from watermark_dagster.operations import manual
from watermark_dagster.operations.landing_set import FilesAtTime, files_at_time
from watermark_dagster.operations.manual import LATEST


def parse_version(text: str) -> int | str:
    """``--version``: a whole number >= 0, or ``latest``.

    Raises:
        UsageError: anything else; the message names the value and the accepted forms.
    """
    raw = text.strip()
    if raw.lower() == LATEST:
        return LATEST
    try:
        version = int(raw)
    except ValueError:
        raise UsageError(
            f"--version {text!r} is not a version; give a whole number such as 5, or `latest`."
        ) from None
    if version < 0:
        raise UsageError(
            f"--version {text!r} is negative; Delta versions start at 0. To read the whole "
            "table again use `watermark reset`."
        )
    return version


def _fmt(version: int | None) -> str:
    return "none" if version is None else str(version)


def _when(text: str, now: datetime) -> datetime:
    try:
        return parse_when(text, now=now)
    except TimestampError as e:
        raise UsageError(str(e)) from None


def _fencing(ctx: Context) -> manual.Fencing:
    """How ``--force`` fences the batch it abandons: its runs stopped through the Dagster
    instance (waiting up to ``--wait`` seconds), its targets fenced through the code
    location's Spark session."""
    wait = float(ctx.args.wait)
    if not wait >= 0:
        raise UsageError(f"--wait {ctx.args.wait!r} is negative; give seconds >= 0 (default 60).")

    def stop_runs(batch_id: str) -> tuple[str, ...]:
        from dagster import DagsterInstance

        from watermark_dagster.dagster_defs.runs import pipeline_keys_of, stop_batch_runs

        keys = None
        if ctx.location.names.prefix:
            partitions = ctx.location.names.batches_partitions
            keys = frozenset(
                pipeline_keys_of(
                    s
                    for s in ctx.defs.resolve_all_asset_specs()
                    if getattr(s.partitions_def, "name", None) == partitions
                ).values()
            )
        with DagsterInstance.get() as instance:
            result = stop_batch_runs(instance, batch_id, pipeline_keys=keys, wait_seconds=wait)
        if result.running:
            raise BatchStateError(
                f"Batch {batch_id} still has runs in flight after waiting {wait:g} s: "
                f"{result.describe_running()}. Nothing was changed.",
                batch_id=batch_id,
                fix="stop them (Terminate in the Dagster UI, or end their process), or wait "
                "longer with --wait SECONDS; then run the command again.",
            )
        return result.stopped

    return manual.Fencing(stop_runs=stop_runs, spark=ctx.spark)


def _change(
    ctx: Context,
    name: str,
    version: int | None,
    *,
    resolved: manual.TimestampResolution | None = None,
) -> int:
    """Preview, confirm and apply one manual move; print exactly what changed."""
    args = ctx.args
    store = ctx.store
    command = "reset" if version is None else "set"
    fencing = _fencing(ctx) if args.force else None  # checks --wait before anything
    preview = manual.preview_change(
        store, ctx.registry, name, version, force=args.force, actor=args.actor, resolved=resolved
    )
    how, actor, extra = preview.how, preview.actor, resolved.as_dict() if resolved else None
    result: dict[str, Any] = {
        "upstream": name,
        "how": how.value,
        "old": preview.old,
        "new": version,
        "changed": preview.changed,
        "open_batch": preview.open_batch,
        "abandoned": [preview.open_batch] if preview.open_batch and preview.changed else [],
        "consumers": list(preview.consumers),
        "effect": preview.effect,
        "actor": actor,
        "reason": args.reason,
        **({"resolved": extra} if extra else {}),
    }
    lines = [f"{name}: committed watermark {_fmt(preview.old)} -> {_fmt(version)}"]
    if isinstance(resolved, FilesAtTime):
        result["files"] = resolved.sides()
        lines.extend(resolved.lines())
    elif extra:
        lines.append(
            f"  --timestamp {extra['timestamp']!r} is {extra['resolved_time']}; the newest "
            f"version committed by then is {version} (at {extra['version_committed_at']})"
        )
    if preview.open_batch is not None:
        lines.append(
            f"  open batch {preview.open_batch} reads {name} ({preview.open_batch_reads}): it "
            "will be ABANDONED"
        )
    lines.append(f"  {preview.effect}")
    why = f"; reason: {args.reason}" if args.reason else " (no --reason given)"
    lines.append(f"  recorded in history as {how.value} by {actor}{why}")
    if not preview.changed:
        result.update(applied=False, dry_run=bool(args.dry_run))
        if args.json:
            ctx.console.json(result)
        else:
            ctx.console.print(
                f"{name}: committed watermark is already {_fmt(preview.old)}; nothing changed."
            )
        return EXIT_OK
    if args.dry_run:
        result.update(applied=False, dry_run=True)
        if args.json:
            ctx.console.json(result)
        else:
            ctx.console.print(f"dry run: nothing written. `watermark {command}` would change:")
            for line in lines:
                ctx.console.print(line)
        return EXIT_OK
    confirm(lines, yes=args.yes, stream=ctx.console.err)
    done = manual.apply_change(
        store,
        ctx.registry,
        preview,
        reason=args.reason,
        force=args.force,
        fencing=fencing,
    )
    change = done.change
    result.update(
        applied=True,
        dry_run=False,
        old=change.old,
        abandoned=list(change.abandoned),
        recovered=list(done.recovered),
        advanced=list(done.advanced),
        stopped=list(done.stopped),
        fenced=list(done.fenced),
        reloads=list(done.reloads),
        effect=done.effect,
    )
    if args.json:
        ctx.console.json(result)
        return EXIT_OK
    reason = f"; reason: {args.reason}" if args.reason else ""
    ctx.console.print(
        ctx.console.paint(
            f"{name}: committed watermark {_fmt(change.old)} -> {_fmt(version)}", "ok"
        )
        + f" ({how.value} by {actor}{reason})"
    )
    if isinstance(resolved, FilesAtTime):
        ctx.console.print(resolved.summary())
    if done.stopped:
        ctx.console.print(
            f"  stopped first: {len(done.stopped)} run(s) of the batch still in flight "
            f"({', '.join(r[:8] for r in done.stopped)})"
        )
    for pipeline in done.recovered:
        ctx.console.print(
            f"  {pipeline}: its target already holds the batch (its run stopped before "
            "recording success): recorded as succeeded"
        )
    if done.advanced:
        ctx.console.print(
            f"  advanced first, as the finalizer would (every consumer applied them): "
            f"{', '.join(done.advanced)}"
        )
    if done.fenced:
        ctx.console.print(
            f"  fenced: {', '.join(done.fenced)} (their targets refuse any late write of the batch)"
        )
    for batch_id in change.abandoned:
        ctx.console.print(
            f"  batch {batch_id} {ctx.console.paint('ABANDONED', 'bad')}; the next plan starts "
            "from the new value"
        )
    if done.reloads:
        ctx.console.print(
            f"  reload in full at the next batch: {', '.join(done.reloads)} (their targets "
            "hold rows of the abandoned batch that the watermarks do not cover)"
        )
    ctx.console.print(f"  {done.effect}")
    ctx.console.print(
        f"  recorded in history ({'WATERMARK_SET' if version is not None else 'WATERMARK_RESET'})"
    )
    return EXIT_OK


def cmd_set(ctx: Context) -> int:
    """``watermark set``: parse --version or --timestamp, resolve it (on a landing upstream,
    to the last file modified by then: :mod:`~watermark_dagster.operations.landing_set`),
    change."""
    args = ctx.args
    if args.version is None and args.timestamp is None:
        raise UsageError(
            "give the new watermark: --version N, --version latest or --timestamp TS "
            "(to start over from a snapshot, use `watermark reset`)."
        )
    if args.version is not None and args.timestamp is not None:
        raise UsageError(
            f"--version {args.version!r} and --timestamp {args.timestamp!r} both given; give "
            "one of them."
        )
    requested = parse_version(args.version) if args.version is not None else None
    if args.timestamp is not None:  # checked before the code location is even loaded
        _when(args.timestamp, datetime.now(UTC))
    from watermark_dagster.operations.coordinate import landing_floor

    name = ctx.upstream(args.table).name
    manual.refuse_cursor(ctx.registry, name)
    resolved = None
    if args.timestamp is not None and isinstance(ctx.registry.upstreams[name], LandingUpstream):
        now = datetime.now(UTC)
        version, resolved = files_at_time(
            ctx.registry,
            name,
            _when(args.timestamp, now),
            text=args.timestamp,
            now=now,
            dry_run=bool(args.dry_run),
            floor=landing_floor(ctx.read_store, name),
        )
    elif args.timestamp is not None:
        now = datetime.now(UTC)
        version, resolved = manual.version_at_time(
            ctx.registry, name, _when(args.timestamp, now), text=args.timestamp, now=now
        )
    else:
        assert requested is not None
        floor = None if args.dry_run else landing_floor(ctx.read_store, name)
        version = manual.requested_version(ctx.registry, name, requested, floor=floor)  # type: ignore[arg-type]
    return _change(ctx, name, version, resolved=resolved)


def cmd_reset(ctx: Context) -> int:
    """``watermark reset``: forget the committed watermark."""
    name = ctx.upstream(ctx.args.table).name
    return _change(ctx, name, None)
