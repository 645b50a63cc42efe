"""Reading a landing upstream: the files a batch pinned, checked unchanged, read by Spark.

A batch pins a range of file numbers (:mod:`~watermark_dagster.observe.landing_log`). Its
files are looked up in the file log, each checked against the size and modification time
recorded when it was logged (a file gone or changed fails the batch before anything is
read or written, I6), and read together by their exact paths (never as globs); each row
carries the file it came from and, as a change row, its file's number as its
``_commit_version``: the one order that decides which row wins for a key, inside a batch,
across batches and in a reload from the start.
"""

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.upstream import Upstream
from watermark_dagster.core.columns import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, INSERT
from watermark_dagster.core.ranges import ReadMode, VersionRange
from watermark_dagster.errors import UpstreamUnreadableError, recreated_error, reset_command
from watermark_dagster.observe.landing import check_unchanged
from watermark_dagster.observe.landing_files import spark_path
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
    frame = reader.load([spark_path(upstream, f.path) for f in files])
    return frame.withColumn(SOURCE_FILE, F.col("_metadata.file_path"))


_URI = "_wm_file_uri"
_NUMBER = "_wm_file_number"


def file_numbers(
    upstream: LandingUpstream, files: tuple[LoggedFile, ...], uris: list[str]
) -> dict[str, int]:
    """The number in the file log of each file Spark read (``uris``: its input files), by
    the URI's raw path (``file:/x`` and ``file:///x`` name one file).

    Spark qualifies the paths it was given (``file:/...``, ``s3a://...``) and URL-encodes
    them; decoded, each is the folder's qualified path, ``/`` and a logged file's relative
    path. The folder's part is found from one file, and every file must then be one logged
    file, each once: Spark read exactly the pinned files.

    Raises:
        UpstreamUnreadableError: the files Spark read are not exactly ``files``.
    """
    wanted = {f.path: f.ordinal for f in files}
    decoded = {unquote(u): u for u in uris}
    first = files[0].path
    for candidate in decoded:
        if not candidate.endswith(f"/{first}"):
            continue
        folder = candidate[: -len(first)]
        found = {d[len(folder) :]: u for d, u in decoded.items() if d.startswith(folder)}
        if len(uris) == len(found) and set(found) == set(wanted):
            return {urlsplit(u).path: wanted[p] for p, u in found.items()}
    raise UpstreamUnreadableError(
        f"{upstream.owner}: Spark read {len(uris)} file(s) ({sorted(uris)[:3]}...), not "
        f"exactly the {len(files)} pinned file(s) ({sorted(wanted)[:3]}...). Nothing was "
        "read or written.",
        upstream=upstream.name,
        versions=f"files {sorted(wanted.values())[:3]}...",
        fix="report it: the landing folder's paths are not read back as they were logged.",
    )


def file_changes(
    spark: SparkSession, upstream: LandingUpstream, rows: DataFrame, files: tuple[LoggedFile, ...]
) -> DataFrame:
    """``rows`` (:func:`read_files` of ``files``) as change rows: inserts, each at its file's
    number (``_commit_version``), so the latest change of a key is the row of the highest
    numbered file, whatever the paths and however the files were batched.

    Raises:
        UpstreamUnreadableError: the files Spark read are not exactly ``files``.
    """
    numbered = rows.withColumn(CHANGE_TYPE, F.lit(INSERT))
    if files:
        mapping = file_numbers(upstream, files, rows.inputFiles())
        numbers = spark.createDataFrame(list(mapping.items()), f"{_URI} string, {_NUMBER} long")
        missing = F.raise_error(F.concat(F.lit("no file number for "), F.col(SOURCE_FILE)))
        path = F.parse_url(F.col(SOURCE_FILE), F.lit("PATH"))
        numbered = (
            numbered.join(F.broadcast(numbers), path == F.col(_URI), "left")
            .withColumn(COMMIT_VERSION, F.coalesce(F.col(_NUMBER), missing.cast("long")))
            .drop(_URI, _NUMBER)
        )
    else:
        numbered = numbered.withColumn(COMMIT_VERSION, F.lit(None).cast("long"))
    return numbered.withColumn(COMMIT_TIMESTAMP, F.lit(None).cast("timestamp"))
