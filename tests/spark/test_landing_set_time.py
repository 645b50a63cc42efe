"""``watermark set -t LANDING --timestamp T`` with real Spark, Delta and Dagster: the files
modified at or before T are marked applied, only later files load; audited, confirmable,
and a dry run that lists both sides writes nothing, not even the file log."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.support.landing import landing_spec, write_csv
from tests.support.spark_lake import Lake, open_lake
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.core.records import BatchStatus
from watermark_dagster.observe.observer import Observer

pytestmark = pytest.mark.spark

_TABLES = ("batches", "committed_watermarks", "pipeline_checkpoints", "history")
_DAY = 86_400
_JAN_1 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path, dagster_home: Path) -> Iterator[Lake]:
    with open_lake(spark, tmp_path, dagster_home) as opened:
        yield opened


def _versions(lake: Lake) -> dict[str, int]:
    return {t: lake.store.table_version(t) for t in _TABLES}


def _log_version(folder: Path) -> int | None:
    log = folder / "_watermark_files" / "_delta_log"
    if not log.exists():
        return None
    return max(int(p.stem) for p in log.glob("*.json"))


def test_files_modified_by_then_are_applied_and_only_later_files_load(lake: Lake) -> None:
    folder = lake.root / "landing"
    write_csv(folder, "a.csv", [(1, 10)], mtime=_JAN_1)
    write_csv(folder, "b.csv", [(2, 20)], mtime=_JAN_1 + _DAY)  # exactly at T: applied
    write_csv(folder, "c.csv", [(3, 30)], mtime=_JAN_1 + 2 * _DAY)
    spec = landing_spec(lake, folder)
    at = "2026-01-02T00:00:00"  # no zone: UTC, as for every --timestamp
    versions = _versions(lake)

    dry = lake.cli(spec, "set", "-t", "drops", "--timestamp", at, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "dry run: nothing written" in dry.stdout, dry.stdout
    assert "drops: committed watermark none -> 2" in dry.stdout, dry.stdout
    assert "applied (2 files, 1..2): a.csv, b.csv" in dry.stdout, dry.stdout
    assert "still to load (1 file, 3..3): c.csv" in dry.stdout, dry.stdout
    assert "would log 3 settled files first" in dry.stdout, dry.stdout
    # Nothing written: no control table moved, and not even the file log was created.
    assert _versions(lake) == versions
    assert _log_version(folder) is None
    assert "drops" not in lake.store.committed_versions()

    done = lake.cli(
        spec, "set", "-t", "drops", "--timestamp", at, "--yes", "--reason", "go live", "--json"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert (result["old"], result["new"], result["applied"]) == (None, 2, True)
    assert result["files"]["applied"]["count"] == 2
    assert result["files"]["to_load"]["count"] == 1
    assert lake.store.committed_versions()["drops"] == 2
    last = lake.store.history(upstream="drops")[-1]
    assert (last["event"], last["old_value"], last["new_value"]) == ("WATERMARK_SET", None, "2")
    detail = json.loads(last["detail"])
    assert detail["reason"] == "go live"
    assert detail["resolved"]["timestamp"] == at
    assert detail["resolved"]["resolved_time"] == "2026-01-02T00:00:00+00:00"
    assert detail["resolved"]["last_applied"] == "b.csv"

    # The next run loads only c.csv, into a target that did not exist yet (no snapshot of
    # every file first); a later file loads after it.
    [batch] = lake.run(spec).completed
    assert lake.store.get_batch(batch).status is BatchStatus.COMPLETED
    assert lake.rows("copy") == {3: 30}
    write_csv(folder, "d.csv", [(4, 40)])
    lake.run(spec)
    assert lake.rows("copy") == {3: 30, 4: 40}
    assert lake.store.committed_versions()["drops"] == 4


def test_a_numbering_that_t_does_not_split_is_refused_naming_both_files(lake: Lake) -> None:
    folder = lake.root / "landing"
    write_csv(folder, "a.csv", [(1, 10)], mtime=_JAN_1)
    write_csv(folder, "c.csv", [(3, 30)], mtime=_JAN_1 + 2 * _DAY)
    spec = landing_spec(lake, folder)
    lake.run(spec)  # files 1 (a), 2 (c)
    # Copied in later with an old modification time: file 3, modified before c.csv.
    write_csv(folder, "b.csv", [(2, 20)], mtime=_JAN_1 + _DAY)
    at = "2026-01-02T12:00:00Z"
    for extra in (("--dry-run",), ("--yes",)):
        versions, log = _versions(lake), _log_version(folder)
        out = lake.cli(spec, "set", "-t", "drops", "--timestamp", at, *extra)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "'c.csv' (file 2, modified 2026-01-03T00:00:00+00:00)" in out.stderr, out.stderr
        assert "'b.csv' (file 3, modified 2026-01-02T00:00:00+00:00)" in out.stderr, out.stderr
        assert "--version 1" in out.stderr, out.stderr
        assert "--version 3" in out.stderr, out.stderr
        assert _versions(lake) == versions
        if extra == ("--dry-run",):
            assert _log_version(folder) == log  # b.csv not logged by a dry run
    assert lake.store.committed_versions()["drops"] == 2


def test_an_open_batch_refuses_unless_forced(lake: Lake) -> None:
    folder = lake.root / "landing"
    write_csv(folder, "a.csv", [(1, 10)], mtime=_JAN_1)
    spec = landing_spec(lake, folder)
    lake.run(spec)  # file 1
    write_csv(folder, "b.csv", [(2, 20)], mtime=_JAN_1 + 2 * _DAY)
    # b.csv logged as file 2, as the coordinator's look before a plan logs it (`list` shows
    # it and writes nothing).
    drops = LandingUpstream(name="drops", path=str(folder), format="csv", settle_seconds=0)
    assert Observer().observe(drops, floor=1).latest_version == 2
    batch, created = lake.store.create_batch(
        [UpstreamPosition("drops", 2, 1)], {"drops_copy": ["drops"]}, actor="test"
    )
    assert created
    assert batch is not None
    at = "2026-01-02T00:00:00Z"
    versions = _versions(lake)
    refused = lake.cli(spec, "set", "-t", "drops", "--timestamp", at, "--version", "2")
    assert refused.returncode == 2  # one of them, as for every upstream
    refused = lake.cli(spec, "set", "-t", "drops", "--timestamp", "2026-01-04", "--yes")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"batch {batch.batch_id} is open and reads drops" in refused.stderr, refused.stderr
    assert _versions(lake) == versions
    forced = lake.cli(spec, "set", "-t", "drops", "--timestamp", "2026-01-04", "--yes", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert f"batch {batch.batch_id} ABANDONED" in forced.stdout, forced.stdout
    assert "files 1..2 count as applied (the last, 'b.csv'" in forced.stdout, forced.stdout
    assert lake.store.committed_versions()["drops"] == 2


@pytest.mark.parametrize(
    ("at", "message"),
    [
        ("2999-01-01", "is in the future"),
        ("2025-12-31", "before every file"),
    ],
    ids=["future", "before-every-file"],
)
def test_times_with_nothing_to_apply_are_refused(lake: Lake, at: str, message: str) -> None:
    folder = lake.root / "landing"
    write_csv(folder, "a.csv", [(1, 10)], mtime=_JAN_1)
    spec = landing_spec(lake, folder)
    versions = _versions(lake)
    out = lake.cli(spec, "set", "-t", "drops", "--timestamp", at, "--yes")
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr, out.stderr
    assert _versions(lake) == versions
    assert "drops" not in lake.store.committed_versions()


def test_a_file_still_settling_by_then_is_refused(lake: Lake) -> None:
    folder = lake.root / "landing"
    now = datetime.now(UTC).timestamp()
    write_csv(folder, "a.csv", [(1, 10)], mtime=_JAN_1)
    write_csv(folder, "b.csv", [(2, 20)], mtime=now - 60)
    spec = landing_spec(lake, folder, settle_seconds=3600)
    at = datetime.fromtimestamp(now - 30, UTC).isoformat()
    out = lake.cli(spec, "set", "-t", "drops", "--timestamp", at, "--yes")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "'b.csv' (modified" in out.stderr, out.stderr
    assert "still settling" in out.stderr, out.stderr
    assert "drops" not in lake.store.committed_versions()
