"""Running one ``watermark`` command: parse, dispatch, turn errors into exit codes."""

import contextlib
import logging
import os
import sys
from collections.abc import Sequence

from watermark_dagster.cli.context import EXIT_FAILED, EXIT_REFUSED, Context
from watermark_dagster.cli.parser import build_parser
from watermark_dagster.cli.render import Console
from watermark_dagster.errors import RetryableError, WatermarkError


def run(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code (argparse exits itself on bad syntax).

    A retryable error (control tables contended) exits 1; every other error of ours,
    usage errors included, exits 2: nothing was written.
    """
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        return int(args.func(Context(args, console)) or 0)
    except RetryableError as e:
        console.problem(str(e))
        return EXIT_FAILED
    except WatermarkError as e:
        console.problem(str(e))
        return EXIT_REFUSED


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
    written.
    """
    code = run(argv)
    if argv is None:
        _exit_now(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
