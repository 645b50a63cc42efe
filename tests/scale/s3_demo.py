"""The demo's pipelines, upstreams and recompute on S3, for tests/scale/test_s3_end_to_end.py.

The pipelines are the demo's own, declared (``watermark_dagster.demo.pipelines``): a
registry file names their full transforms and key paths; :class:`S3DemoPaths` puts the
demo's tables under an S3 prefix, so only configuration differs from the local demo.

Run as a script (in its own process, so its Spark session's S3 settings are its own):
``python -m tests.scale.s3_demo PREFIX seed|rounds N M|verify``.
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from watermark_dagster.demo.data import DemoPaths, apply_round, seed
from watermark_dagster.demo.pipelines import build_demo_registry
from watermark_dagster.demo.verify import compare_with_full_recompute

_DEMO = build_demo_registry(DemoPaths(Path("/demo-transforms-only")))
KEYS = {name: list(p.keys or []) for name, p in _DEMO.pipelines.items()}
UPSTREAMS = {name: list(p.upstreams) for name, p in _DEMO.pipelines.items()}
# Each pipeline's key paths as a registry file writes them.
KEY_PATHS = {
    name: {u: str(path) for u, path in p.declared.key_paths.items()}
    for name, p in _DEMO.pipelines.items()
    if p.declared is not None
}


@dataclass(frozen=True)
class S3DemoPaths(DemoPaths):
    """The demo's tables under ``prefix`` (``s3://bucket/lake``)."""

    prefix: str = ""

    def upstream(self, name: str) -> str:
        """URI of a demo upstream table."""
        return f"{self.prefix}/demo/upstreams/{name}"

    def target(self, name: str) -> str:
        """URI of a demo pipeline's target table."""
        return f"{self.prefix}/demo/targets/{name}"

    @property
    def control_root(self) -> str:
        """URI of the control tables."""
        return f"{self.prefix}/control"


def _session(paths: S3DemoPaths):  # a SparkSession configured for the S3 tables
    from tests.conftest import SPARK_TEST_CONF
    from watermark_dagster.runtime.spark import build_spark_session
    from watermark_dagster.runtime.storage import spark_s3_settings

    tables = [(n, paths.upstream(n), None) for n in ("customers", "orders", "payments")]
    conf = {**spark_s3_settings(tables), **SPARK_TEST_CONF}
    return build_spark_session(master="local[1]", app_name="s3-demo", conf=conf)


def main(argv: list[str]) -> None:
    """Seed, change or verify the demo's tables under an S3 prefix."""
    paths = S3DemoPaths(home=Path("/unused"), prefix=argv[0])
    spark = _session(paths)
    try:
        if argv[1] == "seed":
            seed(spark, paths)
        elif argv[1] == "rounds":
            for round_no in argv[2:]:
                apply_round(spark, paths, int(round_no))
        elif argv[1] == "verify":
            checks = compare_with_full_recompute(spark, paths)
            print(json.dumps([{"target": c.target, "ok": c.ok, "rows": c.rows} for c in checks]))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
