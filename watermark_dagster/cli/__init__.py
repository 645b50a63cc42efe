"""The ``watermark`` command line: see and steer a code location's watermarks and batches.

Commands: ``list``, ``get``, ``set``, ``reset``, ``batches``, ``batch``, ``plan --dry-run``,
``verify``, ``run``, ``demo`` and ``dev``; ``watermark --help`` lists them with examples.

Layout: parse -> operations -> render. :mod:`.commands` holds the one table of commands
(name, handler, arguments, help) from which :mod:`.parser` builds the argument parser;
each handler parses its arguments, calls a use case of :mod:`watermark_dagster.operations`
and prints its typed result. :mod:`.context` loads the code location (a
``WatermarkLocation``) with typed access to its store, registry and Spark session;
:mod:`.prompt` asks for confirmation; :mod:`.batch_runner` hands the headless Dagster
runner to a replay; :mod:`.render` prints aligned tables, colours (terminal only,
``NO_COLOR`` respected) and JSON; :mod:`.timespec` parses ``--timestamp`` values.

Exit codes: 0 success; 1 a failure (a pipeline failed, a batch is stuck, ``verify`` found a
difference, control tables contended); 2 bad input (``UsageError``), bad configuration or
a refused write (nothing was written).
"""

from watermark_dagster.cli.app import main
from watermark_dagster.cli.parser import build_parser

__all__ = ["build_parser", "main"]
