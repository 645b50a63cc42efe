"""A landing folder on S3 (moto's server on loopback): listed through the upstream's
storage options, its files logged beside it, a rewritten file refused. No JVM."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scale.s3server import S3Server, running_s3_server
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.secrets import EnvRef
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.errors import LandingFileChangedError
from watermark_dagster.observe.landing_log import FileLog
from watermark_dagster.observe.observer import Observer

pytestmark = pytest.mark.scale


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    with running_s3_server(tmp_path) as server:
        for key, value in server.environ().items():
            monkeypatch.setenv(key, value)
        yield server


def test_a_landing_folder_on_s3_is_listed_logged_and_checked(s3: S3Server) -> None:
    client = s3.client()
    for key in ("in/a.csv", "in/sub/b.csv", "in/_SUCCESS", "other/c.csv"):
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"1,2\n")
    upstream = LandingUpstream(
        name="drops",
        path=s3.uri("in"),
        format="csv",
        settle_seconds=0,
        storage_options={key: EnvRef(key) for key in s3.environ()},
    )
    assert Observer().observe(upstream, floor=0).latest_version == 2
    logged = FileLog(upstream).files_in(VersionRange(1, 2))
    assert sorted(f.path for f in logged) == ["a.csv", "sub/b.csv"]
    assert all(f.size == 4 for f in logged)
    assert s3.keys("in/_watermark_files/_delta_log/")  # the file log, beside the files

    client.put_object(Bucket=s3.bucket, Key="in/a.csv", Body=b"1,2\n3,4\n")
    with pytest.raises(LandingFileChangedError, match=r"'a.csv' \(file 1\) changed"):
        Observer().observe(upstream, floor=0)


def test_a_loaded_file_moved_to_a_visible_prefix_on_s3_is_refused(s3: S3Server) -> None:
    import time

    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="in/a.csv", Body=b"1,2\n")
    upstream = LandingUpstream(
        name="drops",
        path=s3.uri("in"),
        format="csv",
        settle_seconds=0,
        storage_options={key: EnvRef(key) for key in s3.environ()},
    )
    assert Observer().observe(upstream, floor=0).latest_version == 1
    time.sleep(1.1)  # object stores keep whole seconds
    # `aws s3 mv in/a.csv in/archive/a.csv`: a copy, then a delete.
    source = {"Bucket": s3.bucket, "Key": "in/a.csv"}
    client.copy_object(Bucket=s3.bucket, Key="in/archive/a.csv", CopySource=source)
    client.delete_object(Bucket=s3.bucket, Key="in/a.csv")
    with pytest.raises(LandingFileChangedError, match="moved"):
        Observer().observe(upstream, floor=0)
    # Put back, the file is the logged one again; a second file of the same content
    # beside it (a real second delivery) is new, and so is a big file moved only in part
    # of its middle: the digest reads each end of a file.
    client.copy_object(
        Bucket=s3.bucket,
        Key="in/a.csv",
        CopySource={"Bucket": s3.bucket, "Key": "in/archive/a.csv"},
    )
    client.delete_object(Bucket=s3.bucket, Key="in/archive/a.csv")
    with pytest.raises(LandingFileChangedError, match="changed"):  # a new modification time
        Observer().observe(upstream, floor=0)


def test_a_same_content_file_beside_a_logged_one_on_s3_is_new(s3: S3Server) -> None:
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key="in/a.csv", Body=b"1,2\n")
    upstream = LandingUpstream(
        name="drops",
        path=s3.uri("in"),
        format="csv",
        settle_seconds=0,
        storage_options={key: EnvRef(key) for key in s3.environ()},
    )
    assert Observer().observe(upstream, floor=0).latest_version == 1
    client.put_object(Bucket=s3.bucket, Key="in/b.csv", Body=b"1,2\n")
    assert Observer().observe(upstream, floor=0).latest_version == 2
    logged = {f.path: f.digest for f in FileLog(upstream).files_in(VersionRange(1, 2))}
    assert logged["a.csv"] == logged["b.csv"]
    assert logged["a.csv"] is not None
