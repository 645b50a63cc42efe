"""What a transform receives: the batch, and each upstream as the batch pinned it.

Example:
    >>> def orders_clean(batch: BatchContext) -> DataFrame:
    ...     return batch["orders"].net_changes(["order_id"])
"""

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from watermark_dagster.core.ranges import CursorWindow, ReadMode, VersionRange

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from watermark_dagster.core.strategy import StrategyChoice


class PinnedInput(Protocol):
    """One upstream as a batch pinned it: ``batch["orders"]`` in a transform."""

    @property
    def mode(self) -> ReadMode:
        """How the range is read (``cdf``, ``append_only``, ``snapshot``, ``timestamp``)."""
        ...

    @property
    def range(self) -> VersionRange | None:
        """The pinned version range (None for a cursor upstream)."""
        ...

    @property
    def window(self) -> CursorWindow | None:
        """The pinned cursor window (None for a Delta upstream)."""
        ...

    @property
    def snapshot_version(self) -> int | None:
        """The version ``snapshot`` is read at: the range's end."""
        ...

    @property
    def location(self) -> str:
        """Where the upstream's data lives (a catalog table's resolved location)."""
        ...

    @property
    def changes(self) -> "DataFrame":
        """The change rows in the pinned range, with ``_change_type``,
        ``_commit_version`` and ``_commit_timestamp``."""
        ...

    @property
    def snapshot(self) -> "DataFrame":
        """The table as of the range's end."""
        ...

    def net_changes(self, keys: Sequence[str]) -> "DataFrame":
        """The latest change per key in the range (deletes included)."""
        ...

    def changed_keys(self, columns: Sequence[str]) -> "DataFrame":
        """The distinct values of ``columns`` among the changed rows, both sides of an
        update included."""
        ...


class BatchContext(Protocol):
    """What a transform receives: the batch, and each upstream as the batch pinned it.

    ``batch["orders"].changes`` is the change feed in the pinned range;
    ``batch["orders"].snapshot`` is the table as of the range's end.
    """

    @property
    def batch_id(self) -> str:
        """The batch's id (its Dagster partition key)."""
        ...

    @property
    def seq(self) -> int:
        """The batch's sequence number."""
        ...

    @property
    def pipeline(self) -> str:
        """The pipeline being run."""
        ...

    @property
    def spark(self) -> "SparkSession":
        """The Spark session the inputs are read with."""
        ...

    @property
    def full_load(self) -> bool:
        """True when the pipeline reloads: every input's ``changes`` is its snapshot."""
        ...

    @property
    def strategy(self) -> "StrategyChoice | None":
        """How this batch is planned to be computed, for a pipeline that has a full
        transform (None for a hand-written pipeline without one and for a full load). The
        value never changes: when a declared pipeline's derived transform switches to its
        whole form (``full`` or ``rewrite``) past the keys the driver collects, the run
        records the switched value it returns."""
        ...

    def __getitem__(self, upstream: str) -> PinnedInput:
        """The pinned input of ``upstream`` (one of the pipeline's upstreams)."""
        ...


Transform = Callable[[BatchContext], "DataFrame"]
"""A hand-written transform: the batch in, the changes to apply to the target out."""
