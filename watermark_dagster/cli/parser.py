"""The argument parser, built from the table of commands (:data:`.commands.COMMANDS`):
one sub-command per operation, each with an example in its help."""

import argparse
import textwrap

from watermark_dagster.cli.command import Command
from watermark_dagster.cli.commands import COMMANDS
from watermark_dagster.cli.context import DEFAULT_DEFS

DESCRIPTION = """\
Exactly-once incremental processing over Delta Lake, on Dagster: see and steer every
upstream's committed watermark, the batches and the pipelines of a code location.
"""

EPILOG = """\
exit codes:
  0  success
  1  failure: a pipeline failed, a batch is stuck, or `verify` found a difference
  2  bad input, bad configuration or a refused write (nothing was written)
  128+N  run, demo, replay: killed by signal N; its runs are recorded as died (a crash)

examples:
  watermark list
  watermark get -t orders --history
  watermark set -t orders --version 5 --reason "skip bad load" --dry-run
  watermark plan --dry-run
  watermark verify -p orders_enriched

Every command takes --json for scripts and --help for its options and an example.
Commands that start Spark (demo, run, replay, verify, engine) write what Spark, its JVM
and Dagster print to $WATERMARK_HOME/logs/<command>.log; -v (--verbose) shows it instead.
Environment: WATERMARK_HOME (default ./.watermark), DAGSTER_HOME (default
$WATERMARK_HOME/dagster), WATERMARK_VERBOSE=1 (as -v), NO_COLOR (plain output even on a
terminal).
"""

VERBOSE_HELP = (
    "show everything Spark, its JVM and Dagster print (dependency resolution, log4j, "
    "warnings) instead of writing it to $WATERMARK_HOME/logs/<command>.log"
)


def add_command(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]", command: Command
) -> argparse.ArgumentParser:
    """A sub-command with the shared options (--home, --defs, --json) and an example."""
    example = command.example.strip()
    examples = textwrap.indent(example, "  ")
    parser = sub.add_parser(
        command.name,
        help=command.help,
        description=command.description or command.help[0].upper() + command.help[1:] + ".",
        epilog=f"example{'s' if chr(10) in example else ''}:\n{examples}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--home", help="WATERMARK_HOME (default: $WATERMARK_HOME or ./.watermark)")
    if command.defs:
        parser.add_argument(
            "--defs",
            default=DEFAULT_DEFS,
            help=f"code location as module:attribute (default: {DEFAULT_DEFS})",
        )
    parser.add_argument("--json", action="store_true", help=command.json_help)
    # Also after the command (`watermark demo -v`); SUPPRESS keeps a -v given before it.
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP
    )
    for argument in command.arguments:
        parser.add_argument(*argument.flags, **argument.options)
    parser.set_defaults(
        func=command.handler, starts_spark=command.spark, supervised=command.supervised
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The ``watermark`` argument parser, with every command registered."""
    parser = argparse.ArgumentParser(
        prog="watermark",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        add_command(sub, command)
    return parser
