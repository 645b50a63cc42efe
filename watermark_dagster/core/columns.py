"""The column vocabulary shared by reads, writes and checks: Delta's change-data-feed
columns and change types, and the columns the framework adds to targets.

Pure names, no Spark: :mod:`watermark_dagster.frames.changes` holds the Spark expressions
that use them.
"""

# Delta's change-data-feed columns.
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CDF_COLUMNS = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)

# Change types: Delta's four, plus ``upsert``, which a transform may return.
INSERT = "insert"
DELETE = "delete"
PREIMAGE = "update_preimage"
POSTIMAGE = "update_postimage"
UPSERT = "upsert"

# Change types that describe a key's state before its commit.
BEFORE_IMAGES = (DELETE, PREIMAGE)

# Columns the framework adds to targets or reads from transform output start with this.
RESERVED_PREFIX = "_wm_"
# Per target row: the sequence number and id of the batch that last wrote it.
SEQ_COLUMN = "_wm_seq"
# On a full batch's changes: true where the batch's own changes touched no row reaching the
# key, so the target's row differed from the full transform's before this batch: drift
# (write/summary.py counts it; the write drops the column).
UNTOUCHED = "_wm_untouched"
BATCH_COLUMN = "_wm_batch_id"
