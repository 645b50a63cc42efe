"""Keys in Spark: the changed keys of a batch matched against a frame, and a full
transform's rows recomputed for them. The latest change per key is decided in
:mod:`~watermark_dagster.frames.changes`.

Keys are matched null-safely everywhere (:func:`matching_keys`, :func:`missing_keys`, the
MERGE condition, its file-skipping ranges): a NULL key is a key like any other, as it is
a group of its own in a ``GROUP BY``. With ``=``, a row whose key is NULL would never be
touched again after its first load: never updated, never deleted, and no error raised.
"""

import operator
from collections.abc import Sequence
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from watermark_dagster.core.columns import CHANGE_TYPE, DELETE, UPSERT
from watermark_dagster.frames.changes import quoted


def _key_join(
    frame: DataFrame, keys: DataFrame, columns: Sequence[str], names: Sequence[str], how: str
) -> DataFrame:
    right = keys.select(*[quoted(n).alias(f"_wm_key{i}") for i, n in enumerate(names)])
    on = reduce(
        operator.and_,
        [quoted(c).eqNullSafe(F.col(f"_wm_key{i}")) for i, c in enumerate(columns)],
    )
    return frame.join(right, on, how)


def matching_keys(
    frame: DataFrame,
    keys: DataFrame,
    columns: Sequence[str],
    key_columns: Sequence[str] | None = None,
) -> DataFrame:
    """The rows of ``frame`` whose ``columns`` equal a row of ``keys`` (its
    ``key_columns``, by position; default the same names), NULL equal to NULL.

    A semi-join: ``frame``'s columns only, each row once however often its key repeats in
    ``keys``. Use it, rather than ``join(..., "left_semi")``, wherever a batch's touched
    keys select rows: ``=`` never matches a NULL key.
    """
    return _key_join(frame, keys, columns, key_columns or columns, "left_semi")


def missing_keys(
    frame: DataFrame,
    keys: DataFrame,
    columns: Sequence[str],
    key_columns: Sequence[str] | None = None,
) -> DataFrame:
    """The rows of ``frame`` whose ``columns`` equal no row of ``keys``, NULL equal to
    NULL (the anti-join of :func:`matching_keys`)."""
    return _key_join(frame, keys, columns, key_columns or columns, "left_anti")


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

    Keys are matched null-safely (:func:`matching_keys`): a NULL key is updated and
    deleted like any other.

    Example:
        >>> touched = batch["orders"].changed_keys(["order_id"])
        >>> current = matching_keys(batch["orders"].snapshot, touched, ["order_id"])
        >>> return recompute(touched, current, ["order_id"])
    """
    key_list = list(keys)
    wanted = touched.select(*[quoted(k) for k in key_list]).distinct()
    upserts = matching_keys(current, wanted, key_list)
    deletes = missing_keys(wanted, current, key_list)
    for field in current.schema.fields:
        if field.name not in key_list:
            deletes = deletes.withColumn(field.name, F.lit(None).cast(field.dataType))
    deletes = deletes.select(*current.columns)
    return upserts.withColumn(CHANGE_TYPE, F.lit(UPSERT)).unionByName(
        deletes.withColumn(CHANGE_TYPE, F.lit(DELETE))
    )
