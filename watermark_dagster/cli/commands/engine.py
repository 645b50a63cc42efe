"""``watermark engine``: the home's Spark Connect engine, which runs use instead of starting
a JVM each (:mod:`watermark_dagster.runtime.connect`)."""

import sys

from watermark_dagster.cli.context import EXIT_OK, Context
from watermark_dagster.cli.processes import Interrupted, interrupts_raise
from watermark_dagster.errors import UsageError


def cmd_engine(ctx: Context) -> int:
    """Serve the home's engine in the foreground: a Spark Connect server with Delta and the
    code location's Spark settings, recorded in ``$WATERMARK_HOME/engine/connect.json``
    where runs find it, and started again if it dies. Stops (server included) on SIGTERM or
    Ctrl-C.

    Prints one ready line (one JSON object with ``--json``), then a line per restart.

    Raises:
        UsageError: the code location runs on a remote Spark (nothing to start), or an engine
            is up for this home already, or the server failed to start.
    """
    from watermark_dagster.runtime.connect import EngineRecord, EngineUnavailableError, serving

    resource = ctx.location.spark_resource
    settings = resource.settings()
    if settings.remote:
        raise UsageError(
            f"The code location's Spark is remote ({settings.remote}): its runs use that "
            "server, so there is no engine to start here. Unset WATERMARK_SPARK_REMOTE to "
            "run a local engine."
        )
    if not settings.master.startswith("local"):
        raise UsageError(
            f"The code location's Spark master is {settings.master}: `watermark engine` "
            "runs a local Spark. Start a Spark Connect server on the cluster and point "
            "WATERMARK_SPARK_REMOTE at it instead (docs/deploy.md)."
        )
    from watermark_dagster.config.secrets import resolved_options

    conf = resolved_options(settings.conf, "The Spark resource") or {}
    stream = ctx.console.err if ctx.args.json else sys.stdout

    def report(what: str, record: EngineRecord) -> None:
        if what == "started":
            ready = {
                "url": record.url,
                "pid": record.pid,
                "server_pid": record.server_pid,
                "log": record.log,
            }
            if ctx.args.json:
                ctx.console.json(ready)
            else:
                ctx.console.print(
                    f"engine ready at {record.url} (pid {record.pid}; Spark's log {record.log}); "
                    "runs of this home use it. Stop it with Ctrl-C."
                )
        else:
            print(
                f"the engine's server died; started again at {record.url} "
                f"(restart {record.restarts}, server pid {record.server_pid})",
                file=stream,
            )
        sys.stdout.flush()
        stream.flush()

    try:
        with (
            interrupts_raise(),
            serving(
                ctx.home,
                master=settings.master,
                conf=conf,
                folder=resource.engine_record_folder(),
                on_event=report,
            ) as watch,
        ):
            watch()
    except Interrupted:
        pass
    except EngineUnavailableError as e:
        raise UsageError(str(e)) from None
    return EXIT_OK
