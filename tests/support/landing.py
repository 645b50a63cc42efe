"""A landing folder and its code location for the landing-upstream tests: small CSV files
of ``id,value`` rows, one upstream ``drops`` and one pipeline copying it."""

import os
from pathlib import Path

from tests.support.spark_lake import Lake


def write_csv(
    folder: Path, name: str, rows: list[tuple[int, int]], *, mtime: float | None = None
) -> Path:
    """A small CSV file of ``id,value`` rows (no header)."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{i},{v}\n" for i, v in rows))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def landing_spec(lake: Lake, folder: Path, **settings: object) -> dict:
    upstream = {
        "name": "drops",
        "kind": "landing",
        "path": str(folder),
        "format": "csv",
        "file_schema": "id BIGINT, value BIGINT",
        "settle_seconds": 0,
        **settings,
    }
    pipes = [
        {
            "name": "drops_copy",
            "upstreams": ["drops"],
            "target": lake.path("copy"),
            "transform": "copy",
        }
    ]
    return lake.spec([upstream], pipes)


def all_files(lake: Lake, folder: Path) -> dict[int, int]:
    """The ids and values of a full read of every file in the folder."""
    rows = (
        lake.spark.read.schema("id BIGINT, value BIGINT")
        .csv([str(p) for p in sorted(folder.rglob("*.csv"))])
        .collect()
    )
    return {r["id"]: r["value"] for r in rows}
