"""The vocabulary of the table of commands: a :class:`Command` row and its :class:`Arg`
arguments (the table itself is :data:`watermark_dagster.cli.commands.COMMANDS`)."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from watermark_dagster.cli.context import Context


@dataclass(frozen=True)
class Arg:
    """One argument of a command: ``flags`` and the keyword arguments of
    :meth:`argparse.ArgumentParser.add_argument`."""

    flags: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)


def arg(*flags: str, **options: Any) -> Arg:
    """An :class:`Arg`, written as :meth:`~argparse.ArgumentParser.add_argument` is called."""
    return Arg(flags, options)


@dataclass(frozen=True)
class Command:
    """One row of the table of commands: its name, handler, arguments and help.

    Every command also takes --home, --json, -v/--verbose and (with ``defs``) --defs. A
    command that may start Spark (``spark``) is quiet unless verbose: what Spark and Dagster
    write goes to a log file (:mod:`watermark_dagster.cli.quiet`). A command that executes
    runs (``supervised``) does so in a child process the command's own process watches, so
    that a run killed by a signal is recorded as died by it (:mod:`.supervise`).
    """

    name: str
    handler: Callable[["Context"], int]
    help: str
    example: str
    arguments: Sequence[Arg] = ()
    description: str | None = None
    defs: bool = True
    json_help: str = "JSON instead of text, for scripts"
    spark: bool = False
    supervised: bool = False
