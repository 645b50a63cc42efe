"""The ``watermark`` command line: see and steer a code location's watermarks and batches.

Commands: ``list``, ``get``, ``set``, ``reset``, ``batches``, ``batch``, ``plan --dry-run``,
``verify``, ``run``, ``demo`` and ``dev``; ``watermark --help`` lists them with examples.

Layout: :mod:`.parser` builds the argument parser from the command modules in
:mod:`.commands`; :mod:`.context` loads the code location, its store and registry;
:mod:`.render` prints aligned tables, colours (terminal only, ``NO_COLOR`` respected) and
JSON; :mod:`.timespec` parses ``--timestamp`` values.

Exit codes: 0 success; 1 a failure (a pipeline failed, a batch is stuck, ``verify`` found a
difference); 2 bad input, bad configuration or a refused write (nothing was written).
"""

from watermark_dagster.cli.app import main
from watermark_dagster.cli.parser import build_parser

__all__ = ["build_parser", "main"]
