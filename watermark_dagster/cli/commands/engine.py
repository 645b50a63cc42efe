"""``watermark engine``: the resident engine runs use with ``WATERMARK_ENGINE=resident``."""

import contextlib
import os
import signal
import sys
from typing import Any

from watermark_dagster.cli.context import EXIT_OK, Context
from watermark_dagster.errors import UsageError


def cmd_engine(ctx: Context) -> int:
    """Serve the resident engine: one warm Spark session that runs pipelines on request.

    Listens on the engine socket under the Dagster home until SIGTERM or Ctrl-C, printing
    one line per request, then stops Spark. A second engine on the same socket is a usage
    error.
    """
    from watermark_dagster.runtime.engine import EngineAddress, listening, serve

    address = EngineAddress.under(ctx.home)
    spark = ctx.spark()
    with contextlib.suppress(Exception):  # a Spark Connect session has no SparkContext
        spark.sparkContext.setLogLevel("ERROR")
    spark.range(1).count()  # load Spark's classes before the first request
    stream = ctx.console.err if ctx.args.json else sys.stdout

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        with listening(address) as listener:
            ready = {"socket": str(address.socket), "pid": os.getpid()}
            if ctx.args.json:
                ctx.console.json(ready)
            else:
                ctx.console.print(f"engine ready at {address.socket} (pid {os.getpid()})")
            sys.stdout.flush()

            def progress(request: dict[str, Any], reply: dict[str, Any]) -> None:
                verdict = "FAILED: " + reply["error"]["message"] if "error" in reply else "done"
                print(
                    f"{request.get('pipeline')} on batch {request.get('batch_id')}: {verdict}",
                    file=stream,
                    flush=True,
                )

            serve(
                listener,
                spark=spark,
                store=ctx.store,
                registry=ctx.registry,
                on_request=progress,
            )
    except RuntimeError as e:
        raise UsageError(f"{e}; stop it first, or use it.") from None
    except KeyboardInterrupt:
        pass
    finally:
        # A SIGTERM sent to the whole process group has stopped the JVM already.
        with contextlib.suppress(Exception):
            spark.stop()
    return EXIT_OK
