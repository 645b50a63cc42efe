"""How a target is laid out, so that a batch's MERGE touches few files and copies no rows.

* **Deletion vectors** on merge targets: a MERGE that updates or deletes a row marks it
  deleted in a small side file instead of rewriting the whole data file around it. Below
  :data:`REWRITE_BELOW_BYTES` a MERGE rewrites the files it touches instead: for a small
  table that is cheaper than writing deletion vectors (:func:`rewrites_small_target`).
* **Clustered on the merge keys** by default (liquid clustering), unless the pipeline
  chooses ``partition_by`` or ``cluster_by``: a first load writes the rows range-partitioned
  and sorted on the clustering columns, so each file holds a narrow key range and Delta's
  min/max statistics let a MERGE skip the files the batch's keys cannot be in;
  ``OPTIMIZE`` keeps the table clustered afterwards.
* **Bounded files**: a first load writes at most ``spark.sql.files.maxRecordsPerFile`` rows
  per file (1,000,000 when that setting is 0, Spark's "unlimited").

Existing targets keep the layout and properties they were created with: turning deletion
vectors on upgrades a table's protocol (reader version 3), which locks out readers that do
not support them, so it is the owner's call (docs/upstreams-and-targets.md).
"""

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from watermark_dagster.errors import TerminalError
from watermark_dagster.frames.changes import quoted, quoted_identifier
from watermark_dagster.frames.delta import delta_location

log = logging.getLogger("watermark_dagster")

DEFAULT_ROWS_PER_FILE = 1_000_000
_FILL = 0.85
ROWS_PER_FILE_CONF = "spark.sql.files.maxRecordsPerFile"
DELETION_VECTORS = "delta.enableDeletionVectors"
CHANGE_FEED = "delta.enableChangeDataFeed"
# Delta's own way to set a table property's default for every table a session creates;
# when a user sets it for deletion vectors, their choice stands.
DELETION_VECTORS_DEFAULT_CONF = "spark.databricks.delta.properties.defaults.enableDeletionVectors"
# A MERGE into a target whose files hold fewer bytes than this rewrites the files it touches
# rather than writing deletion vectors: Delta writes them in 4 to 8 Spark jobs of their own,
# which cost more than rewriting a small table (the declared demo pipelines' cycle at 200k
# orders, `benchmarks/declared.py`: 0.83x the time, 68 Spark jobs instead of 84). Our own
# Spark setting overrides it (0: always deletion vectors).
REWRITE_BELOW_BYTES = 16 * 1024 * 1024
REWRITE_BELOW_CONF = "spark.watermark.merge.rewriteBelowBytes"
# Delta's switch between the two, read from the session when a MERGE runs.
PERSISTENT_DELETION_VECTORS_CONF = "spark.databricks.delta.merge.deletionVectors.persistent"
# Liquid clustering takes at most 4 columns, each with min/max statistics (the first 32
# columns have them by default).
_MAX_CLUSTER_COLUMNS = 4
_STATS_COLUMNS = 32
_CLUSTERABLE = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.FloatType,
    T.DoubleType,
    T.DecimalType,
    T.StringType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
)


@dataclass(frozen=True)
class Layout:
    """A new target's partitioning or clustering, and its table properties."""

    partition_by: tuple[str, ...] = ()
    cluster_by: tuple[str, ...] = ()
    properties: Mapping[str, str] | None = None


def default_cluster_columns(keys: Sequence[str], schema: T.StructType) -> tuple[str, ...]:
    """The merge keys, when liquid clustering can use them (at most 4 columns of types
    with statistics, among the first 32 columns); otherwise none."""
    names = [f.name for f in schema.fields]
    if not keys or len(keys) > _MAX_CLUSTER_COLUMNS:
        return ()
    for k in keys:
        if k not in names or names.index(k) >= _STATS_COLUMNS:
            return ()
        if not isinstance(schema[k].dataType, _CLUSTERABLE):
            return ()
    return tuple(keys)


def target_layout(
    spark: SparkSession,
    schema: T.StructType,
    *,
    keys: Sequence[str],
    merge: bool,
    partition_by: Sequence[str] = (),
    cluster_by: Sequence[str] = (),
    change_feed: bool = False,
) -> Layout:
    """The layout a new target is created with.

    Merge targets get deletion vectors and, unless the pipeline gives ``partition_by`` or
    ``cluster_by``, clustering on their keys. Append and overwrite targets keep only what
    the pipeline asks for (they never update rows in place). With ``change_feed`` the
    target records Delta's change data feed from its first commit.
    """
    properties: dict[str, str] = {CHANGE_FEED: "true"} if change_feed else {}
    if merge and spark.conf.get(DELETION_VECTORS_DEFAULT_CONF, None) is None:
        properties[DELETION_VECTORS] = "true"
    clustering = tuple(cluster_by)
    if merge and not partition_by and not cluster_by:
        clustering = default_cluster_columns(keys, schema)
    return Layout(tuple(partition_by), clustering, properties)


