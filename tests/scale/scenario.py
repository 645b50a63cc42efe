"""One scenario for every deployment the scale tier tests: upstreams of every read mode,
the local suite's pipelines (``tests/support/lakes.py``), batches run by ``watermark run`` in a
child process, then targets and watermarks checked against the upstreams.

Only the Spark settings differ between deployments (a ``spark_master``, a
``spark_remote``, extra ``spark_conf``): the upstreams are written with delta-rs and
pyarrow, and the checks read with delta-rs, so the test process itself starts no JVM.

Upstreams and what reads them:

* ``changes`` (change data feed): inserts, updates and deletes; ``changes_copy`` merges the
  latest change per id (``copy``).
* ``events`` (appended files only): appends; ``events_copy`` appends every new row
  (``appended``).
* ``dims`` (``mode: snapshot``): overwritten whole; ``dims_copy`` reloads it (``copy``).
* ``clicks`` (a parquet folder read by timestamp): new files; ``clicks_copy`` (``copy``).
"""

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from tests.conftest import REPO
from tests.support.lakes import location_defs, location_path, write_spec
from watermark_dagster.store import WatermarkStore

WATERMARK = Path(sys.executable).with_name("watermark")
CDF = {"delta.enableChangeDataFeed": "true"}
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _values(ids: list[int], scale: int) -> pa.Table:
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "value": pa.array([i * scale for i in ids], pa.int64())}
    )


@dataclass
class Scenario:
    """The upstreams, pipelines and control root of one deployment's run, under ``root``
    (a local folder)."""

    root: Path
    spark: Mapping[str, Any]
    rounds_done: int = 0

    def path(self, name: str) -> str:
        """Where table ``name`` lives."""
        return str(self.root / name)

    @property
    def control_root(self) -> str:
        """The control tables' root."""
        return self.path("_control")

    def spec(self) -> dict[str, Any]:
        """The code location (``tests.support.lakes.defs_from``) with this deployment's Spark."""
        upstreams = [
            {"name": "changes", "path": self.path("changes"), "mode": "cdf"},
            {"name": "events", "path": self.path("events"), "mode": "append_only"},
            {"name": "dims", "path": self.path("dims"), "mode": "snapshot"},
            {
                "name": "clicks",
                "path": self.path("clicks"),
                "mode": "timestamp",
                "format": "parquet",
                "cursor": "ts",
                "tie_break": ["id"],
            },
        ]
        pipelines = [
            {"name": "changes_copy", "upstreams": ["changes"], "transform": "copy"},
            {
                "name": "events_copy",
                "upstreams": ["events"],
                "transform": "appended",
                "write": "append",
            },
            {"name": "dims_copy", "upstreams": ["dims"], "transform": "copy"},
            {"name": "clicks_copy", "upstreams": ["clicks"], "transform": "copy"},
        ]
        for p in pipelines:
            p["target"] = self.path(f"target_{p['name']}")
        return {
            "control_root": self.control_root,
            "upstreams": upstreams,
            "pipelines": pipelines,
            **self.spark,
        }

    # ------------------------------------------------------------ upstream changes

    def commit_round(self) -> None:
        """One round of upstream changes (round 0 creates the upstreams)."""
        n = self.rounds_done
        base = 100 * n
        new = list(range(base, base + 10))
        if n == 0:
            write_deltalake(self.path("changes"), _values(new, 1), configuration=CDF)
            write_deltalake(self.path("events"), _values(new, 1))
        else:
            write_deltalake(self.path("changes"), _values(new, 1), mode="append")
            changes = DeltaTable(self.path("changes"))
            # Test-owned integers only in these predicates.
            changes.update(predicate=f"id = {base - 100 + 1}", updates={"value": "value + 7"})
            changes.delete(predicate=f"id = {base - 100 + 2}")
            write_deltalake(self.path("events"), _values(new, 1), mode="append")
            write_deltalake(self.path("events"), _values([base + 50], 1), mode="append")
        write_deltalake(self.path("dims"), _values(list(range(5 + n)), 10 + n), mode="overwrite")
        clicks = self.root / "clicks"
        clicks.mkdir(exist_ok=True)
        stamp = _EPOCH + timedelta(minutes=n)
        table = _values(new, 3).append_column(
            "ts",
            pa.array(
                [stamp + timedelta(seconds=i) for i in range(len(new))],
                pa.timestamp("us", tz="UTC"),
            ),
        )
        pq.write_table(table, clicks / f"part-{n}.parquet")
        self.rounds_done += 1

    # ------------------------------------------------------------ running

    def run(self, dagster_home: Path, extra_env: Mapping[str, str] | None = None) -> dict:
        """``watermark run --json`` over the code location, in a child process; its JSON
        outcome (it must succeed)."""
        proc = self.run_raw(dagster_home, extra_env)
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-6000:])
        return json.loads(proc.stdout)

    def run_raw(
        self, dagster_home: Path, extra_env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """``watermark run --json`` in a child process, whatever its outcome."""
        spec_file = write_spec(self.root / "scale_spec.json", self.spec())
        env = {
            **os.environ,
            "PYTHONPATH": location_path(spec_file),
            "DAGSTER_HOME": str(dagster_home),
            "WATERMARK_HOME": str(self.root / "home"),
            **dict(extra_env or {}),
        }
        return subprocess.run(
            [str(WATERMARK), "run", "--json", "--defs", location_defs(spec_file)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )

    def run_rounds(self, dagster_home: Path, rounds: int = 2) -> None:
        """``rounds`` times: commit a round of upstream changes, run the batches, check.

        Two rounds by default: the first loads of every read mode, then one incremental
        batch of each (updates, deletes, appends, a reload, a cursor window) on the
        deployment. Longer histories are the default suite's (tests/spark, tests/model)."""
        for _ in range(rounds):
            self.commit_round()
            outcome = self.run(dagster_home)
            assert outcome["completed"], outcome
            self.check()

    # ------------------------------------------------------------ checks

    def target_rows(self, name: str) -> dict[int, int]:
        """ID -> value of a pipeline's target, failing on a duplicated id."""
        table = DeltaTable(self.path(f"target_{name}"))
        data = pa.RecordBatchReader.from_stream(table.scan(columns=["id", "value"])).read_all()
        ids, values = data.column("id").to_pylist(), data.column("value").to_pylist()
        assert len(ids) == len(set(ids)), f"duplicated ids in {name}"
        return dict(zip(ids, values, strict=True))

    def upstream_rows(self, name: str) -> dict[int, int]:
        """ID -> value of an upstream as it is now."""
        if name == "clicks":
            data = pq.read_table(self.root / "clicks")
        else:
            data = DeltaTable(self.path(name)).to_pyarrow_table(columns=["id", "value"])
        return dict(
            zip(data.column("id").to_pylist(), data.column("value").to_pylist(), strict=True)
        )

    def check(self) -> None:
        """Every target equals what its upstream holds; every Delta upstream's watermark is
        at its latest version, the cursor upstream's at its newest row."""
        for upstream in ("changes", "events", "dims", "clicks"):
            assert self.target_rows(f"{upstream}_copy") == self.upstream_rows(upstream), upstream
        committed = WatermarkStore(self.control_root).committed()
        for upstream in ("changes", "events", "dims"):
            latest = DeltaTable(self.path(upstream)).version()
            assert committed[upstream].committed_version == latest, (upstream, committed)
        newest = _EPOCH + timedelta(minutes=self.rounds_done - 1, seconds=9)
        assert committed["clicks"].committed_cursor is not None
        assert committed["clicks"].committed_cursor[0] == int(newest.timestamp() * 1_000_000)
