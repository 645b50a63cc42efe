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


def _registry_upstreams(defs: Any) -> dict[str, str]:
    """upstream name -> path, from the code location's observable source asset specs."""
    out = {}
    for spec in defs.resolve_all_asset_specs():
        path = spec.metadata.get("path")
        if spec.group_name == "upstreams" and path is not None:
            out[spec.key.to_user_string()] = getattr(path, "path", None) or getattr(
                path, "value", path
            )
    return out


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
