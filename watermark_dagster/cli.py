"""The ``watermark`` command line.

Commands so far:

* ``watermark demo`` — create the demo upstreams, run batches headless, print where every
  table stands and check the targets against a full recompute.
* ``watermark run`` — one headless cycle of a code location: plan or resume, run, finalize.
* ``watermark list`` — every upstream's committed and latest version, lag and open batch.
* ``watermark dev`` — open the code location in ``dagster dev`` with the sensors running.

Exit codes: 0 success; 1 a pipeline failed or a batch is stuck; 2 bad input or configuration.
"""

import argparse
import importlib
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from watermark_dagster.errors import WatermarkError

DEFAULT_DEFS = "watermark_dagster.definitions:defs"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _watermark_home(args: argparse.Namespace) -> Path:
    home = Path(args.home or os.environ.get("WATERMARK_HOME", ".watermark")).expanduser().resolve()
    os.environ["WATERMARK_HOME"] = str(home)
    return home


def _dagster_home(home: Path) -> Path:
    """DAGSTER_HOME, defaulting to ``<WATERMARK_HOME>/dagster`` with the repo's dagster.yaml."""
    dagster_home = Path(os.environ.get("DAGSTER_HOME") or home / "dagster").resolve()
    dagster_home.mkdir(parents=True, exist_ok=True)
    config = dagster_home / "dagster.yaml"
    if not config.exists():
        shipped = Path.cwd() / "dagster.yaml"
        if shipped.exists():
            shutil.copy(shipped, config)
        else:
            config.write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(dagster_home)
    return dagster_home