def rows_per_file(spark: SparkSession) -> int:
    """The most rows a first load writes into one file."""
    configured = int(spark.conf.get(ROWS_PER_FILE_CONF, "0") or 0)
    return configured if configured > 0 else DEFAULT_ROWS_PER_FILE


def laid_out(spark: SparkSession, rows: DataFrame, count: int, layout: Layout) -> DataFrame:
    """``rows`` arranged for a first load: range-partitioned and sorted on the clustering
    columns into files of at most :func:`rows_per_file` rows (unchanged when the target
    is not clustered or the rows fit in one file)."""
    if not layout.cluster_by or count <= rows_per_file(spark):
        # One file's worth: a sorted single file skips no more than the writer's own files
        # would, and the shuffle into one task would cost the write its parallelism.
        return rows
    # Range bounds come from a sample, so partitions vary in size: aim below the bound, so
    # that a partition slightly over it is not split into a full file and a sliver.
    files = math.ceil(count / (rows_per_file(spark) * _FILL))
    columns = [quoted(c) for c in layout.cluster_by]
    return rows.repartitionByRange(files, *columns).sortWithinPartitions(*columns)


_PROPERTY = re.compile(r"[A-Za-z0-9_.\-]+")


def create_target(spark: SparkSession, target: str, schema: T.StructType, layout: Layout) -> None:
    """Create an empty target with its clustering or partitioning and properties, in one
    commit (a crash cannot leave it created but unclustered).

    One ``CREATE TABLE IF NOT EXISTS ... AS SELECT`` over an empty DataFrame of
    ``schema``, passed to ``spark.sql`` as a DataFrame argument rather than spelt out as
    text. Neither Delta's ``DeltaTableBuilder`` (Delta protocol messages, which a Spark
    Connect server without Delta's Connect plugin refuses) nor the DataFrame writers (which
    cannot cluster a path table) are used, so this runs the same on a local session, a
    cluster and Spark Connect. The statement holds only quoted identifiers (the location
    with backticks escaped, column names) and the layout's property names and values,
    which are this module's own and checked as plain words.
    """
    clauses = ["CREATE TABLE IF NOT EXISTS", delta_location(target), "USING delta"]
    if layout.cluster_by:
        clauses.append("CLUSTER BY (" + _identifiers(layout.cluster_by) + ")")
    elif layout.partition_by:
        clauses.append("PARTITIONED BY (" + _identifiers(layout.partition_by) + ")")
    properties = dict(layout.properties or {})
    for text in (*properties.keys(), *properties.values()):
        if not _PROPERTY.fullmatch(text):
            raise ValueError(f"table property {text!r} is not a plain word")
    if properties:
        pairs = ", ".join(f"'{key}' = '{value}'" for key, value in properties.items())
        clauses.append("TBLPROPERTIES (" + pairs + ")")
    clauses.append("AS SELECT * FROM {rows}")
    spark.sql(" ".join(clauses), rows=spark.createDataFrame([], schema))


def _identifiers(names: Sequence[str]) -> str:
    return ", ".join(quoted_identifier(n) for n in names)


def rewrite_below_bytes(spark: SparkSession) -> int:
    """:data:`REWRITE_BELOW_BYTES`, or the session's ``spark.watermark.merge.rewriteBelowBytes``.

    Raises:
        TerminalError: the setting is not a whole number of bytes, 0 or more.
    """
    text = spark.conf.get(REWRITE_BELOW_CONF, None)
    if text is None:
        return REWRITE_BELOW_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise TerminalError(
            f"Spark setting {REWRITE_BELOW_CONF}={text!r} is not a number of bytes.",
            fix=f"set it to a whole number, 0 or more (0: every MERGE writes deletion "
            f"vectors; the default is {REWRITE_BELOW_BYTES})",
        )
    return value


def rewrites_small_target(
    spark: SparkSession, target: str, table: RsDeltaTable, files: pa.Table
) -> int | None:
    """The target's bytes when its next MERGE should rewrite the files it touches rather
    than write deletion vectors (it has them enabled and holds fewer bytes than
    :func:`rewrite_below_bytes`); None when it should write deletion vectors as usual, or
    has none to write. From the Delta log alone (``table`` and its add actions ``files``,
    read once per write by the caller): no Spark job."""
    if str(table.metadata().configuration.get(DELETION_VECTORS, "false")).lower() != "true":
        log.info(
            "target=%s has no deletion vectors: a MERGE rewrites every file holding a "
            "changed key (docs/upstreams-and-targets.md says how to enable them)",
            target,
        )
        return None
    limit = rewrite_below_bytes(spark)
    if limit == 0:
        return None
    size = sum(int(b or 0) for b in files.column("size_bytes").to_pylist())
    return size if size < limit else None
