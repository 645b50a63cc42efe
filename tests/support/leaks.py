"""Where a secret ended up on disk: the files under a folder that hold it, in plain bytes or
in the zlib-compressed blobs Dagster's SQLite storage keeps (run and job snapshots).
Shared by the secrets tests (tests/spark/test_secrets.py, tests/scale/test_s3_end_to_end.py).
"""

import contextlib
import sqlite3
import zlib
from pathlib import Path


def leaks(folder: Path, secret: str) -> list[str]:
    """Files under ``folder`` holding ``secret`` (``file:table`` for a SQLite table)."""
    needle = secret.encode()
    found = []
    for file in folder.rglob("*"):
        if not file.is_file():
            continue
        if needle in file.read_bytes():
            found.append(str(file))
        elif file.suffix == ".db":
            found += [f"{file}:{table}" for table in blobs_holding(file, needle)]
    return found


def blobs_holding(db_file: Path, needle: bytes) -> list[str]:
    """Tables of a SQLite file with a value (zlib-compressed or not) holding ``needle``."""
    tables: list[str] = []
    with sqlite3.connect(db_file) as db:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in names:
            for row in db.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if isinstance(value, str):
                        value = value.encode()
                    if isinstance(value, bytes):
                        with contextlib.suppress(zlib.error):
                            value = zlib.decompress(value)
                        if needle in value and table not in tables:
                            tables.append(table)
    return tables
