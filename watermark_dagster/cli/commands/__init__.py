"""One module per group of commands; each has ``register(subparsers)``.

Adding a command: write ``register`` in a module here (parser with an example in its
epilog, ``set_defaults(func=...)``, a function ``(Context) -> exit code``) and list the
module in :data:`MODULES`.
"""

from watermark_dagster.cli.commands import (
    batches,
    engine,
    manual,
    replay,
    runtime,
    status,
    verify,
)

MODULES = (status, manual, batches, replay, verify, runtime, engine)

__all__ = ["MODULES"]
