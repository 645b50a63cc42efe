"""Arrow schemas of the four control tables (readable by Spark and any Delta reader).

``batches``, ``pipeline_checkpoints`` and ``history`` grow with every batch. Each is
partitioned by ``bucket``: the batch's sequence number divided by :data:`BUCKET_SIZE`
(``-1`` for a history row of no batch, such as a manual watermark change). A lookup of one
batch's rows, and every read a sensor tick makes, opens one bucket, so its cost does not
grow with the number of past batches. ``committed_watermarks`` holds one row per upstream.
"""

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

BATCHES = pa.schema(
    [
        pa.field("batch_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("plan_id", pa.string(), nullable=False),
        pa.field("upstream", pa.string(), nullable=False),
        pa.field("read_mode", pa.string(), nullable=False),
        pa.field("start_version", pa.int64()),
        pa.field("end_version", pa.int64()),
        pa.field("committed_version", pa.int64()),
        pa.field("latest_version", pa.int64()),
        pa.field("table_id", pa.string()),
        pa.field("schema_fingerprint", pa.string()),
        pa.field("pipelines", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("advanced_at", TS),
        pa.field("created_at", TS, nullable=False),
        pa.field("updated_at", TS, nullable=False),
        pa.field("actor", pa.string()),
        pa.field("error", pa.string()),
        # Added after the first release: nullable, and added to older tables on first use.
        pa.field("full_load", pa.string()),
        pa.field("order_seq", pa.int64()),
        pa.field("start_cursor", pa.string()),
        pa.field("end_cursor", pa.string()),
        pa.field("window_pending", pa.int64()),
        pa.field("source_state", pa.string()),
        # Where the upstream was read from when planned: a catalog table's resolved location,
        # which each run checks the name still points at (I6).
        pa.field("location", pa.string()),
        # Pipelines still owed a reload after a forced change's abandon that this batch
        # could not plan (JSON list): the next plans carry them until one reloads them.
        pa.field("reloads_owed", pa.string()),
        pa.field("bucket", pa.int64(), nullable=False),
    ]
)

COMMITTED_WATERMARKS = pa.schema(
    [
        pa.field("upstream", pa.string(), nullable=False),
        pa.field("committed_version", pa.int64()),
        pa.field("batch_id", pa.string()),
        pa.field("how", pa.string(), nullable=False),
        pa.field("updated_at", TS, nullable=False),
        pa.field("actor", pa.string()),
        pa.field("committed_cursor", pa.string()),
        pa.field("table_id", pa.string()),
        pa.field("source_state", pa.string()),
        # The history row of a manual change (or a start point) until it is in history:
        # written in the same commit as the watermark, cleared once the row is recorded,
        # so a process killed between the two leaves it for the next one to record.
        pa.field("pending_history", pa.string()),
    ]
)

PIPELINE_CHECKPOINTS = pa.schema(
    [
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("batch_id", pa.string(), nullable=False),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("rows_read", pa.int64()),
        pa.field("rows_written", pa.int64()),
        pa.field("run_id", pa.string()),
        pa.field("started_at", TS, nullable=False),
        pa.field("finished_at", TS),
        pa.field("error", pa.string()),
        pa.field("bucket", pa.int64(), nullable=False),
        # What the target held when the attempt began (TargetMark): its Delta version (-1:
        # none yet) and this root's transaction position of the pipeline.
        pa.field("target_version", pa.int64()),
        pa.field("target_position", pa.int64()),
        # The history row of the attempt's outcome (PIPELINE_SUCCEEDED or PIPELINE_FAILED),
        # committed with the row that closes it; a batch's advance copies it into history.
        pa.field("pending_history", pa.string()),
    ]
)

HISTORY = pa.schema(
    [
        pa.field("at", TS, nullable=False),
        pa.field("event", pa.string(), nullable=False),
        pa.field("actor", pa.string()),
        pa.field("batch_id", pa.string()),
        pa.field("upstream", pa.string()),
        pa.field("pipeline", pa.string()),
        pa.field("old_value", pa.string()),
        pa.field("new_value", pa.string()),
        pa.field("detail", pa.string()),
        pa.field("bucket", pa.int64(), nullable=False),
    ]
)

# Batches per bucket: a tick reads at most one bucket's rows of a table (about 1,000 rows).
BUCKET_SIZE = 100

# The bucket of rows that belong to no batch (history of manual changes, start points).
NO_BATCH_BUCKET = -1

BUCKETED = frozenset({"batches", "pipeline_checkpoints", "history"})

# The partition column of the BUCKETED tables.
BUCKET = "bucket"

TABLES: dict[str, pa.Schema] = {
    "batches": BATCHES,
    "committed_watermarks": COMMITTED_WATERMARKS,
    "pipeline_checkpoints": PIPELINE_CHECKPOINTS,
    "history": HISTORY,
}


def bucket_of(batch_id: str | None) -> int:
    """The ``bucket`` of the rows of batch ``batch_id`` (ids are ``b`` + sequence number)."""
    if batch_id is None:
        return NO_BATCH_BUCKET
    return int(batch_id.lstrip("b")) // BUCKET_SIZE
