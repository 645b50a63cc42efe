"""``watermark set`` and ``watermark reset``: moving a committed watermark by hand.

Both are validated before anything is written, refused while an open batch reads the
table unless ``--force`` (which abandons that batch), confirmed on a terminal unless
``--yes``, previewed by ``--dry-run``, and recorded in ``history`` with old value, new
value, actor and reason.
"""

import argparse
import sys
import textwrap
from datetime import UTC, datetime
from typing import Any

from watermark_dagster.cli.context import EXIT_OK, Context, Refusal
from watermark_dagster.cli.parser import add_command
from watermark_dagster.cli.timespec import ACCEPTED_FORMS, TimestampError, parse_when, version_at
from watermark_dagster.errors import WatermarkError

LATEST = "latest"


def parse_version(text: str) -> int | str:
    """``--version``: a whole number >= 0, or ``latest``.

    Raises:
        Refusal: anything else; the message names the value and the accepted forms.
    """
    raw = text.strip()
    if raw.lower() == LATEST:
        return LATEST
    try:
        version = int(raw)
    except ValueError:
        raise Refusal(
            f"--version {text!r} is not a version; give a whole number such as 5, or `latest`."
        ) from None
    if version < 0:
        raise Refusal(
            f"--version {text!r} is negative; Delta versions start at 0. To read the whole "
            "table again use `watermark reset`."
        )
    return version


def _fmt(version: int | None) -> str:
    return "none" if version is None else str(version)


def _ms_iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _latest(ctx: Context, name: str) -> int:
    from watermark_dagster.observe.observer import Observer

    return Observer().observe(ctx.registry.upstreams[name]).latest_version


def _refuse_cursor(ctx: Context, name: str) -> None:
    if ctx.registry.upstreams[name].is_cursor:
        raise Refusal(
            f"upstream {name!r} is read through a cursor column (mode='timestamp') and has no "
            f"versions to set; `watermark reset -t {name}` reads it from the start again."
        )


def _resolve_timestamp(ctx: Context, name: str, text: str) -> tuple[int, dict[str, Any]]:
    """The version ``--timestamp text`` means for ``name``, and how it was found."""
    from deltalake import DeltaTable

    now = datetime.now(UTC)
    try:
        when = parse_when(text, now=now)
    except TimestampError as e:
        raise Refusal(str(e)) from None
    if when > now:
        raise Refusal(
            f"--timestamp {text!r} ({when.isoformat()}) is in the future (a time without a "
            "zone is UTC); give a past time, or `--version latest` to skip everything "
            "committed so far."
        )
    upstream = ctx.registry.upstreams[name]
    storage = dict(upstream.storage_options or {}) or None
    history = DeltaTable(upstream.path, storage_options=storage).history()
    commits = [(int(h["version"]), int(h["timestamp"])) for h in history]
    version = version_at(commits, when)
    if version is None:
        oldest, oldest_ms = min(commits)
        if oldest == 0:
            raise Refusal(
                f"--timestamp {text!r} ({when.isoformat()}) is before the first commit of "
                f"upstream {name!r} (version 0 at {_ms_iso(oldest_ms)}): there is no version to "
                f"keep. To read the whole table again, use `watermark reset -t {name}`."
            )
        raise Refusal(
            f"--timestamp {text!r} ({when.isoformat()}) is before the oldest commit left in "
            f"the log of upstream {name!r} (version {oldest} at {_ms_iso(oldest_ms)}; older "
            f"entries were cleaned up). Give a later time, or `watermark reset -t {name}`."
        )
    commit_ms = dict(commits)[version]
    return version, {
        "timestamp": text,
        "resolved_time": when.isoformat(),
        "version_committed_at": _ms_iso(commit_ms),
    }


def _versions(first: int, last: int) -> str:
    return f"version {first}" if first == last else f"versions {first}..{last}"


def _effect(ctx: Context, name: str, old: int | None, new: int | None) -> str:
    """What the consumers will see at the next batch, in one sentence."""
    consumers = ", ".join(ctx.consumers(name)) or "no pipeline"
    if new is None:
        return (
            f"nothing committed: the next batch loads {name} as a snapshot of its latest "
            f"version, and {consumers} reload it in full"
        )
    if old is None:
        return f"the next batch reads {name} from version {new + 1} ({consumers})"
    if new < old:
        return (
            f"the next batch reads {name} from version {new + 1}: {consumers} re-read "
            f"{_versions(new + 1, old)}, already applied once"
        )
    return (
        f"the next batch reads {name} from version {new + 1}: {consumers} never read "
        f"{_versions(old + 1, new)}"
    )


