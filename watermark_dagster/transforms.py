"""Helpers for writing incremental transforms."""

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from watermark_dagster.read.inputs import CHANGE_TYPE


def recompute(touched: DataFrame, current: DataFrame, keys: Sequence[str]) -> DataFrame:
    """Changes that make the target hold ``current`` for every key in ``touched``.

    The common pattern for joins and aggregates: find the keys a batch touched (from the
    upstreams' ``changes``), recompute their rows from the upstreams' pinned ``snapshot``s,
    and let this turn the result into upserts for keys that still have a row and deletes
    for keys that no longer do.

    Args:
        touched: the keys the batch affected (other columns are ignored).
        current: the recomputed target rows of (a superset of) those keys.
        keys: the target's key columns.

    Example:
        >>> touched = batch["orders"].changed_keys(["order_id"])
        >>> current = batch["orders"].snapshot.join(touched, "order_id", "left_semi")
        >>> return recompute(touched, current, ["order_id"])
    """
    key_list = list(keys)
    upserts = current.join(touched.select(*key_list).distinct(), key_list, "left_semi")
    gone = (
        touched.select(*key_list).distinct().join(current.select(*key_list), key_list, "left_anti")
    )
    deletes = gone
    for field in current.schema.fields:
        if field.name not in key_list:
            deletes = deletes.withColumn(field.name, F.lit(None).cast(field.dataType))
    deletes = deletes.select(*current.columns)
    return upserts.withColumn(CHANGE_TYPE, F.lit("upsert")).unionByName(
        deletes.withColumn(CHANGE_TYPE, F.lit("delete"))
    )
