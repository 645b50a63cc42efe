"""The argument parser: one sub-command per operation, each with an example in its help."""

import argparse
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING

from watermark_dagster.cli.context import DEFAULT_DEFS

if TYPE_CHECKING:
    from watermark_dagster.cli.context import Context

DESCRIPTION = """\
Exactly-once incremental processing over Delta Lake, on Dagster: see and steer every
upstream's committed watermark, the batches and the pipelines of a code location.
"""

EPILOG = """\
exit codes:
  0  success
  1  failure: a pipeline failed, a batch is stuck, or `verify` found a difference
  2  bad input, bad configuration or a refused write (nothing was written)

examples:
  watermark list
  watermark get -t orders --history
  watermark set -t orders --version 5 --reason "skip bad load" --dry-run
  watermark plan --dry-run
  watermark verify -p orders_enriched

Every command takes --json for scripts and --help for its options and an example.
Environment: WATERMARK_HOME (default ./.watermark), DAGSTER_HOME (default
$WATERMARK_HOME/dagster), NO_COLOR (plain output even on a terminal).
"""


def add_command(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]",
    name: str,
    func: Callable[["Context"], int],
    *,
    help: str,
    example: str,
    description: str | None = None,
    defs: bool = True,
    json_help: str = "JSON instead of text, for scripts",
) -> argparse.ArgumentParser:
    """A sub-command with the shared options (--home, --defs, --json) and an example."""
    examples = textwrap.indent(example.strip(), "  ")
    parser = sub.add_parser(
        name,
        help=help,
        description=description or help[0].upper() + help[1:] + ".",
        epilog=f"example{'s' if chr(10) in example.strip() else ''}:\n{examples}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--home", help="WATERMARK_HOME (default: $WATERMARK_HOME or ./.watermark)")
    if defs:
        parser.add_argument(
            "--defs",
            default=DEFAULT_DEFS,
            help=f"code location as module:attribute (default: {DEFAULT_DEFS})",
        )
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.set_defaults(func=func)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The ``watermark`` argument parser, with every command registered."""
    from watermark_dagster.cli.commands import MODULES

    parser = argparse.ArgumentParser(
        prog="watermark",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in MODULES:
        module.register(sub)
    return parser
