"""What a process racing others on the same control tables does, at a moment they agreed
on: the store's races between real processes (tests/store/test_store.py, and on S3 in
tests/scale/test_s3_store.py) run these in a pool (:func:`tests.support.processes.spawn_pool`)."""

import time

from watermark_dagster.store import WatermarkStore


def advance_at(root: str, start_at: float, upstream: str) -> str:
    """Advance ``upstream``'s watermark to the open batch's range at the time ``start_at``,
    on the control tables at ``root``; the value committed."""
    store = WatermarkStore(root)
    batch = store.open_batch()
    assert batch is not None
    time.sleep(max(0.0, start_at - time.time()))
    return store.advance(batch, upstream, actor="racer").value
