"""Manual moves of a committed watermark (``watermark set`` / ``reset``), in plain Python
(no Dagster, Spark or delta-rs): the change and its row, the open-batch refusal, and
which open batch such a move leaves stale.
"""

from datetime import datetime

from watermark_dagster.core.ranges import ReadMode, encode_position
from watermark_dagster.core.records import (
    Batch,
    Watermark,
    WatermarkChange,
    WatermarkHow,
)
from watermark_dagster.errors import BatchStateError, TerminalError


def batch_reading(open_batch: Batch | None, upstream: str) -> Batch | None:
    """``open_batch`` if it reads ``upstream`` (a range or window, not NOOP), else None."""
    planned = open_batch.inputs.get(upstream) if open_batch is not None else None
    if planned is None or planned.mode is ReadMode.NOOP:
        return None
    return open_batch


def check_manual_change(upstream: str, version: int | None, how: WatermarkHow) -> None:
    """Validate a manual move: MANUAL_SET to a version >= 0, or RESET to None.

    Raises:
        ValueError: any other combination.
    """
    if how is WatermarkHow.RESET and version is not None:
        raise ValueError(f"{upstream}: a RESET stores no version, got {version}")
    if how is WatermarkHow.MANUAL_SET and (not isinstance(version, int) or version < 0):
        raise ValueError(f"{upstream}: a MANUAL_SET needs a version >= 0, got {version!r}")
    if how not in (WatermarkHow.MANUAL_SET, WatermarkHow.RESET):
        raise ValueError(f"{upstream}: a manual change is MANUAL_SET or RESET, not {how}")


def manual_change(
    upstream: str,
    version: int | None,
    how: WatermarkHow,
    current: Watermark | None,
    *,
    open_batch: str | None = None,
) -> WatermarkChange:
    """The manual move of ``upstream`` from its committed row ``current`` to ``version``.

    Raises:
        ValueError: ``how`` and ``version`` do not go together (see
            :func:`check_manual_change`).
    """
    check_manual_change(upstream, version, how)
    return WatermarkChange(
        upstream=upstream,
        old=current.committed_version if current is not None else None,
        new=version,
        how=how,
        old_cursor=encode_position(current.committed_cursor) if current is not None else None,
        open_batch=open_batch,
    )


def check_unmoved(expected: WatermarkChange | None, preview: WatermarkChange) -> None:
    """Refuse a manual change whose state moved since the operator confirmed ``expected``.

    Raises:
        TerminalError: the committed value or the open batch differ from ``expected``.
    """
    if expected is None:
        return
    now = (preview.old, preview.old_cursor, preview.open_batch)
    if now != (expected.old, expected.old_cursor, expected.open_batch):
        raise TerminalError(
            f"Upstream '{preview.upstream}' moved while the change was being confirmed: "
            f"committed {expected.old} -> {preview.old}, open batch {expected.open_batch} -> "
            f"{preview.open_batch}. Nothing was changed.",
            upstream=preview.upstream,
            fix="run the command again to see the current state.",
        )


def refuse_open_batch(change: WatermarkChange, reading: Batch | None, *, force: bool) -> None:
    """Refuse a manual move of ``change.upstream`` while an open batch reads it.

    Moving the watermark under an open batch would break it; ``force`` abandons the batch
    instead, so the next plan starts from the new value. A change that moves nothing is
    never refused.

    Args:
        change: the previewed change (``watermark set`` / ``reset``).
        reading: the open batch that reads the upstream (see :func:`batch_reading`), or None.
        force: the operator asked to abandon that batch.

    Raises:
        BatchStateError: ``reading`` is open, the change moves the watermark and ``force``
            is False; the message names the batch and what it reads.
    """
    if reading is None or force or not change.changed:
        return
    upstream = change.upstream
    raise BatchStateError(
        f"Upstream '{upstream}': batch {reading.batch_id} is open and reads {upstream} "
        f"({reading.inputs[upstream].describe()}); moving the watermark now would break it. "
        "Nothing was changed.",
        upstream=upstream,
        batch_id=reading.batch_id,
        fix=f"wait until it completes (`watermark batch {reading.batch_id}`), or pass --force "
        "to abandon it so the next plan starts from the new value.",
    )


def manual_event(how: WatermarkHow) -> str:
    """The ``history`` event of a manual move: WATERMARK_SET or WATERMARK_RESET."""
    return "WATERMARK_SET" if how is WatermarkHow.MANUAL_SET else "WATERMARK_RESET"


def manual_why(change: WatermarkChange, reason: str | None) -> str:
    """The phrase that names a manual move in the error of the batches it abandons."""
    why = f"manual {change.how.value} of '{change.upstream}' from {change.old} to {change.new}"
    return f"{why}: {reason}" if reason else why


def manual_watermark(
    current: Watermark | None,
    change: WatermarkChange,
    *,
    actor: str,
    now: datetime,
    pending_history: str,
) -> Watermark:
    """The committed row after a manual move from ``current``.

    A manual set keeps the table identity the watermark refers to; a reset forgets it,
    so a recreated table is loaded afresh. ``pending_history`` is the move's history row,
    committed with it.
    """
    kept = current.table_id if current is not None else None
    table_id = kept if change.how is WatermarkHow.MANUAL_SET else None
    # Not a batch's: batch_id None.
    return Watermark(
        change.upstream,
        change.new,
        None,
        change.how,
        now,
        actor,
        table_id=table_id,
        pending_history=pending_history,
    )


def stale_after_manual_change(batch: Batch | None, upstream: str, version: int | None) -> bool:
    """True when ``batch`` (the open batch reading ``upstream``) was planned from the
    watermark before a manual move to ``version``: its range does not start right after
    the new value, so it is abandoned and the next plan starts from the new value."""
    planned = batch.inputs.get(upstream) if batch is not None else None
    if planned is None or planned.range is None:
        return False
    first = 0 if version is None else version + 1
    return planned.range.start != first
