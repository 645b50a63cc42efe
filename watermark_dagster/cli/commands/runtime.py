"""``watermark run``, ``demo`` and ``dev``: driving a code location."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from watermark_dagster.cli.commands.status import print_status, status_rows
from watermark_dagster.cli.context import DEFAULT_DEFS, EXIT_FAILED, EXIT_OK, Context
from watermark_dagster.cli.processes import (
    Interrupted,
    ProcessGroup,
    interrupts_ignored,
    interrupts_raise,
    stop_groups,
)
from watermark_dagster.cli.quiet import redirect_stderr
from watermark_dagster.errors import UsageError


def _progress(ctx: Context) -> Any:
    """Progress lines go to stdout, or to the terminal's stderr when stdout carries JSON;
    each is flushed, so a log file keeps them up to the moment a killed process died."""
    stream = ctx.console.err if ctx.args.json else sys.stdout
    return lambda message: print(message, file=stream, flush=True)


def cmd_run(ctx: Context) -> int:
    """Run the code location headless until no work is left (one batch with ``--once``).

    Prints the upstreams' status afterwards; fails (exit 1) when a batch is stuck, a run
    failed, or an upstream a pipeline reads is blocked or unavailable (a landing folder
    that waits for its first file is neither: the run is idle).
    """
    from dagster import DagsterInstance

    from watermark_dagster.dagster_defs.headless import HeadlessRunner

    # No Spark here: the first run with work starts it and the cycle stops it, so a cycle
    # with nothing to do (nothing new, every upstream blocked, runs that skip) starts no JVM.
    # Run events stay in the instance; failures are reported once, by the runner.
    report = HeadlessRunner(
        ctx.defs, DagsterInstance.get(), log=_progress(ctx), run_log_level="CRITICAL"
    ).run_until_idle(max_batches=1 if ctx.args.once else None, retry=ctx.args.retry)
    failed = report.failed_runs
    rows = status_rows(ctx)
    # An upstream nothing can be planned for (recreated, missing) fails the run: a cron
    # job must not report success while its pipelines silently stop following the table.
    consumed = {u.name for u in ctx.registry.consumed_upstreams()}
    blocked = [r for r in rows if r["upstream"] in consumed and (r["blocked"] or r["unavailable"])]
    if ctx.args.json:
        ctx.console.json(
            {
                "completed": report.completed,
                "runs": [asdict(r) for r in report.runs],
                "stuck": report.stuck,
                "stopped": report.stopped,
                "blocked": {
                    r["upstream"]: {
                        "reason": r["blocked"] or r["unavailable"],
                        "fix": r["fix"],
                        "pipelines": list(ctx.registry.consumers(r["upstream"])),
                    }
                    for r in blocked
                },
                "upstreams": rows,
            }
        )
    else:
        ctx.console.print()
        print_status(ctx, as_json=False)
    if report.stopped:
        ctx.console.problem(f"STOPPED: {report.stopped}")
    if report.stuck:
        # One message: it carries the failed run's error and its fix.
        ctx.console.problem(report.stuck)
    else:
        for r in failed:
            ctx.console.problem(f"FAILED: batch {r.batch_id} pipelines {r.pipelines}: {r.error}")
    for r in blocked:
        what = {
            "recreated": "was dropped and recreated",
            "unreadable_range": "cannot read its next range",
        }.get(r["blocked_by"], "is unavailable")
        ctx.console.problem(
            f"BLOCKED: upstream {r['upstream']} {what}; nothing is planned for "
            f"{list(ctx.registry.consumers(r['upstream']))}. Fix: {r['fix']}"
        )
    return EXIT_FAILED if report.stuck or report.stopped or failed or blocked else EXIT_OK


def cmd_demo(ctx: Context) -> int:
    """Seed the demo upstreams, process them for ``--rounds`` rounds of new commits, and
    compare every demo target with a full recompute.

    Fails (exit 1) when a batch is stuck, a run failed or a target differs; refuses to run
    with ``WATERMARK_REGISTRY`` set, since it writes and checks demo tables only.
    """
    from dagster import DagsterInstance

    from watermark_dagster.config.env import registry_file
    from watermark_dagster.dagster_defs.headless import HeadlessRunner
    from watermark_dagster.demo import DemoPaths, apply_round, seed
    from watermark_dagster.demo.verify import compare_with_full_recompute

    args = ctx.args
    if args.rounds < 0:
        raise UsageError(f"--rounds must be 0 or more, got {args.rounds}.")
    # The demo writes demo data and checks demo targets: it runs the demo registry only.
    if registry_file() is not None:
        raise UsageError(
            f"WATERMARK_REGISTRY is set ({registry_file()}): `watermark demo` runs the demo "
            "registry only. Unset it for the demo (WATERMARK_REGISTRY= watermark demo), or "
            "use `watermark run` for your registry."
        )
    home = ctx.home
    if args.fresh and home.exists():
        log = ctx.log
        if Path.cwd().resolve().is_relative_to(home.resolve()):
            # Deleting the working directory would leave Spark's launcher without one.
            os.chdir(home.resolve().parent)
        shutil.rmtree(home)
        ctx = Context(args, ctx.console)  # recreate DAGSTER_HOME under the fresh home
        if log is not None:  # the log file went with the home: start a new one
            ctx.log = log
            redirect_stderr(log)
    out = _progress(ctx)
    spark = ctx.spark()
    with contextlib.suppress(Exception):  # a Spark Connect session has no SparkContext
        spark.sparkContext.setLogLevel("ERROR")
    paths = DemoPaths(home)
    quiet = (lambda _m: None) if args.quiet else (lambda m: out(f"  {m}"))
    try:
        created = seed(spark, paths)
        out(f"demo upstreams {'created' if created else 'found'} under {home / 'demo'}")
        runner = HeadlessRunner(ctx.defs, DagsterInstance.get(), log=quiet, run_log_level="WARNING")
        report = runner.run_until_idle()
        batches = list(report.completed)
        start = max((b.seq for b in ctx.store.batches(limit=1)), default=0)
        for n in range(args.rounds):
            commits = apply_round(spark, paths, start + n + 1)
            out(f"round {n + 1}: committed {commits} new upstream versions")
            report = runner.run_until_idle()
            batches += report.completed
            if report.stuck or report.failed_runs:
                break
        if report.stuck:
            ctx.console.problem(report.stuck)
        checks = compare_with_full_recompute(spark, paths)
    finally:
        spark.stop()
    if args.json:
        ctx.console.json(
            {
                "completed": batches,
                "upstreams": status_rows(ctx),
                "targets": [
                    {"target": c.target, "rows": c.rows, "equals_full_recompute": c.ok}
                    for c in checks
                ],
                "dagster_home": os.environ["DAGSTER_HOME"],
            }
        )
    else:
        ctx.console.print(f"batches completed: {', '.join(batches) or 'none'}\n")
        print_status(ctx, as_json=False)
        ctx.console.print()
        for check in checks:
            verdict = (
                ctx.console.paint("equals a full recompute", "ok")
                if check.ok
                else ctx.console.paint(
                    f"DIFFERS from a full recompute: missing {list(check.missing)}, "
                    f"unexpected {list(check.unexpected)}",
                    "bad",
                )
            )
            ctx.console.print(f"target {check.target}: {check.rows} rows, {verdict}")
        ctx.console.print(
            f"\nDagster instance: {os.environ['DAGSTER_HOME']}  (open it with `watermark dev`)"
        )
    if report.stuck or report.failed_runs or not all(c.ok for c in checks):
        return EXIT_FAILED
    return EXIT_OK


def cmd_dev(ctx: Context) -> int:
    """Start ``dagster dev`` on the code location with this Dagster and watermark home, from
    any directory: the workspace is generated under DAGSTER_HOME unless ``--workspace``.

    ``dagster dev`` (and, unless ``--no-engine``, the home's Spark Connect engine, which every
    run uses) runs in its own process group;
    SIGINT or SIGTERM stops the whole tree (webserver, daemon, code servers, runs, JVMs)
    within seconds (:func:`.processes.stop_groups`). Returns ``dagster dev``'s exit code
    when it ends by itself, 0 after a clean stop on a signal.

    Raises:
        UsageError: ``--workspace`` names no file.
    """
    args = ctx.args
    dagster = shutil.which("dagster") or str(Path(sys.executable).with_name("dagster"))
    if args.workspace:
        workspace = Path(args.workspace).expanduser().resolve()
        if not workspace.is_file():
            raise UsageError(
                f"--workspace {args.workspace}: no such file ({workspace}). Drop --workspace "
                "to serve the code location (--defs) from a generated workspace."
            )
    else:
        workspace = write_workspace(Path(os.environ["DAGSTER_HOME"]), args.defs)
    argv = [dagster, "dev", "-w", str(workspace), "-h", args.host, "-p", str(args.port)]
    env = {"DAGSTER_HOME": os.environ["DAGSTER_HOME"], "WATERMARK_HOME": str(ctx.home)}
    registry = os.environ.get("WATERMARK_REGISTRY", "").strip()
    if registry:
        # Absolute, so a code server started in another working directory finds it too.
        env["WATERMARK_REGISTRY"] = str(Path(registry).expanduser().resolve())
    engine = args.engine and _engine_applies(ctx)
    # Set either way: runs then use the engine `watermark dev` started, or start their own
    # JVM, whatever the shell's WATERMARK_ENGINE says.
    env["WATERMARK_ENGINE"] = "connect" if engine else "process"
    if args.json:
        ctx.console.json({"argv": argv, "env": env, "workspace": str(workspace)})
    else:
        ctx.console.print(" ".join(f"{k}={v}" for k, v in env.items()))
        ctx.console.print(" ".join(argv))
    sys.stdout.flush()
    # Every other WATERMARK_* setting reaches the code server and the runs by inheritance.
    os.environ.update(env)
    return _supervise_dev(ctx, argv, engine=engine)


def _engine_applies(ctx: Context) -> bool:
    """Whether the code location's runs can use a local engine: not when its Spark is a
    Spark Connect server already or a cluster (said on stderr)."""
    if ctx.args.defs != DEFAULT_DEFS:
        return True  # `watermark engine --defs` reads that location's settings (and refuses)
    remote = os.environ.get("WATERMARK_SPARK_REMOTE", "").strip()
    master = os.environ.get("WATERMARK_SPARK_MASTER", "").strip() or "local[*]"
    where = remote or (None if master.startswith("local") else master)
    if where is None:
        return True
    ctx.console.problem(
        f"no local engine: the code location's Spark is {where}, which its runs use",
        style="warn",
    )
    return False


# The code location's name in the generated workspace: the one the repository's
# workspace.yaml gives it, so sensor states and runs recorded under either stay its own.
LOCATION_NAME = "watermark_dagster"


def write_workspace(dagster_home: Path, defs: str) -> Path:
    """``<DAGSTER_HOME>/workspace.yaml`` loading the code location ``defs``
    (``module:attribute``) from the installed package: no working directory, so it serves
    from any directory and from a plain (non-editable) install. Rewritten only when its
    content changes."""
    import yaml

    module, _, attribute = defs.partition(":")
    name = LOCATION_NAME if defs == DEFAULT_DEFS else module
    spec = {
        "load_from": [
            {
                "python_module": {
                    "module_name": module,
                    "attribute": attribute or "defs",
                    "location_name": name,
                }
            }
        ]
    }
    text = (
        "# Written by `watermark dev` (rewritten on each start); give your own with "
        "--workspace.\n" + yaml.safe_dump(spec, sort_keys=False)
    )
    path = dagster_home / "workspace.yaml"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _supervise_dev(ctx: Context, argv: list[str], *, engine: bool) -> int:
    """Run ``dagster dev`` (beside the home's engine with ``engine``) until it ends or
    SIGINT/SIGTERM arrives, then stop every process either started.

    Raises:
        UsageError: the engine exited before it was ready (its own error is printed above).
    """
    groups: list[tuple[ProcessGroup, int]] = []
    code: int | None = None
    try:
        with interrupts_raise():
            if engine:
                server = _start_engine(ctx.args.defs)
                # On SIGTERM the engine stops its server; both are in its group, so the
                # escalation reaches the JVM too.
                groups.append((server, signal.SIGTERM))
                _wait_until_ready(ctx, server)
            # The interrupt a terminal's Ctrl-C sends: dagster dev, its services and the
            # runs shut down as they do on Ctrl-C (JVMs ignore it and end with their run).
            dev = ProcessGroup(argv, stdin=subprocess.DEVNULL)
            groups.insert(0, (dev, signal.SIGINT))
            code = dev.proc.wait()
    except Interrupted as e:
        ctx.console.problem(f"{e}: stopping dagster dev", style="warn")
    finally:
        with interrupts_ignored():
            escalated = stop_groups(groups)
        for signum, left in escalated:
            ctx.console.problem(
                f"sent {signal.Signals(signum).name} to what was still running: "
                + (", ".join(left) or "dagster dev's process group"),
                style="warn",
            )
    return EXIT_OK if code is None else code


def _start_engine(defs: str) -> ProcessGroup:
    """Start ``watermark engine`` for the code location ``defs`` in its own process group."""
    script = Path(sys.executable).with_name("watermark")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "watermark_dagster.cli"]
    # --json: the engine's ready message is one JSON object on stdout (its progress goes to
    # stderr); it is read until it parses.
    engine = ProcessGroup(
        [*command, "engine", "--defs", defs, "--json"],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    return engine


def _wait_until_ready(ctx: Context, engine: ProcessGroup) -> None:
    """Wait until the engine listens and say where.

    Raises:
        UsageError: the engine exited before it was ready.
    """
    stdout = engine.proc.stdout
    assert stdout is not None
    ready, text = None, ""
    for line in stdout:
        text += line
        with contextlib.suppress(json.JSONDecodeError):
            ready = json.loads(text)
            break
    if ready is None:
        code = engine.proc.wait()
        raise UsageError(
            f"watermark engine exited ({code}) before it was ready (its error is above); "
            "nothing was started. Run `watermark engine` alone to see it, or use --no-engine."
        )
    if ctx.args.json:
        ctx.console.json({"engine": ready})
    else:
        ctx.console.print(
            f"engine ready at {ready['url']} (pid {ready['pid']}; Spark's log {ready['log']}); "
            "runs use it and start no JVM"
        )
    sys.stdout.flush()
