"""The watermark store: the control plane, kept in four Delta tables written with delta-rs.

No JVM is involved. One method per state transition: each reads the state inside a
compare-and-swap on one table (:mod:`watermark_dagster.store.tables`), asks the pure rules
of :mod:`watermark_dagster.core` what to change, and commits it as the next version or
decides again. This is what makes two coordinators ticking at once plan one batch, and
two finalizers advance a watermark once. Rows are built and parsed by
:mod:`watermark_dagster.store.codec` only.

Each idea lives in its own module, combined here into :class:`WatermarkStore`: the
current state (:mod:`~watermark_dagster.store.reads`), the audit trail
(:mod:`~watermark_dagster.store.history`), plans and replays
(:mod:`~watermark_dagster.store.plans`), changes to a planned batch
(:mod:`~watermark_dagster.store.batch_changes`), watermark moves
(:mod:`~watermark_dagster.store.watermarks`) and pipeline checkpoints
(:mod:`~watermark_dagster.store.checkpoints`).
"""

import threading
from collections.abc import Mapping

from watermark_dagster.store.checkpoints import Checkpoints
from watermark_dagster.store.plans import Plans
from watermark_dagster.store.watermarks import WatermarkMoves


class WatermarkStore(Plans, WatermarkMoves, Checkpoints):
    """The control tables under one root folder (a local path or an object-store URI).

    Args:
        root: folder that holds ``batches``, ``committed_watermarks``,
            ``pipeline_checkpoints`` and ``history``; created on first use.
        storage_options: delta-rs storage options for object stores.
        max_commit_attempts: how many times a conflicting commit is decided again.

    Example:
        >>> store = WatermarkStore("/tmp/control")
        >>> store.committed()  # {} on a new root
    """


_SHARED = threading.local()


def shared_store(root: str, *, storage_options: Mapping[str, str] | None = None) -> WatermarkStore:
    """The store of ``root`` kept for this thread and reused by every sensor tick and run
    step of the process: its table handles are refreshed to the latest version instead of
    loaded from scratch, and the tables are checked once. One per thread, because a store's
    handles are not safe to share between threads.
    """
    key = (str(root), tuple(sorted((storage_options or {}).items())))
    stores: dict[tuple[str, tuple[tuple[str, str], ...]], WatermarkStore] = (
        _SHARED.__dict__.setdefault("stores", {})
    )
    store = stores.get(key)
    if store is None:
        store = stores[key] = WatermarkStore(root, storage_options=storage_options)
    return store


__all__ = ["WatermarkStore", "shared_store"]
