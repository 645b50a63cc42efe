"""The record stage of a pipeline run: what it read from each upstream, and the log lines
of what it read and wrote, made from the same values the run's metadata shows."""

import logging
from collections.abc import Mapping, Sequence

from pyspark.sql import SparkSession

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.ranges import ReadMode
from watermark_dagster.core.strategy import MeasuredStrategy
from watermark_dagster.operations.decide import InputReport
from watermark_dagster.read.catalog import register_table
from watermark_dagster.read.inputs import UpstreamInput
from watermark_dagster.write.commits import WriteResult

log = logging.getLogger("watermark_dagster")


def input_reports(
    registry: Registry, inputs: Mapping[str, UpstreamInput], *, rewriting: bool
) -> tuple[InputReport, ...]:
    """What the run read from each upstream. A rewrite reads each upstream's snapshot
    whole, never its range: the rows read are the snapshot's (from the log), and the range
    is not read at all; the range stays in the report, as what the batch covers. Others
    report a range's rows from the log where it says (:meth:`UpstreamInput.rows_read`)."""
    return tuple(
        InputReport(
            upstream=u,
            mode=ReadMode.SNAPSHOT.value if rewriting and i.range else i.mode.value,
            start_version=i.range.start if i.range and not i.reads_snapshot else None,
            end_version=i.snapshot_version,
            rows_read=i.snapshot_rows() if rewriting else i.rows_read(),
            files_read=None if rewriting else i.files_read,
            window=str(i.window) if i.window is not None else None,
            rows_without_cursor=(
                i.rows_without_cursor
                if isinstance(registry.upstreams[u], DatabaseUpstream)
                else None
            ),
        )
        for u, i in inputs.items()
    )


def register_target(spark: SparkSession, pipeline: Pipeline) -> None:
    """Register the target under its catalog name once the first write created it by path
    (a crash before this leaves no checkpoint: the retry registers it)."""
    target_name = pipeline.table_parts
    if target_name is not None and register_table(spark, target_name, pipeline.target):
        log.info(
            "pipeline=%s registered target %s at %s", pipeline.name, pipeline.table, pipeline.target
        )


def log_run(
    pipeline: Pipeline,
    batch_id: str,
    reports: Sequence[InputReport],
    write: WriteResult,
    measured: MeasuredStrategy | None,
    *,
    full_load: bool,
) -> None:
    """The run's log lines: one per upstream read, the write, and a drift found."""
    for r in reports:
        log.info(
            "pipeline=%s batch=%s upstream=%s mode=%s range=[%s, %s]%s rows_read=%d%s",
            pipeline.name,
            batch_id,
            r.upstream,
            r.mode,
            r.start_version,
            r.end_version,
            f" window={r.window}" if r.window else "",
            r.rows_read,
            f" files_read={r.files_read}" if r.files_read is not None else "",
        )
    log.info(
        "pipeline=%s batch=%s target=%s version=%d inserted=%d updated=%d deleted=%d%s%s%s",
        pipeline.name,
        batch_id,
        pipeline.target,
        write.target_version,
        write.rows_inserted,
        write.rows_updated,
        write.rows_deleted,
        " (full load)" if full_load else "",
        " (already applied: skipped by Delta)" if write.already_applied else "",
        f" strategy={measured.choice.strategy} ({measured.choice.reason}; {measured.seconds} s)"
        if measured is not None
        else "",
    )
    if write.drift:
        # A full batch rewrote keys its own changes did not touch: the target had drifted
        # from the full transform (a wrong incremental derivation, or a write to the target
        # from outside). The rows written are the correct ones.
        log.warning(
            "pipeline=%s batch=%s target=%s: DRIFT: %d key(s) differed from the full "
            "transform although this batch's changes did not touch them (e.g. %s); "
            "corrected by this batch",
            pipeline.name,
            batch_id,
            pipeline.target,
            write.drift,
            ", ".join(str(k) for k in write.drift_sample),
        )
