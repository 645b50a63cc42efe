"""The table of commands: each row names a command, its handler, arguments and help.

Adding a command: write its handler ``(Context) -> exit code`` in a module here (parse
the arguments, call an operation, render the result) and add a :class:`Command` row to
:data:`COMMANDS`, with an example for its help. ``watermark --help`` lists the commands
in the table's order.
"""

import argparse
import textwrap

from watermark_dagster.cli.command import Arg, Command, arg
from watermark_dagster.cli.commands import (
    batches,
    engine,
    manual,
    replay,
    runtime,
    status,
    verify,
)
from watermark_dagster.cli.timespec import ACCEPTED_FORMS

TABLE = arg("-t", "--table", required=True, help="upstream name")

# The options of the commands that move a watermark by hand.
MANUAL_WRITE = (
    arg("--reason", help="why; recorded in history"),
    arg("--dry-run", action="store_true", help="print exactly what would change; write nothing"),
    arg(
        "-y",
        "--yes",
        action="store_true",
        help="do not ask for confirmation (needed off a terminal)",
    ),
    arg(
        "--force",
        action="store_true",
        help="abandon the open batch that reads the table (the next plan starts from the new "
        "value): its runs still in flight are stopped first and its targets fenced; without "
        "it the change is refused",
    ),
    arg(
        "--wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="with --force: how long to wait for the batch's runs to stop (default 60); "
        "if some still run then, nothing is changed",
    ),
    arg("--actor", help="who is making the change (default: user@host)"),
)

