"""Reading a landing upstream: the files a batch pinned, checked unchanged, read by Spark.

A batch pins a range of file numbers (:mod:`~watermark_dagster.observe.landing_log`). Its
files are looked up in the file log, each checked against the size and modification time
recorded when it was logged (a file gone or changed fails the batch before anything is
read or written, I6), and read together; each row carries the file it came from.
"""

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.upstream import Upstream
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.errors import UpstreamUnreadableError, recreated_error, reset_command
from watermark_dagster.observe.landing import check_unchanged
from watermark_dagster.observe.landing_files import full_path
from watermark_dagster.observe.landing_log import FileLog, LoggedFile
from watermark_dagster.read.frames import spark_reader

SOURCE_FILE = "_source_file"
"""The column naming the file each row of a landing upstream came from."""


def as_landing(upstream: Upstream) -> LandingUpstream | None:
    """``upstream`` when it is a landing folder, else None."""
    return upstream if isinstance(upstream, LandingUpstream) else None


@dataclass(frozen=True)
class PinnedFiles:
    """The files a batch pinned for one landing upstream: those of its range (the
    changes) and every file up to the range's end (the snapshot), each checked."""

    changes: tuple[LoggedFile, ...]
    snapshot: tuple[LoggedFile, ...]

    def read_by(self, mode: ReadMode) -> int:
        """How many files a read in ``mode`` opens: every file for a snapshot, the
        range's for changes."""
        return len(self.snapshot if mode is ReadMode.SNAPSHOT else self.changes)

    @property
    def change_bytes(self) -> int:
        """Bytes of the range's files."""
        return sum(f.size for f in self.changes)

    @property
    def snapshot_bytes(self) -> int:
        """Bytes of every file up to the range's end."""
        return sum(f.size for f in self.snapshot)


def pin_files(
    upstream: LandingUpstream,
    rng: VersionRange | None,
    snapshot_version: int,
    *,
    table_id: str | None,
    whole: bool,
) -> PinnedFiles:
    """The files of ``rng`` (none for NOOP) and up to ``snapshot_version``, looked up in
    the file log and checked unchanged: the range's files always, every snapshot file when
    the batch reads the snapshot ``whole``.

    Raises:
        UpstreamRecreatedError: the file log is not the one the batch was planned on.
        UpstreamUnreadableError: the file log lost numbers the batch pinned.
        LandingFileChangedError: a file is gone or changed since it was logged.
    """
    log = FileLog(upstream)
    state = log.state(create=False)
    where = f"file log {log.uri}"
    if state is None or (table_id and state.table_id != table_id):
        found = "it is gone" if state is None else f"its table id is {state.table_id}"
        raise recreated_error(
            upstream.name,
            f"{found}, not {table_id} as when the batch was planned ({where})",
            "Nothing was read or written.",
            versions=f"files [1, {snapshot_version}]",
        )
    every = sorted(
        (f for f in state.by_path.values() if f.ordinal <= snapshot_version),
        key=lambda f: f.ordinal,
    )
    if len(every) != snapshot_version:
        raise UpstreamUnreadableError(
            f"{upstream.owner}: its {where} holds {len(every)} of the files 1..."
            f"{snapshot_version} the batch pinned. Nothing was read or written.",
            upstream=upstream.name,
            versions=f"files [1, {snapshot_version}]",
            fix=f"restore the file log, or run `{reset_command(upstream.name)}` to load the "
            "folder again from the start.",
        )
    changes = () if rng is None else tuple(f for f in every if rng.start <= f.ordinal <= rng.end)
    check_unchanged(upstream, every if whole else changes, loaded=None)
    return PinnedFiles(changes, tuple(every))


def read_files(
    spark: SparkSession, upstream: LandingUpstream, files: tuple[LoggedFile, ...]
) -> DataFrame:
    """The rows of ``files``, each with :data:`SOURCE_FILE`; no row when there is none.

    Raises:
        UpstreamUnreadableError: there is no file and no ``file_schema`` to give the
            columns.
    """
    reader = spark_reader(spark, upstream, str(upstream.format))
    if upstream.file_schema:
        reader = reader.schema(upstream.file_schema)
    if not files:
        if not upstream.file_schema:
            raise UpstreamUnreadableError(
                f"{upstream.owner}: no pinned file to read its columns from.",
                upstream=upstream.name,
                fix="give the upstream a file_schema, or wait for a file to land.",
            )
        return spark.createDataFrame([], upstream.file_schema).withColumn(
            SOURCE_FILE, F.lit(None).cast("string")
        )
    frame = reader.load([full_path(upstream, f.path) for f in files])
    return frame.withColumn(SOURCE_FILE, F.col("_metadata.file_path"))
