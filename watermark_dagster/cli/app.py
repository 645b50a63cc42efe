"""Running one ``watermark`` command: parse, dispatch, turn errors into exit codes."""

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from watermark_dagster.cli import supervise
from watermark_dagster.cli.context import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, Context
from watermark_dagster.cli.parser import build_parser
from watermark_dagster.cli.quiet import (
    VERBOSE_ENV,
    log_path,
    redirect_stderr,
    terminal_stderr,
    verbose_requested,
)
from watermark_dagster.cli.render import Console
from watermark_dagster.errors import RetryableError, WatermarkError


def run(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code (argparse exits itself on bad syntax).

    A retryable error (control tables contended) exits 1; every other error of ours,
    usage errors included, exits 2: nothing was written. A command that may start Spark is
    quiet unless ``-v`` (:mod:`.quiet`): file descriptor 2 points at its log file while it
    runs, the command's own messages stay on the terminal.
    """
    args = build_parser().parse_args(argv)
    if verbose_requested(args.verbose):
        os.environ[VERBOSE_ENV] = "1"  # the Spark sessions it starts keep Spark's logging
        return _run(args, Console())
    if not args.starts_spark:
        return _run(args, Console())
    from watermark_dagster.runtime import spark as spark_runtime

    terminal = terminal_stderr()
    saved = os.dup(2)
    previous = spark_runtime.progress_stream, spark_runtime.output_log
    spark_runtime.progress_stream = terminal
    try:
        return _run(args, Console(err=terminal), quiet=True)
    finally:
        spark_runtime.progress_stream, spark_runtime.output_log = previous
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        terminal.close()


def _run(args: argparse.Namespace, console: Console, *, quiet: bool = False) -> int:
    """The command, its errors turned into exit codes; with ``quiet``, after pointing
    stderr at its log file (named on the terminal when the command fails after starting
    Spark: a command refused before that, such as a bad registry or a BLOCKED upstream,
    has nothing of Spark's to show there)."""
    log = None
    sessions_before = 0
    try:
        ctx = Context(args, console)
        if quiet:
            from watermark_dagster.runtime import spark as spark_runtime

            sessions_before = spark_runtime.sessions_started
            log = ctx.log = spark_runtime.output_log = log_path(ctx.home, args.command)
            redirect_stderr(log)
        code = int(args.func(ctx) or 0)
    except RetryableError as e:
        console.problem(str(e))
        code = EXIT_FAILED
    except WatermarkError as e:
        console.problem(str(e))
        code = EXIT_REFUSED
    except Exception:
        if not quiet:
            raise
        # The traceback would otherwise land in the log only.
        console.err.write(traceback.format_exc())
        code = EXIT_FAILED
    if log is not None and code != EXIT_OK and _sessions_started() > sessions_before:
        console.problem(f"what Spark and Dagster printed: {log} (-v shows it here)", style="dim")
    return code


def _sessions_started() -> int:
    from watermark_dagster.runtime import spark as spark_runtime

    return spark_runtime.sessions_started


def _exit_now(code: int) -> None:
    """End the process with ``code``, skipping the interpreter's final teardown.

    delta-rs and Arrow keep worker threads that can outlive Python's teardown and abort it
    ("terminate called without an active exception", exit 134) in a few percent of
    processes, after the command has finished. A script would then see 134 instead of the
    real exit code. Everything the command wrote is committed by then; logs and output
    are flushed first.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``watermark`` console script.

    With ``argv`` None (the console script, ``python -m watermark_dagster.cli``) the
    process ends with the command's exit code; with ``argv`` given (embedding, tests)
    the code is returned.

    Exit codes: 0 success; 1 a failure (pipeline failed, batch stuck, target differs from
    its recompute, control tables contended); 2 bad input or a refused write, nothing
    written; 128 + N the process that executed runs was killed by signal N (``run``,
    ``demo`` and ``replay`` execute them in a watched child, :mod:`.supervise`).
    """
    if argv is None:
        args = build_parser().parse_args()
        if supervise.wanted(args):
            # The child runs the command; this process only watches how it ends.
            code = supervise.supervise(
                lambda: run(None),
                lambda identity, signum: supervise.mark_killed(args, identity, signum),
                exit_child=_exit_now,
            )
        else:
            code = run(None)
        _exit_now(code)
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
