"""Stages: a database upstream extracted exactly once into a Delta table that downstream
pipelines read as an upstream of its own.

:func:`extraction_stage` makes both halves of the first hop from one declaration: the
extraction pipeline (a merge on the table's keys of each pinned window's rows, deletes
included) and the :class:`~watermark_dagster.config.upstream.DeltaUpstream` over its
target. Each has its own watermark, status and row counts (``watermark list``, the UI); a
failed extraction leaves the stage before it committed and the stage after it untouched
(its upstream has no new version), and its retry reads the same pinned window.

Example:
    >>> orders_db = DatabaseUpstream(name="orders_db", url="jdbc:postgresql://db/shop",
    ...                              source_table="public.orders", cursor="updated_at",
    ...                              tie_break=["id"], password=EnvRef("SHOP_DB_PASSWORD"))
    >>> extract, orders = extraction_stage(orders_db, target="/lake/orders", keys=["id"])
    >>> Registry(upstreams=[orders_db, orders], pipelines=[extract, clean_orders])
"""

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from watermark_dagster.config.batch_context import BatchContext, Transform
from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.columns import CHANGE_TYPE, COMMIT_TIMESTAMP, DELETE, RESERVED_PREFIX

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("watermark_dagster")


def extraction_transform(upstream: DatabaseUpstream, target: str, keys: Sequence[str]) -> Transform:
    """The transform of an extraction pipeline: the latest change per key of the pinned
    window (soft deletes as deletes) and, every ``reconcile_every`` batches, a delete for
    each key the target holds that the table no longer has.

    The reconciliation reads the table's keys when the batch runs, not as of its window: a
    key deleted at the source is deleted from the target by the next reconciling batch,
    and a replay of an old batch (version-guarded) cannot bring one back.
    """
    key_list = list(keys)

    def transform(batch: BatchContext) -> "DataFrame":
        pinned = batch[upstream.name]
        changes = pinned.net_changes(key_list).drop(COMMIT_TIMESTAMP)
        every = upstream.reconcile_every
        if every is None or batch.full_load or batch.seq % every:
            return changes
        return changes.unionByName(_gone_keys(batch, upstream, target, key_list, changes))

    transform.__doc__ = f"Extracts {upstream.source_table} into {target}."
    return transform


def _gone_keys(
    batch: BatchContext,
    upstream: DatabaseUpstream,
    target: str,
    keys: list[str],
    changes: "DataFrame",
) -> "DataFrame":
    """Delete rows for the keys the target holds that the table no longer has (nor the
    window just read), shaped like ``changes``."""
    # Imported when a batch runs: declaring the stage (loading the location) needs no Spark.
    from pyspark.sql import functions as F

    from watermark_dagster.read.database import live_rows, read_table

    spark = batch.spark
    cols = [F.col(f"`{k}`") for k in keys]
    held = spark.read.format("delta").load(target).select(*cols)
    present = live_rows(read_table(spark, upstream), upstream).select(*cols)
    touched = changes.select(*cols)
    gone = held.join(present, keys, "left_anti").join(touched, keys, "left_anti")
    shape = [
        F.col(f"`{f.name}`")
        if f.name in keys
        else (F.lit(DELETE) if f.name == CHANGE_TYPE else F.lit(None).cast(f.dataType)).alias(
            f.name
        )
        for f in changes.schema.fields
    ]
    found = gone.select(*shape)
    log.info(
        "upstream=%s batch=%s: reconciling keys of %s with %s",
        upstream.name,
        batch.batch_id,
        target,
        upstream.source_table,
    )
    return found


def extraction_stage(
    upstream: DatabaseUpstream,
    *,
    target: str,
    keys: Sequence[str],
    pipeline: str | None = None,
    stage: str | None = None,
    description: str | None = None,
) -> tuple[Pipeline, DeltaUpstream]:
    """The extraction pipeline of a database upstream and the Delta upstream over its
    target, for downstream pipelines to read.

    Args:
        upstream: the database upstream.
        target: where the extracted Delta table lives.
        keys: the table's key columns (the merge keys).
        pipeline: the extraction pipeline's name (default ``<upstream>_extract``).
        stage: the Delta upstream's name (default ``<upstream>_lake``).
        description: shown in the UI for both.

    Returns:
        ``(extraction pipeline, Delta upstream over its target)``.

    Raises:
        ConfigurationError: a key or name is not valid (as for any pipeline or upstream).
    """
    name = pipeline or f"{upstream.name}_extract"
    if any(k.startswith(RESERVED_PREFIX) for k in keys):
        keys = [k for k in keys if not k.startswith(RESERVED_PREFIX)]
    about = description or f"{upstream.source_table} extracted from {upstream.database}"
    extract = Pipeline(
        name=name,
        upstreams=(upstream.name,),
        target=target,
        keys=tuple(keys),
        transform=extraction_transform(upstream, target, keys),
        description=about,
        write="merge",
        feed_on_create=True,
    )
    # The target has a change data feed from its first commit: the stage's readers see
    # its updates and deletes.
    lake = DeltaUpstream(
        name=stage or f"{upstream.name}_lake", path=target, description=about, mode="cdf"
    )
    return extract, lake


__all__ = ["extraction_stage", "extraction_transform"]
