"""The `watermark` command run in this process, as the console script runs it in a child.

Starting the console script costs a second and a half of imports (Dagster, PySpark,
delta-rs) per command; tests that only check what a command prints, returns and writes
call :func:`watermark_main` here instead, and keep one subprocess test per command path
(``tests/dagster/test_cli.py`` names them). What a child process would have of its own is
given to the command for the call and taken back afterwards:

* the environment (``env`` replaces ``os.environ``), and ``PYTHONPATH`` entries on
  ``sys.path``;
* fresh imports of the code location's module (``watermark_dagster.definitions`` reads
  ``WATERMARK_HOME`` and ``WATERMARK_REGISTRY`` when imported; ``--defs`` modules written
  by ``tests/support/lakes.py`` share one name);
* file descriptors 1 and 2 (a quiet command points 2 at its log file) and ``sys.stdin``
  at ``/dev/null``.

Only commands that start no JVM run here: a no-JVM tier refuses JVMs in this process too.
"""

import contextlib
import importlib
import io
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence

# Modules a child process would import afresh for each command.
_FRESH_MODULES = ("watermark_dagster.definitions",)
_FRESH_PREFIXES = ("lake_",)  # tests/support/lakes.py write_spec modules


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    saved_path = list(sys.path)
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = extra
    for name in list(sys.modules):
        if name in _FRESH_MODULES or name.startswith(_FRESH_PREFIXES):
            del sys.modules[name]
    importlib.invalidate_caches()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        sys.path[:] = saved_path


@contextlib.contextmanager
def _captured() -> Iterator[dict[str, str]]:
    """File descriptors 1 and 2 (and ``sys.stdout``/``sys.stderr`` on them) into temporary
    files, whose texts fill the yielded ``{"stdout": ..., "stderr": ...}`` at the end;
    ``sys.stdin`` at ``/dev/null``."""
    texts: dict[str, str] = {}
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        open(os.devnull) as devnull,
    ):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        saved_fds = os.dup(1), os.dup(2)
        saved_streams = sys.stdout, sys.stderr, sys.stdin
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout = open(os.dup(1), "w", buffering=1, encoding="utf-8")  # noqa: SIM115
        sys.stderr = open(os.dup(2), "w", buffering=1, encoding="utf-8")  # noqa: SIM115
        sys.stdin = devnull
        try:
            yield texts
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
                    stream.close()
            sys.stdout, sys.stderr, sys.stdin = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            texts["stdout"], texts["stderr"] = _read(out), _read(err)


def _read(file: io.BufferedRandom) -> str:
    file.seek(0)
    return file.read().decode("utf-8", errors="replace")


def watermark_main(args: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess:
    """``watermark ARGS`` in this process with environment ``env``: its exit code and what
    it wrote to stdout and stderr, as ``subprocess.run(..., capture_output=True,
    text=True)`` gives them."""
    from watermark_dagster.cli.app import main

    with _environment(env), _captured() as texts:
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse: usage errors and --help
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return subprocess.CompletedProcess(["watermark", *args], code, texts["stdout"], texts["stderr"])
