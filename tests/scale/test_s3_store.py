"""The control tables on S3 (moto's server on loopback): the compare-and-swap holds between
processes and between simultaneous commits, and options that would leave commits unguarded
are refused before anything is written. No JVM."""

import time
from collections.abc import Iterator
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any

import pytest

from tests.scale.s3server import S3Server, proxy, running_s3_server
from tests.support.processes import spawn_pool
from tests.support.store_races import advance_at
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.scale

PIPELINES = {"pipeline_a": ["up1", "up2"], "pipeline_b": ["up2"]}


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    with running_s3_server(tmp_path) as server:
        for key, value in server.environ().items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("AWS_S3_ALLOW_UNSAFE_RENAME", raising=False)
        yield server


def _positions(latest: int) -> list[UpstreamPosition]:
    return [UpstreamPosition("up1", latest, None), UpstreamPosition("up2", latest, None)]


def _plan_at(root: str, start_at: float, latest: int) -> bool:
    store = WatermarkStore(root)
    store.ensure_tables()
    time.sleep(max(0.0, start_at - time.time()))
    return store.create_batch(_positions(latest), PIPELINES, actor=f"proc-{latest}")[1]


def test_processes_racing_the_watermark_cas_on_s3_advance_it_once(s3: S3Server) -> None:
    root = s3.uri("control")
    store = WatermarkStore(root)
    # Planners race first: one batch.
    with spawn_pool(3) as pool:
        start = time.time() + 3
        created = _within(pool.starmap_async(_plan_at, [(root, start, 5 + i) for i in range(3)]))
        assert sum(created) == 1, created
        # Then finalizers race the same watermark's compare-and-swap: exactly one moves
        # it, the others find it moved (the store's outcome for a lost race).
        start = time.time() + 3
        results = _within(pool.starmap_async(advance_at, [(root, start, "up2")] * 3))
    assert sorted(results) == ["ADVANCE", "ALREADY_DONE", "ALREADY_DONE"], results
    batches = store.batches()
    assert len(batches) == 1
    advanced = [h for h in store.history() if h["event"] == "WATERMARK_ADVANCED"]
    assert len(advanced) == 1
    assert store.committed_versions()["up2"] == batches[0].inputs["up2"].snapshot_version
    # The tables really are on the server.
    assert any(k.startswith("control/committed_watermarks/_delta_log/") for k in s3.keys(""))


def _advance_via(root: str, endpoint: str, actor: str) -> str:
    store = WatermarkStore(root, storage_options={"AWS_ENDPOINT_URL": endpoint})
    batch = store.open_batch()
    assert batch is not None
    return store.advance(batch, "up2", actor=actor).value


def _advance_together(root: str, endpoint: str) -> list[str]:
    """Two finalizers (processes: delta-rs holds the GIL while it commits) advance the same
    watermark; the proxy holds their commits until both arrive, both decided against one
    version of the table."""
    with spawn_pool(2) as pool:
        racers = [(root, endpoint, "racer-a"), (root, endpoint, "racer-b")]
        return sorted(_within(pool.starmap_async(_advance_via, racers)))


# A pool whose worker process dies (killed, out of memory) never answers ``starmap``: the
# test fails after this long instead of hanging CI (a fresh-clone run hung here once).
POOL_TIMEOUT_SECONDS = 300


def _within(result: AsyncResult[list[Any]]) -> list[Any]:
    """The pool's answer, or a TimeoutError naming the limit."""
    return result.get(timeout=POOL_TIMEOUT_SECONDS)


def test_simultaneous_commits_of_one_cas_on_s3_land_once(s3: S3Server) -> None:
    root = s3.uri("together")
    WatermarkStore(root).create_batch(_positions(4), PIPELINES, actor="test")
    with proxy(s3, strip_conditions=False) as through:
        through.hold_commits(2)
        assert _advance_together(root, through.endpoint) == ["ADVANCE", "ALREADY_DONE"]
    store = WatermarkStore(root)
    assert [h["event"] for h in store.history()].count("WATERMARK_ADVANCED") == 1
    assert store.committed_versions() == {"up2": 4}


def test_without_conditional_writes_both_commits_would_win(s3: S3Server) -> None:
    # The same race against a server that ignores If-None-Match: both finalizers believe
    # they advanced, the second commit overwrote the first. Why a bucket needs conditional
    # writes (docs/s3.md), and what the test above would see without them.
    root = s3.uri("unguarded")
    WatermarkStore(root).create_batch(_positions(4), PIPELINES, actor="test")
    with proxy(s3, strip_conditions=True) as through:
        through.hold_commits(2)
        assert _advance_together(root, through.endpoint) == ["ADVANCE", "ADVANCE"]


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("conditional_put", "disabled", "conditional_put=disabled"),
        ("aws_conditional_put", "Disabled", "aws_conditional_put=Disabled"),
        ("AWS_S3_LOCKING_PROVIDER", "dynamodb", "AWS_S3_LOCKING_PROVIDER=dynamodb"),
    ],
)
def test_options_that_unguard_commits_are_refused_before_any_write(
    s3: S3Server, option: str, value: str, named: str
) -> None:
    store = WatermarkStore(s3.uri("off"), storage_options={option: value})
    with pytest.raises(ConfigurationError, match=named) as refused:
        store.open_batch()
    assert "'committed_watermarks'" in str(refused.value)
    assert f"remove {option}" in str(refused.value)
    assert s3.keys("off/") == []


def test_a_local_root_ignores_s3_options(tmp_path: Path) -> None:
    store = WatermarkStore(tmp_path / "control", storage_options={"conditional_put": "disabled"})
    store.ensure_tables()
    assert store.open_batch() is None
