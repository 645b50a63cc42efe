"""Delta helpers of the Spark layers: a session setting held for a block (what Delta reads
from the session, as a commit's label), a table's log opened through delta-rs, Spark SQL's
path identifier of a table, and whether an error is Delta's commit conflict. Both
:mod:`~watermark_dagster.read` (a maintained aggregate's state) and
:mod:`~watermark_dagster.write` use them."""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import SparkSession

from watermark_dagster.frames.changes import quoted_identifier

USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
"""The session setting Delta writes into a commit's ``commitInfo.userMetadata``."""

# Delta's optimistic concurrency: another writer committed to the target between this
# write's read and its commit, in a way that conflicts with it (Delta 4's error classes
# and exception names, as they reach Python through Py4J or Spark Connect).
_CONFLICTS = (
    "DELTA_CONCURRENT_",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
)


def is_write_conflict(error: BaseException) -> bool:
    """Whether ``error`` is Delta's concurrent-modification conflict on a commit: another
    writer won, and the same write decided again on the new version may succeed."""
    text = f"{type(error).__name__}: {error}"
    return any(marker in text for marker in _CONFLICTS)


def existing_target(target: str, storage_options: Mapping[str, str] | None) -> RsDeltaTable | None:
    """The target's Delta log at its current version, through delta-rs (no Spark job);
    None when it does not exist yet."""
    options = dict(storage_options) if storage_options else None
    if not RsDeltaTable.is_deltatable(target, storage_options=options):
        return None
    return RsDeltaTable(target, storage_options=options)


@contextmanager
def session_setting(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """Spark setting ``key`` is ``value`` in this block; its previous value (or its
    absence) is restored afterwards. For what Delta reads from the session because its
    commands take no per-call option."""
    previous = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def delta_location(target: str) -> str:
    """``target`` as Spark SQL's path identifier ``delta.`...` `` (backticks escaped)."""
    return "delta." + quoted_identifier(target)


__all__ = [
    "USER_METADATA_CONF",
    "delta_location",
    "existing_target",
    "is_write_conflict",
    "session_setting",
]
