"""A real S3-compatible server on loopback for the object-storage tests: moto's server mode
(``moto_server``, from the ``moto[server]`` test dependency) in its own process group.

:func:`running_s3_server` starts it on a free port, waits until it answers, creates the
bucket and yields its endpoint and the fake credentials (the tests put them in the
environment, where delta-rs and Spark's s3a read them); at the end it kills the process
group and asserts that no process of it is left.

:func:`proxy` puts a loopback HTTP proxy in front of it that can line two writers'
commits up so they reach the server together, and can drop the conditional-write headers
(``If-None-Match``, ``If-Match``): an S3 service without conditional writes, to show what
the compare-and-swap would suffer there.
"""

import contextlib
import http.client
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.scale.spark_servers import free_port, group_alive, start

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
BUCKET = "watermark-lake"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """A running S3-compatible server: where it listens and how to sign requests."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    region: str
    pid: int

    def environ(self) -> dict[str, str]:
        """The environment delta-rs (and, through the storage settings, Spark) reads."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    def uri(self, *parts: str) -> str:
        """``s3://bucket/part/...``."""
        return "/".join([f"s3://{self.bucket}", *parts])

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` (read through boto3, not through the code
        under test)."""
        client = self.client()
        found: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        ):
            found.extend(o["Key"] for o in page.get("Contents", []))
        return found

    def read(self, key: str) -> bytes:
        """One object's bytes."""
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def client(self):  # a boto3 S3 client
        """A boto3 client for this server."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
        )


def _wait_until_answering(endpoint: str, process: subprocess.Popen, log: Path) -> None:
    # Starting takes a second or two; the loop ends on the first answer, and fails early if
    # the server exits. The deadline only guards against a hung start.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer on {endpoint}:\n{log.read_text()}")


@contextlib.contextmanager
def running_s3_server(folder: Path, *, secret_key: str = "test-secret-key") -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1, with the test bucket; stopped (its whole process group)
    at the end, asserting nothing of it is left."""
    port = free_port()
    process = start(
        "moto_server",
        [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
        folder / "moto_server.log",
    )
    server = S3Server(
        endpoint=f"http://127.0.0.1:{port}",
        bucket=BUCKET,
        access_key="AKIAWATERMARKTEST",
        secret_key=secret_key,
        region=REGION,
        pid=process.process.pid,
    )
    try:
        _wait_until_answering(server.endpoint, process.process, process.log)
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        process.stop()  # the whole process group, waited for until none of it is left
        assert not group_alive(server.pid), "moto_server left processes behind"


_DROPPED = {"if-none-match", "if-match"}


class _Proxy(ThreadingHTTPServer):
    """The proxy's state: where to forward, whether to drop the conditional headers, and
    the barrier the next commits wait at."""

    upstream: tuple[str, int]
    strip: bool
    barrier: threading.Barrier | None = None


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forwards each request to the upstream server; a commit (a PUT of a ``_delta_log``
    JSON file) waits at the armed barrier first, so two writers' commits reach the
    server together, both decided against the same version."""

    server: _Proxy
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        drop = _DROPPED if self.server.strip else set()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in drop}
        barrier = self.server.barrier
        commit = self.command == "PUT" and "/_delta_log/" in self.path
        if barrier is not None and commit and self.path.endswith(".json"):
            barrier.wait(timeout=60)
            self.server.barrier = None  # one rendezvous: later commits pass freely
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the tests' output is theirs


@dataclass
class Proxy:
    """A running proxy: its endpoint, and :meth:`hold_commits` to line commits up."""

    endpoint: str
    server: _Proxy

    def hold_commits(self, writers: int) -> threading.Barrier:
        """Make the next ``writers`` commits wait for each other before reaching the server
        (once; the commits after them pass freely)."""
        self.server.barrier = threading.Barrier(writers, timeout=60)
        return self.server.barrier


@contextlib.contextmanager
def proxy(server: S3Server, *, strip_conditions: bool) -> Iterator[Proxy]:
    """A loopback HTTP proxy serving ``server``'s S3 API. With ``strip_conditions`` it drops
    the If-None-Match and If-Match request headers on the way: an S3 service without
    conditional writes. Its thread is stopped at the end."""
    host, port = server.endpoint.removeprefix("http://").split(":")
    running = _Proxy(("127.0.0.1", 0), _ProxyHandler)
    running.upstream = (host, int(port))
    running.strip = strip_conditions
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    try:
        yield Proxy(f"http://127.0.0.1:{running.server_address[1]}", running)
    finally:
        running.shutdown()
        running.server_close()
        thread.join()
