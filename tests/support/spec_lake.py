"""A code location described by a JSON spec (tests/support/lakes.py) over Delta tables
written with delta-rs, and the `watermark` commands run on it: the console script in a
child, or a reading command's JSON in this process."""

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from tests.support.cli import SCRIPT
from tests.support.console import watermark_main
from tests.support.lakes import location_defs, location_path, write_spec
from watermark_dagster.store import WatermarkStore


def commit_rows(path: Path, ids: list[int]) -> None:
    """Append rows (``id``, ``value`` = ``id``) to the Delta table at ``path`` (created with
    change data feed on), one commit."""
    write_deltalake(
        str(path),
        pa.table({"id": pa.array(ids, pa.int64()), "value": pa.array(ids, pa.int64())}),
        mode="append",
        configuration={"delta.enableChangeDataFeed": "true"},
    )


@dataclass
class Lake:
    """The tables under ``root``, the spec of the code location over them and the Dagster
    home its commands use."""

    root: Path
    spec: dict[str, Any]
    dagster_home: Path

    @property
    def store(self) -> WatermarkStore:
        return WatermarkStore(self.spec["control_root"])

    @property
    def up(self) -> Path:
        return self.root / "up"

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        spec_file = write_spec(self.root / "spec.json", self.spec)
        env = {
            **os.environ,
            "PYTHONPATH": location_path(spec_file),
            "DAGSTER_HOME": str(self.dagster_home),
        }
        env.pop("NO_COLOR", None)
        return subprocess.run(
            [str(SCRIPT), *args, "--defs", location_defs(spec_file)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )

    def json(self, *args: str) -> Any:
        """A reading command's JSON, run in this process (tests/support/console.py); ``cli``
        runs the console script in a child, for ``run`` (whose Spark master cannot start)
        and the text output."""
        spec_file = write_spec(self.root / "spec.json", self.spec)
        env = {
            **os.environ,
            "PYTHONPATH": location_path(spec_file),
            "DAGSTER_HOME": str(self.dagster_home),
        }
        out = watermark_main([*args, "--json", "--defs", location_defs(spec_file)], env)
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)


def up_copy_lake(tmp_path: Path, dagster_home: Path, *, commits: int = 3, **spec: Any) -> Lake:
    """Upstream ``up`` with ``commits`` versions read by ``up_copy``; no Spark master that
    could start (nothing here runs a pipeline)."""
    for i in range(commits):
        commit_rows(tmp_path / "up", [i])
    base = {
        "control_root": str(tmp_path / "control"),
        "spark_master": "no-such-master",
        "upstreams": [{"name": "up", "path": str(tmp_path / "up")}],
        "pipelines": [
            {"name": "up_copy", "upstreams": ["up"], "target": str(tmp_path / "up_copy"),
             "transform": "copy"},
        ],
    }  # fmt: skip
    return Lake(tmp_path, {**base, **spec}, dagster_home)
