"""Real database servers for the tests (database upstreams, and PostgreSQL as Dagster's
storage in tests/deploy/test_postgres.py): Debian's PostgreSQL and MariaDB,
each started in a temporary folder on a free loopback port (run by an unprivileged account
when the tests run as root, where the server asks for one), with a database ``shop`` and a
user whose password is random; stopped, and every process of it gone, on leaving.

SQL is sent through each server's own command-line client (``psql``, ``mariadb``), the
password in the client's environment variable, never on a command line.

Without the server binaries a test is skipped on a developer's machine and fails under CI
(``.ci/run`` installs Debian's ``postgresql`` and ``mariadb-server``).
"""

import contextlib
import glob
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.ports import free_port

USER = "watermark"
DATABASE = "shop"
TIMEOUT = 120


@dataclass
class Database:
    """A running server: how to reach it, and its own client."""

    kind: str  # postgresql or mariadb
    port: int
    password: str
    client: list[str]
    database: str = DATABASE
    host: str = "127.0.0.1"
    user: str = USER

    @property
    def url(self) -> str:
        """The JDBC URL of the database (no credentials in it)."""
        return f"jdbc:{self.kind}://{self.host}:{self.port}/{self.database}"

    @property
    def schema(self) -> str:
        """The schema tables are created in: ``public``, or the database on MariaDB."""
        return "public" if self.kind == "postgresql" else self.database

    @property
    def timestamp_type(self) -> str:
        """A microsecond timestamp column type without a time zone."""
        return "timestamp(6)" if self.kind == "postgresql" else "datetime(6)"

    def sql(self, statement: str) -> list[list[str]]:
        """Run ``statement`` (one or more, ``;``-separated); its rows as lists of text."""
        env = {**os.environ, "PGPASSWORD": self.password, "MYSQL_PWD": self.password}
        done = subprocess.run(
            [*self.client, statement], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == 0, f"{self.kind}: {statement!r} failed:\n{done.stderr}"
        return [line.split("\t") for line in done.stdout.splitlines() if line]


def _unprivileged() -> tuple[list[str], pwd.struct_passwd | None]:
    """``runuser`` prefix and account to run a server as when this process is root."""
    if os.geteuid() != 0:
        return [], None
    for name in ("postgres", "mysql", "nobody"):
        with contextlib.suppress(KeyError):
            owner = pwd.getpwnam(name)
            return ["runuser", "-u", owner.pw_name, "--"], owner
    raise AssertionError("no unprivileged account (postgres, mysql, nobody) to run a server")


def _missing(what: str, package: str) -> None:
    message = f"{what} not found: install Debian's package with `apt-get install -y {package}`"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _run(prefix: list[str], *args: str, cwd: Path) -> None:
    done = subprocess.run(
        [*prefix, *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd
    )
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout}{done.stderr}"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _children(pid: int) -> set[int]:
    """Every live process whose parent is ``pid``."""
    found = set()
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(Path(stat).parent.name))
    return found


def _wait_gone(pids: set[int], what: str) -> None:
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = sorted(p for p in pids if _alive(p))
    assert not left, f"{what} processes left running: {left}"


@contextlib.contextmanager
def postgres(database: str = DATABASE) -> Iterator[Database]:
    """A PostgreSQL server with ``database`` (``shop``) owned by user ``watermark``."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(re.sub(r"\D", "", Path(p).parts[-3]) or 0),
    )
    if not found:
        _missing("PostgreSQL server binaries (/usr/lib/postgresql/*/bin)", "postgresql")
    bin_dir = Path(found[-1]).parent
    prefix, owner = _unprivileged()
    root = Path(tempfile.mkdtemp(prefix="watermark-pg-"))
    password = secrets.token_urlsafe(16)
    pwfile = root / "password"
    pwfile.write_text(password + "\n")
    if owner is not None:
        for path in (root, pwfile):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    data, port = root / "data", free_port()
    postmaster: int | None = None
    try:
        _run(
            prefix,
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--no-sync",
            "-E",
            "UTF8",
            cwd=root,
        )
        _run(
            prefix,
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(root / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={root} "
            "-c fsync=off -c TimeZone=UTC",
            "start",
            cwd=root,
        )
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        client = ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", USER, "-v", "ON_ERROR_STOP=1"]
        assert database.isidentifier(), database
        Database("postgresql", port, password, [*client, "-d", "postgres", "-c"]).sql(
            f"CREATE DATABASE {database}"
        )
        yield Database(
            "postgresql", port, password, [*client, "-d", database, "-AtF\t", "-c"], database
        )
    finally:
        if postmaster is not None:
            server = {postmaster, *_children(postmaster)}  # the postmaster and its workers
            _run(
                prefix,
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-m",
                "fast",
                "-w",
                "stop",
                cwd=root,
            )
            _wait_gone(server, "PostgreSQL")
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def mariadb() -> Iterator[Database]:
    """A MariaDB server with database ``shop`` and user ``watermark`` allowed on it."""
    server, install = (
        shutil.which("mariadbd", path="/usr/sbin:/usr/bin"),
        shutil.which("mariadb-install-db"),
    )
    if server is None or install is None:
        _missing("MariaDB server binaries (mariadbd, mariadb-install-db)", "mariadb-server")
    assert server is not None
    assert install is not None
    # MariaDB runs as root when told so explicitly (its files stay in the temporary folder).
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="watermark-mariadb-"))
    data, socket, port = root / "data", root / "server.sock", free_port()
    password = secrets.token_urlsafe(16)
    process: subprocess.Popen[bytes] | None = None
    try:
        _run(
            [],
            install,
            "--no-defaults",
            f"--datadir={data}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *as_root,
            cwd=root,
        )
        process = subprocess.Popen(
            [
                server,
                "--no-defaults",
                f"--datadir={data}",
                f"--port={port}",
                "--bind-address=127.0.0.1",
                f"--socket={socket}",
                f"--pid-file={root / 'server.pid'}",
                f"--log-error={root / 'server.log'}",
                "--skip-log-bin",
                "--default-time-zone=+00:00",
                "--innodb-flush-log-at-trx-commit=0",
                *as_root,
            ],
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        admin = ["mariadb", "--no-defaults", f"--socket={socket}", "-uroot", "-e"]
        deadline = time.monotonic() + 60
        while not socket.exists() and time.monotonic() < deadline:
            assert process.poll() is None, (root / "server.log").read_text()[-3000:]
            time.sleep(0.1)
        Database("mariadb", port, "", admin).sql(
            f"CREATE DATABASE {DATABASE}; "
            f"CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
            f"GRANT ALL ON {DATABASE}.* TO '{USER}'@'127.0.0.1'"
        )
        client = [
            "mariadb",
            "--no-defaults",
            "-h127.0.0.1",
            f"-P{port}",
            f"-u{USER}",
            DATABASE,
            "-N",
            "-B",
            "-e",
        ]
        yield Database("mariadb", port, password, client)
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
            _wait_gone({process.pid}, "MariaDB")
        shutil.rmtree(root, ignore_errors=True)


SERVERS = {"postgresql": postgres, "mariadb": mariadb}
"""Each kind of database -> the context manager that starts it."""
