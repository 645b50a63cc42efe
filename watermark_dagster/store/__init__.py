"""The control plane: batches, committed watermarks, checkpoints and history in Delta."""

from watermark_dagster.store.readonly import ReadOnlyStoreError, ReadOnlyWatermarkStore
from watermark_dagster.store.store import (
    Batch,
    BatchKind,
    BatchStatus,
    Checkpoint,
    CheckpointStatus,
    Watermark,
    WatermarkChange,
    WatermarkHow,
    WatermarkStore,
    batch_id_for,
    default_actor,
    seq_of,
)

__all__ = [
    "Batch",
    "BatchKind",
    "BatchStatus",
    "Checkpoint",
    "CheckpointStatus",
    "ReadOnlyStoreError",
    "ReadOnlyWatermarkStore",
    "Watermark",
    "WatermarkChange",
    "WatermarkHow",
    "WatermarkStore",
    "batch_id_for",
    "default_actor",
    "seq_of",
]