def _confirm(ctx: Context, summary: list[str]) -> None:
    """Ask on the terminal; refuse when there is none and --yes was not given."""
    if ctx.args.yes:
        return
    if not sys.stdin.isatty():
        raise Refusal(
            "this change needs a confirmation and stdin is not a terminal; nothing was "
            "changed. Re-run with --yes to confirm (--dry-run shows what would change)."
        )
    # The question goes to stderr, so stdout stays clean for --json.
    for line in summary:
        print(line, file=sys.stderr)
    print("Proceed? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise Refusal("not confirmed; nothing was changed.")


def _change(
    ctx: Context,
    name: str,
    version: int | None,
    *,
    extra: dict[str, Any] | None = None,
) -> int:
    """Preview, check, confirm and apply one manual move; print exactly what changed."""
    from watermark_dagster.core.records import WatermarkHow, default_actor

    args = ctx.args
    store = ctx.store
    how = WatermarkHow.RESET if version is None else WatermarkHow.MANUAL_SET
    command = "reset" if version is None else "set"
    actor = args.actor or default_actor()
    preview = store.preview_watermark(name, version, how=how)
    reading = store.get_batch(preview.open_batch) if preview.open_batch else None
    read_text = reading.inputs[name].describe() if reading else None
    if reading is not None and not args.force and preview.changed:
        raise Refusal(
            f"batch {reading.batch_id} is open and reads {name} ({read_text}); moving the "
            "watermark now would break it. Nothing was changed. Wait until it completes "
            f"(`watermark batch {reading.batch_id}`), or pass --force to abandon it so the next "
            "plan starts from the new value."
        )
    old = preview.old
    result: dict[str, Any] = {
        "upstream": name,
        "how": how.value,
        "old": old,
        "new": version,
        "changed": preview.changed,
        "open_batch": preview.open_batch,
        "abandoned": [preview.open_batch] if reading is not None and preview.changed else [],
        "consumers": ctx.consumers(name),
        "effect": _effect(ctx, name, old, version),
        "actor": actor,
        "reason": args.reason,
        **({"resolved": extra} if extra else {}),
    }
    headline = f"{name}: committed watermark {_fmt(old)} -> {_fmt(version)}"
    lines = [headline]
    if extra:
        lines.append(
            f"  --timestamp {extra['timestamp']!r} is {extra['resolved_time']}; the newest "
            f"version committed by then is {version} (at {extra['version_committed_at']})"
        )
    if reading is not None:
        lines.append(
            f"  open batch {reading.batch_id} reads {name} ({read_text}): it will be ABANDONED"
        )
    lines.append(f"  {result['effect']}")
    why = f"; reason: {args.reason}" if args.reason else " (no --reason given)"
    lines.append(f"  recorded in history as {how.value} by {actor}{why}")
    if not preview.changed:
        result.update(applied=False, dry_run=bool(args.dry_run))
        if args.json:
            ctx.console.json(result)
        else:
            ctx.console.print(
                f"{name}: committed watermark is already {_fmt(old)}; nothing changed."
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
    _confirm(ctx, lines)
    if reading is not None and preview.changed:
        _advance_finished(ctx, reading, name, actor)
    change = store.set_watermark(
        name,
        version,
        how=how,
        actor=actor,
        reason=args.reason,
        force=args.force,
        expected=preview,
        detail={"resolved": extra} if extra else None,
    )
    result.update(
        applied=True,
        dry_run=False,
        old=change.old,
        abandoned=list(change.abandoned),
        effect=_effect(ctx, name, change.old, version),
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
    for batch_id in change.abandoned:
        ctx.console.print(
            f"  batch {batch_id} {ctx.console.paint('ABANDONED', 'bad')}; the next plan starts "
            "from the new value"
        )
    ctx.console.print(f"  {result['effect']}")
    ctx.console.print(
        f"  recorded in history ({'WATERMARK_SET' if version is not None else 'WATERMARK_RESET'})"
    )
    return EXIT_OK


def _advance_finished(ctx: Context, batch: Any, name: str, actor: str) -> None:
    """Before ``--force`` abandons ``batch``, advance its other upstreams whose consumers
    all succeeded for it: their changes are applied, and re-reading them in the next batch
    would append them twice to an append target (I4)."""
    from watermark_dagster.core.planning import finalize_step
    from watermark_dagster.core.records import BatchStatus, CheckpointStatus
    from watermark_dagster.errors import BatchStateError

    batch = ctx.store.get_batch(batch.batch_id)  # as it is now, not as it was previewed
    if batch.status is not BatchStatus.PLANNED:
        return  # a finalizer ended it meanwhile; set_watermark sees the change
    succeeded = {
        c.pipeline
        for c in ctx.store.checkpoints(batch_id=batch.batch_id)
        if c.status is CheckpointStatus.SUCCESS
    }
    consumers = {u: ctx.consumers(u) for u in batch.inputs}
    step = finalize_step(batch.inputs, batch.advanced, consumers, batch.pipelines, succeeded)
    for upstream in step.advance:
        if upstream == name:
            continue
        try:
            ctx.store.advance(batch, upstream, actor=actor)
        except BatchStateError:
            return  # the batch ended meanwhile (a finalizer completed it)


def cmd_set(ctx: Context) -> int:
    args = ctx.args
    if args.version is None and args.timestamp is None:
        raise Refusal(
            "give the new watermark: --version N, --version latest or --timestamp TS "
            "(to start over from a snapshot, use `watermark reset`)."
        )
    if args.version is not None and args.timestamp is not None:
        raise Refusal(
            f"--version {args.version!r} and --timestamp {args.timestamp!r} both given; give "
            "one of them."
        )
    requested = parse_version(args.version) if args.version is not None else None
    if args.timestamp is not None:  # checked before the code location is even loaded
        try:
            parse_when(args.timestamp, now=datetime.now(UTC))
        except TimestampError as e:
            raise Refusal(str(e)) from None
    name = ctx.upstream(args.table).name
    _refuse_cursor(ctx, name)
    extra = None
    if args.timestamp is not None:
        version, extra = _resolve_timestamp(ctx, name, args.timestamp)
    else:
        try:
            latest = _latest(ctx, name)
        except WatermarkError as e:
            raise Refusal(str(e)) from None
        if requested == LATEST:
            version = latest
        else:
            assert isinstance(requested, int)
            if requested > latest:
                raise Refusal(
                    f"--version {requested} is beyond the latest version of upstream {name!r} "
                    f"({latest}); give a version from 0 to {latest}, or `latest`."
                )
            version = requested
    return _change(ctx, name, version, extra=extra)


def cmd_reset(ctx: Context) -> int:
    name = ctx.upstream(ctx.args.table).name
    return _change(ctx, name, None)


def _writes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reason", help="why; recorded in history")
    parser.add_argument(
        "--dry-run", action="store_true", help="print exactly what would change; write nothing"
    )
    parser.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="do not ask for confirmation (needed off a terminal)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="abandon the open batch that reads the table (the next plan starts from the new "
        "value); without it the change is refused",
    )
    parser.add_argument("--actor", help="who is making the change (default: user@host)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``set`` and ``reset``."""
    set_ = add_command(
        sub,
        "set",
        cmd_set,
        help="move an upstream's committed watermark by hand",
        description=(
            "Move an upstream's committed watermark: the next batch reads it from the\n"
            "version after the new value. Moving it back makes its pipelines re-read\n"
            "versions; moving it forward makes them skip versions. Refused while an open\n"
            "batch reads the table unless --force; asks for confirmation unless --yes;\n"
            "recorded in history with the old and new value, actor and reason.\n\n"
            + textwrap.fill(
                f"--timestamp takes {ACCEPTED_FORMS}. It resolves to the newest version "
                "committed at or before that time, so the next batch starts with the first "
                "commit after it.",
                width=78,
            )
        ),
        example=(
            'watermark set -t orders --version 5 --reason "skip the bad load in 6..7"\n'
            "watermark set -t orders --version latest --yes\n"
            'watermark set -t orders --timestamp "2026-08-09 20:00:01" --dry-run\n'
            "watermark set -t orders --timestamp 2026-08-09T20:00:01+02:00\n"
            "watermark set -t orders --timestamp 7d --force --yes --json"
        ),
    )
    set_.add_argument("-t", "--table", required=True, help="upstream name")
    set_.add_argument("--version", help="N (a whole number >= 0) or `latest`")
    set_.add_argument(
        "--timestamp",
        metavar="TS",
        help="ISO 8601 (no zone = UTC) or a time ago: 90m, 36h, 7d, 1week, '2 weeks'",
    )
    _writes(set_)

    reset = add_command(
        sub,
        "reset",
        cmd_reset,
        help="forget an upstream's committed watermark: the next batch loads a snapshot",
        description=(
            "Forget an upstream's committed watermark (nothing committed): the next batch\n"
            "reads the table as a snapshot of its latest version and its pipelines reload\n"
            "it in full. Refused while an open batch reads the table unless --force; asks\n"
            "for confirmation unless --yes; recorded in history."
        ),
        example=(
            'watermark reset -t orders --reason "table was recreated" --dry-run\n'
            'watermark reset -t orders --reason "table was recreated" --force --yes'
        ),
    )
    reset.add_argument("-t", "--table", required=True, help="upstream name")
    _writes(reset)
