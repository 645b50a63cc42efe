"""The control plane: batches, committed watermarks, checkpoints and history in Delta."""

from watermark_dagster.store.readonly import ReadOnlyStoreError, ReadOnlyWatermarkStore
from watermark_dagster.store.store import WatermarkStore, shared_store

__all__ = ["ReadOnlyStoreError", "ReadOnlyWatermarkStore", "WatermarkStore", "shared_store"]
