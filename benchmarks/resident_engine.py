"""The former resident engine (``watermark_dagster.runtime.engine``), started for the
one benchmark run that compares it with the Spark Connect engine (issue 28). What
``watermark engine`` ran before it started a Spark Connect server.

    python -m benchmarks.resident_engine [--defs module:attribute]

Listens on ``$WATERMARK_HOME/engine/engine.sock`` until SIGTERM; runs with
``WATERMARK_ENGINE=resident`` send their pipelines to it.
"""

import argparse
import contextlib
import signal

from watermark_dagster.config import env
from watermark_dagster.runtime.engine import EngineAddress, listening, serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--defs", default="watermark_dagster.definitions:defs")
    args = parser.parse_args()
    from watermark_dagster.cli.context import load_location
    from watermark_dagster.config.secrets import resolved_options
    from watermark_dagster.runtime.spark import build_spark_session

    location = load_location(args.defs)
    # A session of its own, as before (never the Connect engine of the same home).
    settings = location.spark_resource.settings()
    spark = build_spark_session(
        master=settings.master,
        conf=resolved_options(settings.conf, "The Spark resource") or {},
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(1).count()

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    address = EngineAddress.under(env.home())
    try:
        with listening(address) as listener:
            print(f"resident engine ready at {address.socket}", flush=True)
            serve(listener, spark=spark, store=location.store(), registry=location.registry)
    except KeyboardInterrupt:
        pass
    finally:
        with contextlib.suppress(Exception):
            spark.stop()


if __name__ == "__main__":
    main()
