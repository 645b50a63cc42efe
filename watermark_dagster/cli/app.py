"""Running one ``watermark`` command: parse, dispatch, turn refusals into exit codes."""

import sys
from collections.abc import Sequence

from watermark_dagster.cli.context import EXIT_FAILED, EXIT_REFUSED, Context, Refusal
from watermark_dagster.cli.parser import build_parser
from watermark_dagster.cli.render import Console
from watermark_dagster.errors import RetryableError, WatermarkError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``watermark`` console script; returns the exit code.

    0 success; 1 a failure (pipeline failed, batch stuck, target differs from its
    recompute, control tables contended); 2 bad input or a refused write, nothing written.
    """
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        return int(args.func(Context(args, console)) or 0)
    except Refusal as e:
        console.problem(str(e))
        return EXIT_REFUSED
    except RetryableError as e:
        console.problem(str(e))
        return EXIT_FAILED
    except WatermarkError as e:
        console.problem(str(e))
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
