"""Change rows in Spark: the one order that decides the latest change per key, and the
quoting every Spark layer uses (:mod:`~watermark_dagster.read` and
:mod:`~watermark_dagster.write` both build on it; neither imports the other for it).

Change rows carry Delta's change-data-feed columns: ``_change_type`` (``insert``,
``update_preimage``, ``update_postimage``, ``delete``; a transform may also return
``upsert``), ``_commit_version`` and ``_commit_timestamp``.

Several changes of one key in a batch are resolved to the latest. "Latest" is decided here
and nowhere else: the highest ``_commit_version`` first, and inside one commit the row that
describes the state *after* the commit (``insert``, ``update_postimage``, anything that is
not a before-image) ahead of the row that describes the state before it (``delete``,
``update_preimage``). One commit can hold both for the same key: a RESTORE, a rewrite for
which Delta records no change files (a delta-rs overwrite), or a MERGE that deletes rows
not matched by its source and inserts their replacements. Without the second rule, which
of the two wins would depend on the order Spark happens to read them in.
"""

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from watermark_dagster.core.columns import BEFORE_IMAGES, CHANGE_TYPE, COMMIT_VERSION, DELETE

_RANK = "_wm_rank"


def quoted_identifier(name: str) -> str:
    """``name`` backtick-quoted for Spark SQL text (a column reference or a clause)."""
    return "`" + name.replace("`", "``") + "`"


def quoted(name: str) -> Column:
    """A column by its exact name (dots and other characters are not interpreted)."""
    return F.col(quoted_identifier(name))


def is_delete(change_type: Column) -> Column:
    """True for a delete row (case-insensitive); NULL change types are not deletes."""
    return F.coalesce(F.lower(change_type) == DELETE, F.lit(False))


def after_commit(change_type: Column) -> Column:
    """1 for a row describing the state after its commit, 0 for a before-image."""
    return F.when(F.lower(change_type).isin(*BEFORE_IMAGES), F.lit(0)).otherwise(F.lit(1))


def latest_first(frame: DataFrame, *then: Column) -> list[Column]:
    """The sort order that puts the latest change of a key first: highest commit version
    (rows without one last), then the after-commit row ahead of a before-image of the same
    commit, then ``then`` (e.g. a cursor position).

    Columns the frame lacks are left out of the order.
    """
    order: list[Column] = []
    if COMMIT_VERSION in frame.columns:
        order.append(F.col(COMMIT_VERSION).desc_nulls_last())
    if CHANGE_TYPE in frame.columns:
        order.append(after_commit(F.col(CHANGE_TYPE)).desc())
    return order + list(then)


def latest_per_key(frame: DataFrame, keys: Sequence[str], *then: Column) -> DataFrame:
    """One row per key: the first in :func:`latest_first` order.

    The same ordering is used wherever a key's latest change is chosen, so when a
    transform's output is already one row per key in this order (``net_changes`` followed
    by per-row projections), choosing again costs Spark neither a shuffle nor a sort.
    """
    order = latest_first(frame, *then)
    if not order:
        raise ValueError(f"no {COMMIT_VERSION} or {CHANGE_TYPE} column to order changes by")
    window = Window.partitionBy(*[quoted(k) for k in keys]).orderBy(*order)
    return frame.withColumn(_RANK, F.row_number().over(window)).where(F.col(_RANK) == 1).drop(_RANK)


__all__ = [
    "after_commit",
    "is_delete",
    "latest_first",
    "latest_per_key",
    "quoted",
    "quoted_identifier",
]
