"""The oldest version of an upstream a batch still needs (:func:`needed_version`): what
the retention horizon must keep readable.
"""

from dataclasses import dataclass

from watermark_dagster.core.planning import PlannedInput
from watermark_dagster.core.ranges import ReadMode


@dataclass(frozen=True)
class NeededVersion:
    """The oldest version of an upstream a batch still needs, and which batch needs it.

    Attributes:
        version: the version; None when there is none to protect (see ``why``).
        why: who needs it, as an appositive for messages ("version 4, <why>, was ...").
        committed_version: the committed watermark (None: nothing committed yet).
        batch_id: the open batch that pins it, if it is pinned.
    """

    version: int | None
    why: str
    committed_version: int | None
    batch_id: str | None = None


def needed_version(
    *, committed: int | None, open_input: PlannedInput | None, batch_id: str | None = None
) -> NeededVersion:
    """The oldest version a batch still needs from one upstream.

    * The open batch pins a range read as changes (CDF, appended files): its start.
    * The open batch reads a snapshot at version ``v`` (a NOOP input, or a SNAPSHOT load):
      ``v + 1``. Files of version ``v`` can only be vacuumed after a later commit removed
      them, so the age that matters is that of the first commit after ``v``.
    * No open batch: ``committed + 1``, where the next batch starts.
    * Nothing committed and no open batch: none (the first batch loads a snapshot of the
      latest version, which VACUUM never touches).
    """
    if open_input is not None:
        where = f"open batch {batch_id}" if batch_id else "the open batch"
        rng = open_input.range
        # A SNAPSHOT input pins [0, end] but reads only the table as of its end.
        if rng is not None and open_input.mode is not ReadMode.SNAPSHOT:
            return NeededVersion(
                rng.start,
                f"the start of {open_input.mode} {rng} pinned by {where}",
                committed,
                batch_id,
            )
        if open_input.snapshot_version is None:
            return NeededVersion(
                None,
                f"{where} reads it through a cursor column, not by version",
                committed,
                batch_id,
            )
        v = open_input.snapshot_version
        return NeededVersion(
            v + 1,
            f"the first commit after version {v}, whose snapshot {where} reads",
            committed,
            batch_id,
        )
    if committed is None:
        return NeededVersion(
            None,
            "nothing is committed yet: the first batch loads a snapshot of the latest version",
            None,
        )
    return NeededVersion(
        committed + 1,
        f"where the next batch starts (committed watermark {committed})",
        committed,
    )
