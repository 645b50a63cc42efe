"""``watermark get -t NAME --show-files``: the files of a landing upstream, batch by batch.

Each batch that read the upstream pinned a range of file numbers; the file log says which
file each number is. A file's status is its batch's: ``loaded`` (completed), ``pinned``
(planned, not finalized yet), ``abandoned``, or ``waiting`` for a file logged that no batch
pinned yet. A replay's files are listed again under the replay.
"""

from typing import Any

from watermark_dagster.cli.context import Context
from watermark_dagster.core.records import BatchStatus
from watermark_dagster.errors import UsageError

_STATUS = {
    BatchStatus.COMPLETED: "loaded",
    BatchStatus.PLANNED: "pinned",
    BatchStatus.FAILED: "failed",
    BatchStatus.ABANDONED: "abandoned",
}


def file_rows(ctx: Context, name: str) -> list[dict[str, Any]]:
    """One row per (batch, file) of landing upstream ``name``, oldest batch first, then
    the logged files no batch pinned yet.

    Raises:
        UsageError: ``name`` is not a landing upstream.
    """
    from watermark_dagster.config.landing import LandingUpstream
    from watermark_dagster.observe.landing_log import FileLog

    upstream = ctx.registry.upstreams[name]
    if not isinstance(upstream, LandingUpstream):
        raise UsageError(
            f"upstream {name!r} is not a landing folder; --show-files lists a landing "
            "upstream's files (kind: landing)."
        )
    state = FileLog(upstream).state(create=False)
    by_number = {} if state is None else {f.ordinal: f for f in state.by_path.values()}
    rows: list[dict[str, Any]] = []
    pinned: set[int] = set()
    for batch in sorted(ctx.read_store.batches(), key=lambda b: b.seq):
        planned = batch.inputs.get(name)
        if planned is None or not planned.reads or planned.range is None:
            continue
        for number in range(max(planned.range.start, 1), planned.range.end + 1):
            found = by_number.get(number)
            pinned.add(number)
            rows.append(
                {
                    "batch_id": batch.batch_id,
                    "kind": batch.kind.value,
                    "number": number,
                    "file": found.path if found else None,
                    "size": found.size if found else None,
                    "mtime": found.mtime.isoformat() if found else None,
                    "status": _STATUS[batch.status],
                }
            )
    for number in sorted(set(by_number) - pinned):
        found = by_number[number]
        rows.append(
            {
                "batch_id": None,
                "kind": None,
                "number": number,
                "file": found.path,
                "size": found.size,
                "mtime": found.mtime.isoformat(),
                "status": "waiting",
            }
        )
    return rows


def print_files(ctx: Context, rows: list[dict[str, Any]]) -> None:
    """The rows of :func:`file_rows` as a table."""
    ctx.console.print()
    ctx.console.print(ctx.console.paint(f"files ({len(rows)})", "bold"))
    ctx.console.table(
        ["batch", "#", "file", "size", "mtime", "status"],
        [
            [r["batch_id"] or "-", r["number"], r["file"], r["size"], r["mtime"], r["status"]]
            for r in rows
        ],
    )
