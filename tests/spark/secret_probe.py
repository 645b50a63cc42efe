"""The transform of ``test_secrets``' pipeline, in a module of its own so that the code
location imports it without the test's imports."""

import hashlib
from typing import Any

from pyspark.sql import functions as F

PROBE_SETTING = "spark.hadoop.fs.s3a.bucket.wm-probe.secret.key"


def probe(batch: Any) -> Any:
    """The upstream's rows, with a digest of the credential the session was built with (the
    value itself is never written)."""
    held = batch.spark.conf.get(PROBE_SETTING, "")
    digest = hashlib.sha256(held.encode()).hexdigest()
    return batch["orders"].changes.select("id", "amount", F.lit(digest).alias("probe"))
