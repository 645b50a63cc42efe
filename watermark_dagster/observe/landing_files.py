"""A landing folder's files as they are now: listed, filtered, and looked up one by one.

Local folders are walked with :mod:`os`, through symbolic links to what lies outside the
folder (as Spark reads them); a link to something inside it is skipped, since its target
is listed under its own path. Object stores are listed through
:mod:`pyarrow.fs` with the upstream's storage options. Names starting with ``.`` or ``_``
(hidden files, Spark's ``_SUCCESS`` markers, the file log's own folder) are never taken.

On an object store a move is a copy and a delete, and the copy gets a new modification
time: there a file is also known by a digest of its content's ends
(:func:`content_digests`), computed once, when it is first logged.

A file is its exact path: ``pattern`` is matched segment by segment (``*`` never crosses a
``/``; only a ``**`` segment matches folders, zero or more), and the path handed to Spark
has its glob characters escaped, so Spark reads that one file and no other.
"""

import fnmatch
import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from pyarrow import fs as pafs

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.observe.log import is_local, local_path


@dataclass(frozen=True)
class FileStat:
    """One file of a landing folder: its path relative to the folder (``/``-separated),
    its size in bytes and its modification time (ns since the epoch)."""

    path: str
    size: int
    mtime_ns: int
    digest: str | None = None
    """Once computed: see :func:`content_digests`."""


DIGEST_BYTES = 64 * 1024
"""How much of each end of a file its digest reads."""
_DIGEST_THREADS = 16


def _digest(filesystem: pafs.FileSystem, path: str, size: int) -> str:
    """SHA-256 of a file's size, its first and its last :data:`DIGEST_BYTES` (the whole
    file when it is smaller than both): one or two ranged reads."""
    sha = hashlib.sha256(str(size).encode() + b"|")
    with filesystem.open_input_file(path) as f:
        if size <= 2 * DIGEST_BYTES:
            sha.update(f.read())
        else:
            sha.update(f.read_at(DIGEST_BYTES, 0))
            sha.update(f.read_at(DIGEST_BYTES, size - DIGEST_BYTES))
    return sha.hexdigest()[:32]


def with_digests(upstream: LandingUpstream, files: Sequence[FileStat]) -> list[FileStat]:
    """``files`` with their :func:`content_digests`, without those removed since they were
    listed (the next look sees them gone, or under their new path)."""
    digests = content_digests(upstream, [f for f in files if f.digest is None])
    return [
        replace(f, digest=digests[f.path]) if f.path in digests else f
        for f in files
        if digests.get(f.path, "") is not None
    ]


def content_digests(upstream: LandingUpstream, files: Iterable[FileStat]) -> dict[str, str | None]:
    """Path -> the digest of each of ``files`` (none for an empty file), read on up to 16
    threads. Two files of the same size whose first and last 64 KiB are the same have the
    same digest: a new path with a logged file's digest, whose logged path is gone, is that
    file moved, whatever modification time the move gave it (an object store's copy, a copy
    tool without ``-p``, a sync agent). None for a file removed since it was listed.
    """
    wanted = [f for f in files if f.size > 0]
    if not wanted:
        return {}
    if is_local(upstream.path):
        filesystem, base = pafs.LocalFileSystem(), local_path(upstream.path).rstrip("/")
    else:
        filesystem, base = _filesystem(upstream)

    def one(f: FileStat) -> str | None:
        try:
            return _digest(filesystem, f"{base}/{f.path}", f.size)
        except FileNotFoundError:
            return None

    with ThreadPoolExecutor(min(_DIGEST_THREADS, len(wanted))) as pool:
        return dict(zip((f.path for f in wanted), pool.map(one, wanted), strict=True))


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def _inside(real: str, top: str) -> bool:
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def full_path(upstream: LandingUpstream, relative: str) -> str:
    """Where the file ``relative`` (to the landing folder) is, for lookups."""
    return f"{upstream.path.rstrip('/')}/{relative}"


_GLOB = re.compile(r"([\\\[\]{}*?])")


def spark_path(upstream: LandingUpstream, relative: str) -> str:
    """:func:`full_path` for Spark's file reader, which takes every path as a glob: each
    glob character (brackets, braces, ``*``, ``?``, the backslash) escaped, so it names
    exactly that one file."""
    return _GLOB.sub(r"\\\1", full_path(upstream, relative))


def matches(pattern: str, relative: str) -> bool:
    """Whether ``pattern`` takes the file at ``relative`` (``/``-separated): matched segment
    by segment (case-sensitive :mod:`fnmatch` rules inside a segment, so ``*`` stops at
    ``/``), a ``**`` segment matching zero or more folders (``**/*.csv``: every CSV file at
    any depth; a last ``**``: every file below)."""
    return _matches(tuple(pattern.split("/")), tuple(relative.split("/")))


