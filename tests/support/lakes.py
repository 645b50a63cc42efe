"""Small code locations for the read-mode tests, described by a JSON spec file.

The same spec builds the location in the test process, in a child process killed on
purpose, and in the `watermark` command line (``--defs`` of the module :func:`write_spec`
writes beside the spec), so all three see the same upstreams and pipelines.
"""

import json
import os
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from tests.conftest import REPO, SPARK_TEST_CONF
from watermark_dagster.config.batch_context import BatchContext
from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream_kinds import declare_upstream
from watermark_dagster.dagster_defs.definitions import build_definitions
from watermark_dagster.dagster_defs.resources import SparkSessionResource
from watermark_dagster.dagster_defs.settings import WatermarkSettings
from watermark_dagster.read.changes import recompute
from watermark_dagster.read.extraction import extraction_stage


def copy_rows(upstream: str):
    """A transform keeping the latest change per ``id`` of one upstream."""

    def transform(batch: BatchContext) -> DataFrame:
        return batch[upstream].net_changes(["id"]).drop("_commit_timestamp")

    return transform


def doubled(upstream: str):
    """Like :func:`copy_rows`, with ``value`` doubled (a different pipeline, same input)."""

    def transform(batch: BatchContext) -> DataFrame:
        rows = batch[upstream].net_changes(["id"]).drop("_commit_timestamp")
        return rows.withColumn("value", F.col("value") * 2)

    return transform


def appended(upstream: str):
    """Every new row of one upstream, for an append target."""

    def transform(batch: BatchContext) -> DataFrame:
        return batch[upstream].changes.select("id", "value", (F.col("id") % 2).alias("bucket"))

    return transform


def before_images_first(frame: DataFrame) -> DataFrame:
    """``frame`` in one partition with deletes and pre-images ahead of the rows that follow
    them in the same commit: the order in which a tie-break that trusts Spark's row order
    keeps the state before the commit."""
    after = F.col("_change_type").isin("insert", "update_postimage")
    return frame.repartition(1).sortWithinPartitions(after)


def raw_changes(upstream: str):
    """Every change row of one upstream, pre-images included, for the merge to resolve
    (the latest per key by ``_commit_version`` and change type), in adversarial order."""

    def transform(batch: BatchContext) -> DataFrame:
        return before_images_first(batch[upstream].changes.drop("_commit_timestamp"))

    return transform


def recomputed(upstream: str):
    """The touched ids recomputed from the pinned snapshot (``transforms.recompute``)."""

    def transform(batch: BatchContext) -> DataFrame:
        touched = batch[upstream].changed_keys(["id"])
        current = batch[upstream].snapshot.select("id", "value")
        return recompute(touched, current, ["id"])

    return transform


def misspelled(upstream: str):
    """A transform naming a column its upstream does not have (``valeu``): Spark's analyzer
    refuses it, on every attempt."""

    def transform(batch: BatchContext) -> DataFrame:
        return batch[upstream].net_changes(["id"]).select("id", F.col("valeu").alias("value"))

    return transform


TRANSFORMS = {
    "copy": copy_rows,
    "misspelled": misspelled,
    "doubled": doubled,
    "appended": appended,
    "raw": raw_changes,
    "recomputed": recomputed,
}


def registry_from(spec: dict[str, Any]) -> Registry:
    """The registry a spec describes. A pipeline entry ``{"stage": UPSTREAM, "target": ...,
    "keys": [...]}`` declares the extraction stage of a database upstream
    (:func:`~watermark_dagster.read.extraction.extraction_stage`): its pipeline, and the
    Delta upstream over its target."""
    upstreams = [declare_upstream(**u) for u in spec["upstreams"]]
    pipelines = []
    for p in spec["pipelines"]:
        p = dict(p)
        if "stage" in p:
            [source] = [u for u in upstreams if u.name == p["stage"]]
            assert isinstance(source, DatabaseUpstream)
            extract, lake = extraction_stage(source, target=p["target"], keys=p["keys"])
            pipelines.append(extract)
            upstreams.append(lake)
            continue
        transform = TRANSFORMS[p.pop("transform")](p["upstreams"][0])
        pipelines.append(
            Pipeline(
                name=p.pop("name"),
                upstreams=tuple(p.pop("upstreams")),
                target=p.pop("target", ""),  # absent for a target named by table
                keys=tuple(p.pop("keys", ("id",))),
                transform=transform,
                **p,
            )
        )
    return Registry(upstreams=upstreams, pipelines=pipelines)


def defs_from(spec: dict[str, Any]):
    """The code location a spec describes (local[2] Spark, no minimum batch interval).

    Optional spec keys: ``max_attempts``, ``max_deaths`` (default 10),
    ``death_backoff_seconds`` (default 0: a killed run is resumed at once), ``spark_master``
    (a master that cannot start
    proves a command started no JVM; ``spark://...`` for a cluster), ``spark_remote`` (a
    Spark Connect URL), ``spark_conf`` (settings over the tests' own, e.g. a cluster's or a
    catalog's; with a remote, the only ones sent), ``sensor_interval_seconds`` (for a live
    daemon), ``finalize`` (``run``, the default, or ``sensor``: batches finalized by the
    finalizer sensor alone).
    """
    return build_definitions(
        registry_from(spec),
        control_root=spec["control_root"],
        spark=SparkSessionResource(
            master=spec.get("spark_master", "local[2]"),
            remote=spec.get("spark_remote"),
            # A Connect client can send only session settings: the tests' own are for a driver.
            conf=spec.get("spark_conf", {})
            if spec.get("spark_remote")
            else {**SPARK_TEST_CONF, **spec.get("spark_conf", {})},
        ),
        settings=WatermarkSettings(
            min_batch_interval_seconds=0,
            max_attempts=spec.get("max_attempts", 1),
            max_deaths=spec.get("max_deaths", 10),
            death_backoff_seconds=spec.get("death_backoff_seconds", 0),
            sensor_interval_seconds=spec.get("sensor_interval_seconds", 30),
            finalize=spec.get("finalize", "run"),
        ),
    )


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    """Save a spec, and beside it the module holding its code location, for a child process,
    the command line or a Dagster workspace (:func:`location_defs`, :func:`location_path`)."""
    path.write_text(json.dumps(spec))
    module = path.with_name(f"{_module_name(path)}.py")
    module.write_text(
        f'"""The code location of {path.name}, written by tests/support/lakes.py."""\n\n'
        "import json\nfrom pathlib import Path\n\nfrom tests.support.lakes import defs_from\n\n"
        f"defs = defs_from(json.loads(Path({str(path)!r}).read_text()))\n"
    )
    return path


def _module_name(spec_file: Path) -> str:
    return f"lake_{spec_file.stem}"


def location_defs(spec_file: Path) -> str:
    """The ``--defs`` value (``module:attribute``) of the code location of ``spec_file``."""
    return f"{_module_name(spec_file)}:defs"


def location_path(spec_file: Path) -> str:
    """``PYTHONPATH`` for a process loading the code location of ``spec_file``: the
    spec's folder (its module) and the repository (``tests.support.lakes``)."""
    return os.pathsep.join([str(spec_file.parent), str(REPO)])