def _load_defs(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SystemExit(
            f"watermark: cannot import code location module {module_name!r}: {e}"
        ) from e
    try:
        return getattr(module, attr or "defs")
    except AttributeError:
        raise SystemExit(f"watermark: module {module_name!r} has no attribute {attr!r}") from None


def _store_of(defs: Any) -> Any:
    return defs.resources["watermark_store"].get_store()


def _meta_value(value: Any) -> Any:
    return getattr(value, "path", None) or getattr(value, "value", value)


def _registry_upstreams(defs: Any) -> dict[str, str]:
    """upstream name -> path, from the code location's observable source asset specs."""
    out = {}
    for spec in defs.resolve_all_asset_specs():
        path = spec.metadata.get("path")
        if spec.group_name == "upstreams" and path is not None:
            out[spec.key.to_user_string()] = str(_meta_value(path))
    return out


def _not_runnable(_batch: Any) -> Any:
    raise RuntimeError("the command line's view of a registry does not run transforms")


def _registry_of(defs: Any) -> Any:
    """The code location's upstreams and pipeline inputs, rebuilt from its asset specs."""
    from watermark_dagster.registry import Pipeline, Registry, Upstream

    specs = list(defs.resolve_all_asset_specs())
    upstreams = []
    for spec in specs:
        if spec.group_name == "upstreams" and "path" in spec.metadata:
            cap = spec.metadata.get("max_versions_per_batch")
            upstreams.append(
                Upstream(
                    spec.key.to_user_string(),
                    path=str(_meta_value(spec.metadata["path"])),
                    max_versions_per_batch=None if cap is None else int(_meta_value(cap)),
                )
            )
    names = {u.name for u in upstreams}
    pipelines = []
    for spec in specs:
        if spec.group_name == "pipelines" and "target" in spec.metadata:
            ups = tuple(
                d.asset_key.to_user_string()
                for d in spec.deps
                if d.asset_key.to_user_string() in names
            )
            keys = tuple(_meta_value(spec.metadata.get("keys")) or ("_",))
            pipelines.append(
                Pipeline(
                    spec.key.to_user_string(),
                    ups,
                    str(_meta_value(spec.metadata["target"])),
                    keys,
                    _not_runnable,
                )
            )
    return Registry(upstreams=upstreams, pipelines=pipelines)


def _fail(message: str) -> int:
    print(f"watermark: {message}", file=sys.stderr)
    return 2


def _check_upstream(defs: Any, table: str) -> str | None:
    known = sorted(_registry_upstreams(defs))
    if table not in known:
        return f"unknown upstream {table!r}; the code location has {known}. Use `watermark list`."
    return None


def status_rows(defs: Any) -> list[dict[str, Any]]:
    """Every upstream: committed, latest, lag, open batch range and last change."""
    from watermark_dagster.observe.delta_log import latest_local_version

    store = _store_of(defs)
    committed = store.committed()
    open_batch = store.open_batch()
    rows = []
    for name, path in sorted(_registry_upstreams(defs).items()):
        latest = latest_local_version(str(path)) if "://" not in str(path) else None
        mark = committed.get(name)
        version = mark.committed_version if mark else None
        lag = None if latest is None else latest - (-1 if version is None else version)
        planned = open_batch.inputs.get(name) if open_batch else None
        rows.append(
            {
                "upstream": name,
                "committed": version,
                "latest": latest,
                "lag": lag,
                "open_batch": (
                    f"{open_batch.batch_id} {planned.range or 'NOOP'}"
                    if open_batch and planned
                    else None
                ),
                "last_change": (
                    f"{mark.updated_at:%Y-%m-%d %H:%M:%S} {mark.how} by {mark.actor}"
                    if mark
                    else None
                ),
            }
        )
    return rows


def _print_status(defs: Any, as_json: bool) -> None:
    rows = status_rows(defs)
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    headers = ["upstream", "committed", "latest", "lag", "open batch", "last change"]
    print(_table(headers, [list(r.values()) for r in rows]))


def _spark_for(defs: Any) -> Any:
    """Start the code location's Spark session once for the whole command."""
    return defs.resources["spark"].get_session()


def cmd_run(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from watermark_dagster.headless import HeadlessRunner

    home = _watermark_home(args)
    _dagster_home(home)
    defs = _load_defs(args.defs)
    spark = _spark_for(defs)
    try:
        report = HeadlessRunner(defs, DagsterInstance.get(), log=print).run_until_idle()
    finally:
        spark.stop()
    print()
    _print_status(defs, args.json)
    failed = report.failed_runs
    if report.stuck or failed:
        for r in failed:
            print(
                f"\nFAILED: batch {r.batch_id} pipelines {r.pipelines}: {r.error}", file=sys.stderr
            )
        if report.stuck:
            print(f"\n{report.stuck}", file=sys.stderr)
        return 1
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from dagster import DagsterInstance

    from watermark_dagster.demo import DemoPaths, apply_round, seed
    from watermark_dagster.demo.verify import compare_with_full_recompute
    from watermark_dagster.headless import HeadlessRunner

    home = _watermark_home(args)
    if args.fresh and home.exists():
        shutil.rmtree(home)
    _dagster_home(home)
    defs = _load_defs(DEFAULT_DEFS)
    spark = _spark_for(defs)
    spark.sparkContext.setLogLevel("ERROR")
    paths = DemoPaths(home)
    quiet = (lambda _m: None) if args.quiet else (lambda m: print(f"  {m}"))
    try:
        created = seed(spark, paths)
        print(f"demo upstreams {'created' if created else 'found'} under {home / 'demo'}")
        runner = HeadlessRunner(defs, DagsterInstance.get(), log=quiet, run_log_level="WARNING")
        report = runner.run_until_idle()
        batches = list(report.completed)
        start = max((b.seq for b in _store_of(defs).batches()), default=0)
        for n in range(args.rounds):
            commits = apply_round(spark, paths, start + n + 1)
            print(f"round {n + 1}: committed {commits} new upstream versions")
            report = runner.run_until_idle()
            batches += report.completed
            if report.stuck or report.failed_runs:
                break
        print(f"batches completed: {', '.join(batches) or 'none'}\n")
        _print_status(defs, False)
        print()
        checks = compare_with_full_recompute(spark, paths)
        for check in checks:
            verdict = (
                "equals a full recompute"
                if check.ok
                else (
                    f"DIFFERS from a full recompute: missing {list(check.missing)}, "
                    f"unexpected {list(check.unexpected)}"
                )
            )
            print(f"target {check.target}: {check.rows} rows, {verdict}")
    finally:
        spark.stop()
    print(f"\nDagster instance: {os.environ['DAGSTER_HOME']}  (open it with `watermark dev`)")
    if report.stuck or report.failed_runs or not all(c.ok for c in checks):
        return 1
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    home = _watermark_home(args)
    _dagster_home(home)
    _print_status(_load_defs(args.defs), args.json)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    home = _watermark_home(args)
    _dagster_home(home)
    defs = _load_defs(args.defs)
    problem = _check_upstream(defs, args.table)
    if problem:
        return _fail(problem)
    [row] = [r for r in status_rows(defs) if r["upstream"] == args.table]
    store = _store_of(defs)
    mark = store.committed().get(args.table)
    row["batch_id"] = mark.batch_id if mark else None
    row["how"] = mark.how.value if mark else None
    history = store.history(upstream=args.table) if args.history else []
    if args.json:
        out = {**row, "history": history} if args.history else row
        print(json.dumps(out, indent=2, default=str))
        return 0
    for key, value in row.items():
        print(f"{key:12} {'' if value is None else value}")
    if args.history:
        print()
        rows = [
            [
                f"{h['at']:%Y-%m-%d %H:%M:%S}",
                h["event"],
                h["batch_id"],
                h["old_value"],
                h["new_value"],
                h["actor"],
            ]
            for h in history
        ]
        print(_table(["at", "event", "batch", "old", "new", "actor"], rows))
    return 0


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


def cmd_batches(args: argparse.Namespace) -> int:
    from watermark_dagster.store import BatchStatus

    if args.limit is not None and args.limit < 1:
        return _fail(f"--limit must be 1 or more, got {args.limit}.")
    status = None
    if args.status:
        try:
            status = BatchStatus(args.status.upper())
        except ValueError:
            valid = [s.value for s in BatchStatus]
            return _fail(f"unknown --status {args.status!r}; use one of {valid}.")
    home = _watermark_home(args)
    _dagster_home(home)
    store = _store_of(_load_defs(args.defs))
    found = [b for b in store.batches() if status is None or b.status is status]
    rows = [_batch_summary(b) for b in found[: args.limit or None]]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [
        [
            r["batch_id"],
            r["kind"],
            r["status"],
            r["created_at"],
            ",".join(r["pipelines"]),
            " ".join(f"{u}={v}" for u, v in r["ranges"].items()),
        ]
        for r in rows
    ]
    print(_table(["batch", "kind", "status", "created", "pipelines", "ranges"], table))
    return 0


def cmd_batch(args: argparse.Namespace) -> int:
    import re

    if not re.fullmatch(r"b\d{6,}", args.batch_id):
        return _fail(f"{args.batch_id!r} is not a batch id (they look like b000042).")
    home = _watermark_home(args)
    _dagster_home(home)
    store = _store_of(_load_defs(args.defs))
    try:
        batch = store.get_batch(args.batch_id)
    except WatermarkError as e:
        return _fail(str(e))
    detail = {
        **_batch_summary(batch),
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
            for c in store.checkpoints(batch_id=args.batch_id)
        ],
    }
    if args.json:
        print(json.dumps(detail, indent=2, default=str))
        return 0
    print(
        f"batch {batch.batch_id} (seq {batch.seq}, {batch.kind.value}) {batch.status.value}, "
        f"planned {detail['created_at']} by {batch.actor}\n"
    )
    upstreams = [list(u.values()) for u in detail["upstreams"]]
    print(_table(["upstream", "mode", "start", "end", "advanced"], upstreams))
    print()
    attempts = [
        [
            c["pipeline"],
            c["attempt"],
            c["status"],
            c["rows_read"],
            c["rows_written"],
            c["error"].splitlines()[0][:80] if c["error"] else None,
        ]
        for c in detail["checkpoints"]
    ]
    print(_table(["pipeline", "attempt", "status", "rows read", "rows written", "error"], attempts))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from watermark_dagster.core.planning import plan_batch
    from watermark_dagster.observe.delta_log import Observer, observe_registry

    if not args.dry_run:
        return _fail(
            "`watermark plan` only previews; add --dry-run (the coordinator sensor or "
            "`watermark run` plans for real)."
        )
    home = _watermark_home(args)
    _dagster_home(home)
    defs = _load_defs(args.defs)
    registry = _registry_of(defs)
    store = _store_of(defs)
    open_batch = store.open_batch()
    committed = store.committed_versions()
    look = observe_registry(registry, Observer(), committed)
    positions, errors = look.positions, look.errors
    plan = plan_batch(positions, look.runnable)
    result = {
        "open_batch": open_batch.batch_id if open_batch else None,
        "would_plan": bool(plan.has_work and open_batch is None),
        "pipelines": list(plan.pipelines),
        "upstreams": [
            {
                "upstream": p.name,
                "committed": p.committed_version,
                "latest": p.latest_version,
                "range": str(plan.inputs[p.name].range) if plan.inputs[p.name].range else "NOOP",
            }
            for p in positions
        ],
        "unavailable": errors,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if open_batch is not None:
        print(
            f"batch {open_batch.batch_id} is open: the coordinator resumes it and plans "
            "nothing new until it completes. The next plan after it would be:"
        )
    elif not plan.has_work:
        print("nothing to plan: no upstream has new versions.")
    else:
        print(f"the coordinator would plan now, running {list(plan.pipelines)}:")
    print(
        _table(
            ["upstream", "committed", "latest", "range"],
            [list(u.values()) for u in result["upstreams"]],
        )
    )
    for name, error in errors.items():
        print(f"unavailable: {name}: {error}", file=sys.stderr)
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    home = _watermark_home(args)
    _dagster_home(home)
    dagster = shutil.which("dagster") or str(Path(sys.executable).with_name("dagster"))
    argv = [dagster, "dev", "-w", args.workspace, "-h", args.host, "-p", str(args.port)]
    print(f"DAGSTER_HOME={os.environ['DAGSTER_HOME']} WATERMARK_HOME={home}")
    print(" ".join(argv))
    os.execv(argv[0], argv)
    return 0  # not reached


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="watermark",
        description="Exactly-once incremental processing over Delta Lake, on Dagster.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit codes: 0 ok, 1 a pipeline failed or a batch is stuck, 2 bad input.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, *, defs: bool = True) -> None:
        p.add_argument("--home", help="WATERMARK_HOME (default: $WATERMARK_HOME or ./.watermark)")
        if defs:
            p.add_argument(
                "--defs",
                default=DEFAULT_DEFS,
                help=f"code location as module:attribute (default: {DEFAULT_DEFS})",
            )

    demo = sub.add_parser(
        "demo",
        help="create demo upstreams, run batches headless, print the watermarks",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  watermark demo --rounds 2\n  watermark demo --fresh",
    )
    common(demo, defs=False)
    demo.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds of upstream changes after the first batch (default 2)",
    )
    demo.add_argument("--fresh", action="store_true", help="delete WATERMARK_HOME first")
    demo.add_argument("--quiet", action="store_true", help="no per-run progress lines")
    demo.set_defaults(func=cmd_demo)

    run = sub.add_parser(
        "run",
        help="one headless cycle: plan or resume, run the pipelines, finalize",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example (cron):\n  */10 * * * * cd /srv/lake && watermark run --json",
    )
    common(run)
    run.add_argument("--json", action="store_true", help="print the final status as JSON")
    run.set_defaults(func=cmd_run)

    lst = sub.add_parser(
        "list",
        help="every upstream: committed, latest, lag, open batch",
        epilog="example:\n  watermark list --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(lst)
    lst.add_argument("--json", action="store_true", help="JSON instead of a table")
    lst.set_defaults(func=cmd_list)

    get = sub.add_parser(
        "get",
        help="one upstream's watermark, latest version and lag",
        epilog="example:\n  watermark get -t orders --history",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(get)
    get.add_argument("-t", "--table", required=True, help="upstream name")
    get.add_argument("--history", action="store_true", help="also every change to it")
    get.add_argument("--json", action="store_true", help="JSON instead of text")
    get.set_defaults(func=cmd_get)

    batches = sub.add_parser(
        "batches",
        help="batches with their ranges, newest first",
        epilog="example:\n  watermark batches --status PLANNED --limit 5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(batches)
    batches.add_argument("--status", help="PLANNED, COMPLETED, FAILED or ABANDONED")
    batches.add_argument("--limit", type=int, help="only the newest N")
    batches.add_argument("--json", action="store_true", help="JSON instead of a table")
    batches.set_defaults(func=cmd_batches)

    batch = sub.add_parser(
        "batch",
        help="one batch: ranges, advances, pipeline attempts",
        epilog="example:\n  watermark batch b000042",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(batch)
    batch.add_argument("batch_id", help="e.g. b000042")
    batch.add_argument("--json", action="store_true", help="JSON instead of tables")
    batch.set_defaults(func=cmd_batch)

    plan = sub.add_parser(
        "plan",
        help="what the coordinator would plan now (writes nothing)",
        epilog="example:\n  watermark plan --dry-run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(plan)
    plan.add_argument("--dry-run", action="store_true", help="required: preview only")
    plan.add_argument("--json", action="store_true", help="JSON instead of a table")
    plan.set_defaults(func=cmd_plan)

    dev = sub.add_parser(
        "dev",
        help="open the code location in `dagster dev` (sensors on)",
        epilog="example:\n  watermark dev --port 3000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(dev, defs=False)
    dev.add_argument("--workspace", default="workspace.yaml")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=3000)
    dev.set_defaults(func=cmd_dev)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``watermark`` console script."""
    args = build_parser().parse_args(argv)
    if getattr(args, "rounds", 0) is not None and getattr(args, "rounds", 0) < 0:
        print("watermark: --rounds must be 0 or more", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except WatermarkError as e:
        print(f"watermark: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