def _matches(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":  # folders, zero or more; a last ``**`` is at least the file's name
        if not rest:
            return bool(parts)
        return any(_matches(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _matches(rest, parts[1:])


# delta-rs style storage options -> pyarrow's S3FileSystem arguments.
_S3_OPTIONS = {
    "aws_access_key_id": "access_key",
    "aws_secret_access_key": "secret_key",
    "aws_session_token": "session_token",
    "aws_region": "region",
    "aws_endpoint_url": "endpoint_override",
    "aws_endpoint": "endpoint_override",
}


def _filesystem(upstream: LandingUpstream) -> tuple[pafs.FileSystem, str]:
    """The object store filesystem and the folder's path inside it."""
    options: Mapping[str, str] = resolved_options(upstream.storage_options, upstream.owner) or {}
    path = upstream.path.rstrip("/")
    if path.startswith(("s3://", "s3a://")):
        kwargs: dict[str, object] = {}
        for key, value in options.items():
            target = _S3_OPTIONS.get(key.lower())
            if target is not None:
                kwargs[target] = value
        endpoint = str(kwargs.get("endpoint_override", ""))
        if endpoint.startswith(("http://", "https://")):
            scheme, _, host = endpoint.partition("://")
            kwargs["endpoint_override"] = host
            kwargs["scheme"] = scheme
        if str(options.get("AWS_ALLOW_HTTP", options.get("aws_allow_http", ""))).lower() == "true":
            kwargs["scheme"] = "http"
        return pafs.S3FileSystem(**kwargs), path.split("://", 1)[1]  # pyright: ignore[reportArgumentType]
    filesystem, inner = pafs.FileSystem.from_uri(path)
    return filesystem, inner


def list_files(upstream: LandingUpstream) -> list[FileStat]:
    """Every file under the landing folder that ``pattern`` takes (settled or not), sorted
    by path.

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    found: list[FileStat] = []
    if is_local(upstream.path):
        root = local_path(upstream.path)
        if not os.path.isdir(root):
            raise FileNotFoundError(root)
        # Links are followed, as Spark reads through them, to what lies outside the
        # folder; a link to a folder or file inside it (``latest -> 2026-12-02``) names
        # what is listed under its own path already, and is skipped, as is a loop.
        top = os.path.realpath(root)
        walked = {top}
        for folder, dirs, files in os.walk(root, followlinks=True):
            kept: list[str] = []
            for name in sorted(d for d in dirs if not _hidden(d)):
                child = os.path.join(folder, name)
                real = os.path.realpath(child)
                if real in walked or (os.path.islink(child) and _inside(real, top)):
                    continue
                walked.add(real)
                kept.append(name)
            dirs[:] = kept
            for name in files:
                if _hidden(name):
                    continue
                full = os.path.join(folder, name)
                if os.path.islink(full) and _inside(os.path.realpath(full), top):
                    continue
                relative = os.path.relpath(full, root).replace(os.sep, "/")
                if matches(upstream.pattern, relative):
                    try:
                        st = os.stat(full)
                    except FileNotFoundError:  # removed since the walk, or a dangling link
                        continue
                    found.append(FileStat(relative, st.st_size, st.st_mtime_ns))
    else:
        filesystem, base = _filesystem(upstream)
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=False)
        for info in filesystem.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            relative = info.path[len(base) :].lstrip("/")
            if any(_hidden(part) for part in relative.split("/")):
                continue
            if matches(upstream.pattern, relative):
                found.append(FileStat(relative, int(info.size or 0), int(info.mtime_ns or 0)))
    return sorted(found, key=lambda f: f.path)


def stat_files(upstream: LandingUpstream, paths: Iterable[str]) -> dict[str, FileStat | None]:
    """The current size and modification time of each of ``paths`` (relative to the
    folder); None for a file that is gone."""
    found: dict[str, FileStat | None] = {}
    paths = list(paths)
    if is_local(upstream.path):
        root = local_path(upstream.path)
        for relative in paths:
            try:
                st = os.stat(os.path.join(root, relative))
            except FileNotFoundError:
                found[relative] = None
            else:
                found[relative] = FileStat(relative, st.st_size, st.st_mtime_ns)
        return found
    filesystem, base = _filesystem(upstream)
    infos = filesystem.get_file_info([f"{base}/{p}" for p in paths])
    for relative, info in zip(paths, infos, strict=True):
        found[relative] = (
            None
            if info.type != pafs.FileType.File
            else FileStat(relative, int(info.size or 0), int(info.mtime_ns or 0))
        )
    return found
