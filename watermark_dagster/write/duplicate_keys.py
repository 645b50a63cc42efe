"""The duplicate-key check of a write that is not persisted and summarised first (a
rewrite, or a MERGE of changes whose keys the driver holds): the write's own Spark job
fails at the first key with several rows
(:func:`refusing_duplicate_keys`), and the key is read back from Spark's error
(:func:`duplicate_key_in`).
"""

import json
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from watermark_dagster.frames.changes import quoted

# Spark's error when a write's output holds several rows of one key starts with this,
# followed by the key as JSON: the write job itself fails, so Delta commits nothing.
DUPLICATE_KEY_MARKER = "watermark-duplicate-key:"
_KEY_ROWS = "_wm_key_rows"


def refusing_duplicate_keys(frame: DataFrame, keys: Sequence[str]) -> DataFrame:
    """``frame``, failing the Spark job that reads it at the first key with several rows
    (``DUPLICATE_KEY_MARKER`` and the key): the duplicate check of a write that is not
    persisted and summarised first. NULL keys are one key, as the MERGE matches them."""
    columns = [quoted(k) for k in keys]
    rows = F.count(F.lit(1)).over(Window.partitionBy(*columns))
    message = F.concat(
        F.lit(DUPLICATE_KEY_MARKER), F.to_json(F.struct(*columns), {"ignoreNullFields": "false"})
    )
    refused = F.when(F.col(_KEY_ROWS) > 1, F.raise_error(message)).otherwise(F.lit(True))
    return frame.withColumn(_KEY_ROWS, rows).where(refused).drop(_KEY_ROWS)


def duplicate_key_in(error: BaseException) -> dict[str, Any] | None:
    """The key :func:`refusing_duplicate_keys` failed a job at, read from Spark's error
    (a Py4J or a Spark Connect one); None for any other error."""
    text = str(error)
    at = text.find(DUPLICATE_KEY_MARKER)
    if at < 0:
        return None
    try:
        found, _ = json.JSONDecoder().raw_decode(text[at + len(DUPLICATE_KEY_MARKER) :])
    except ValueError:
        return {"key": text[at + len(DUPLICATE_KEY_MARKER) :][:200]}
    return found if isinstance(found, dict) else {"key": found}
