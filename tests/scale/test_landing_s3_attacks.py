"""Issue 64's independent attack on landing folders on an object store (moto's S3 server
on loopback, no JVM): empty objects, and files logged by a release before content digests."""

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.scale.s3server import S3Server, running_s3_server
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.secrets import EnvRef, resolved_options
from watermark_dagster.errors import LandingFileChangedError
from watermark_dagster.observe.landing_files import list_files
from watermark_dagster.observe.landing_log import LOG_SCHEMA, FileLog
from watermark_dagster.observe.observer import Observer

pytestmark = pytest.mark.scale


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    with running_s3_server(tmp_path) as server:
        for key, value in server.environ().items():
            monkeypatch.setenv(key, value)
        yield server


def _upstream(s3: S3Server) -> LandingUpstream:
    return LandingUpstream(
        name="drops",
        path=s3.uri("in"),
        format="csv",
        settle_seconds=0,
        storage_options={key: EnvRef(key) for key in s3.environ()},
    )


def _same_second(s3: S3Server, keys: list[str], body: bytes) -> None:
    """Put ``keys`` with ``body`` until the store gives them one modification time (it
    keeps whole seconds)."""
    client = s3.client()
    for _ in range(10):
        for key in keys:
            client.put_object(Bucket=s3.bucket, Key=key, Body=body)
        stamps = {client.head_object(Bucket=s3.bucket, Key=k)["LastModified"] for k in keys}
        if len(stamps) == 1:
            return
        time.sleep(0.05)
    pytest.fail("could not write the objects within one second")


def test_two_empty_objects_written_in_one_second_both_log(s3: S3Server) -> None:
    """Empty objects have no digest, and two written in one second share size and
    modification time: the second was refused as a copy of the first, and the folder
    stalled (nothing logged or loaded until someone touched it), though an empty file
    holds no row to load twice."""
    _same_second(s3, ["in/a.csv", "in/b.csv"], b"")
    upstream = _upstream(s3)
    log = FileLog(upstream)
    first = [f for f in list_files(upstream) if f.path == "a.csv"]
    log.register(first, floor=0)  # a.csv logged by an earlier look
    assert Observer().observe(upstream, floor=1).latest_version == 2


def test_a_file_logged_before_digests_then_moved_on_s3_is_refused(s3: S3Server) -> None:
    """A file logged by a release before content digests has none: the first look after
    the upgrade gives it its digest, and a move on the store then (a copy with a new
    modification time, then a delete) is refused (its rows loaded twice, exit 0, before)."""
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="in/a.csv", Body=b"1,2\n3,4\n")
    upstream = _upstream(s3)
    (listed,) = list_files(upstream)
    old = pa.schema([f for f in LOG_SCHEMA if f.name != "digest"])
    row = {"ordinal": 1, "path": "a.csv", "size": listed.size, "mtime_ns": listed.mtime_ns}
    write_deltalake(  # the log as the older release wrote it
        upstream.log_location,
        pa.Table.from_pylist([{**row, "logged_at": datetime.now(UTC)}], schema=old),
        name="watermark_files_drops",
        storage_options=resolved_options(upstream.storage_options, upstream.owner),
    )
    assert Observer().observe(upstream, floor=1).latest_version == 1  # upgraded: same
    time.sleep(1.1)  # object stores keep whole seconds
    source = {"Bucket": s3.bucket, "Key": "in/a.csv"}
    client.copy_object(Bucket=s3.bucket, Key="in/archive/a.csv", CopySource=source)
    client.delete_object(Bucket=s3.bucket, Key="in/a.csv")
    with pytest.raises(LandingFileChangedError, match="moved"):
        Observer().observe(upstream, floor=1)