COMMANDS: tuple[Command, ...] = (
    Command(
        "list",
        status.cmd_list,
        help="every upstream: committed, latest, lag, open batch, last change",
        example="watermark list\nwatermark list --json | jq '.[] | select(.lag > 0)'",
    ),
    Command(
        "get",
        status.cmd_get,
        help="one upstream: watermark, lag, open batch, consumers, history",
        example=(
            "watermark get -t orders\nwatermark get -t orders --history --json\n"
            "watermark get -t drops --show-files"
        ),
        arguments=(
            TABLE,
            arg(
                "--history",
                action="store_true",
                help=f"every change to it (default: last {status.RECENT_HISTORY})",
            ),
            arg(
                "--show-files",
                action="store_true",
                help="a landing upstream: the files each batch pinned (batch, file, size, "
                "mtime, status), and those waiting for a batch",
            ),
        ),
    ),
    Command(
        "set",
        manual.cmd_set,
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
        arguments=(
            TABLE,
            arg("--version", help="N (a whole number >= 0) or `latest`"),
            arg(
                "--timestamp",
                metavar="TS",
                help="ISO 8601 (no zone = UTC) or a time ago: 90m, 36h, 7d, 1week, '2 weeks'",
            ),
            *MANUAL_WRITE,
        ),
        spark=True,  # --force may fence targets through Spark
    ),
    Command(
        "reset",
        manual.cmd_reset,
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
        arguments=(TABLE, *MANUAL_WRITE),
        spark=True,  # --force may fence targets through Spark
    ),
    Command(
        "batches",
        batches.cmd_batches,
        help="batches with their ranges, newest first",
        example="watermark batches --status PLANNED --limit 5\nwatermark batches --status stuck",
        arguments=(
            arg("--status", help="PLANNED, COMPLETED, FAILED, ABANDONED or STUCK"),
            arg("--limit", type=int, help="only the newest N"),
        ),
    ),
    Command(
        "batch",
        batches.cmd_batch,
        help="one batch: ranges, advances, pipeline attempts and errors",
        example="watermark batch b000042",
        arguments=(arg("batch_id", help="e.g. b000042"),),
    ),
    Command(
        "plan",
        batches.cmd_plan,
        help="what the coordinator would plan now (writes nothing)",
        example="watermark plan --dry-run\nwatermark plan --dry-run --json",
        arguments=(arg("--dry-run", action="store_true", help="required: preview only"),),
    ),
    Command(
        "replay",
        replay.cmd_replay,
        spark=True,
        supervised=True,
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
        arguments=(
            TABLE,
            arg("--from-version", required=True, help="first version (A)"),
            arg("--to-version", required=True, help="last version (B), inclusive"),
            arg("-p", "--pipeline", action="append", help="only this pipeline (repeatable)"),
            arg("--reason", help="why; recorded in history"),
            arg("--dry-run", action="store_true", help="show the plan; write nothing"),
            arg("-y", "--yes", action="store_true", help="do not ask for confirmation"),
            arg("--actor", help="who is replaying (default: user@host)"),
        ),
    ),
    Command(
        "verify",
        verify.cmd_verify,
        spark=True,
        help="compare a pipeline's target with a recompute at the committed versions",
        description=(
            "Recompute a pipeline's target from its upstreams at their committed versions\n"
            "(every upstream read as a snapshot) and compare it with the target: row count,\n"
            "an order-independent checksum over the columns that are not _wm_ columns, and\n"
            "when they differ, the rows only in one side with example keys. Starts Spark.\n"
            "Exit 0 when equal, 1 when different."
        ),
        example="watermark verify -p orders_enriched\nwatermark verify -p orders_enriched --json",
        arguments=(arg("-p", "--pipeline", required=True, help="pipeline name"),),
    ),
    Command(
        "demo",
        runtime.cmd_demo,
        spark=True,
        supervised=True,
        help="create demo upstreams, run batches headless, print the watermarks",
        example="watermark demo --rounds 2\nwatermark demo --fresh",
        defs=False,
        json_help="print the summary as JSON (progress goes to stderr)",
        arguments=(
            arg(
                "--rounds",
                type=int,
                default=2,
                help="rounds of upstream changes after the first batch (default 2)",
            ),
            arg("--fresh", action="store_true", help="delete WATERMARK_HOME first"),
            arg("--quiet", action="store_true", help="no per-run progress lines"),
        ),
    ),
    Command(
        "run",
        runtime.cmd_run,
        spark=True,
        supervised=True,
        help="run batches headless until nothing is left (--once: one batch)",
        description=(
            "Drive the code location without the Dagster daemon (for cron): resume the open\n"
            "batch or plan one, materialize its pipelines, finalize it, and repeat until no\n"
            "upstream has anything new, so commits that arrive meanwhile are run too. With\n"
            "--once, stop after one batch. Exit 1 names the pipeline that failed, the stuck\n"
            "batch, or an upstream nothing can be planned for (recreated or missing) and its\n"
            "fix."
        ),
        example=(
            "*/10 * * * * cd /srv/lake && watermark run --json >> watermark-run.log\n"
            "watermark run --once"
        ),
        json_help="print the outcome as JSON (progress goes to stderr)",
        arguments=(
            arg(
                "--once",
                action="store_true",
                help="plan or resume at most one batch, run it, finalize it, stop",
            ),
            arg(
                "--retry",
                action="store_true",
                help="run the open batch's unfinished pipelines once more, even if it is stuck "
                "(after you fixed what its reason named), then go on until idle",
            ),
        ),
    ),
    Command(
        "dev",
        runtime.cmd_dev,
        help="open the code location in `dagster dev` (sensors on), from any directory",
        description=(
            "Start `dagster dev` on the code location (--defs) with this DAGSTER_HOME and\n"
            "WATERMARK_HOME, from any directory: the workspace is written to\n"
            "$DAGSTER_HOME/workspace.yaml unless --workspace names one. Every WATERMARK_*\n"
            "setting (WATERMARK_REGISTRY...) reaches the code server and the runs. Ctrl-C or\n"
            "SIGTERM stops everything it started (webserver, daemon, code servers, runs and\n"
            "their JVMs) within seconds."
        ),
        example="watermark dev --port 3000\nwatermark dev --no-engine",
        json_help="print the command and environment as JSON before starting",
        arguments=(
            arg(
                "--workspace",
                help="a workspace.yaml of your own (default: one generated for --defs)",
            ),
            arg("--host", default="127.0.0.1", help="default: 127.0.0.1"),
            arg("--port", type=int, default=3000, help="default: 3000"),
            arg(
                "--engine",
                action=argparse.BooleanOptionalAction,
                default=True,
                help="start the home's Spark Connect engine (`watermark engine`) beside "
                "dagster dev and run every run's Spark on it (WATERMARK_ENGINE=connect): no "
                "JVM in a run process. --no-engine: each run starts its own JVM "
                "(WATERMARK_ENGINE=process). Default: --engine, unless the code location's "
                "Spark is remote or a cluster",
            ),
        ),
    ),
    Command(
        "engine",
        engine.cmd_engine,
        help="run the home's Spark Connect engine, which runs use instead of a JVM each",
        description=(
            "Run the home's engine in the foreground: a Spark Connect server with Delta\n"
            "and the code location's Spark settings, on a free loopback port recorded in\n"
            "$WATERMARK_HOME/engine/connect.json, with its log in\n"
            "$WATERMARK_HOME/logs/spark-connect.log. Runs of this home (watermark run,\n"
            "watermark demo, runs Dagster launches) use it while it is up and start no\n"
            "JVM; a server that dies is started again. `watermark dev` starts one itself.\n"
            "Stop it with Ctrl-C or SIGTERM."
        ),
        example="watermark engine &\nwatermark run   # no JVM start",
        json_help="print the URL, pids and log as JSON when ready (restarts go to stderr)",
    ),
)

__all__ = ["COMMANDS", "Arg", "Command"]
