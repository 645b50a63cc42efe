"""Registry validation (clear errors when definitions load) and JVM-free observation."""

import os
import re
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from watermark_dagster.config.pipeline import Pipeline, WriteMode, pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import (
    CursorUpstream,
    DeltaUpstream,
    Upstream,
    UpstreamMode,
)
from watermark_dagster.config.upstream_kinds import declare_upstream
from watermark_dagster.core.observations import (
    Observation,
    TargetState,
    needs_first_load,
    read_mode_of,
    recreation,
    starting_point,
    version_committed_by,
)
from watermark_dagster.core.planning import recreation_found
from watermark_dagster.core.ranges import ReadMode
from watermark_dagster.core.records import Watermark, WatermarkHow
from watermark_dagster.errors import ConfigurationError, UpstreamUnavailableError, recreated_fix
from watermark_dagster.observe import observer as observer_module
from watermark_dagster.observe.log import (
    REPLAY_COUNTS,
    DeltaLog,
    commit_file,
    latest_local_version,
)
from watermark_dagster.observe.observer import Observer, observe_registry, starting_points
from watermark_dagster.store import WatermarkStore


def _t(batch):
    return None


@pytest.mark.parametrize(
    "bad",
    ["orders; DROP TABLE x", "my table", "o'brien", "", "1orders", "a" * 129],
    ids=["semicolon", "space", "quote", "empty", "leading-digit", "too-long"],
)
def test_upstream_names_are_plain_identifiers(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="Invalid upstream name"):
        DeltaUpstream(name=bad, path="/tmp/x")


def test_bad_window_cap_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="max_versions_per_batch must be a positive"):
        DeltaUpstream(name="orders", path="/tmp/x", max_versions_per_batch=0)


def test_pipeline_must_name_known_upstreams() -> None:
    with pytest.raises(ConfigurationError, match=r"reads unknown upstream\(s\) \['ordrs'\]"):
        Registry(
            upstreams=[DeltaUpstream(name="orders", path="/tmp/o")],
            pipelines=[
                Pipeline(
                    name="p", upstreams=("ordrs",), target="/tmp/t", keys=("id",), transform=_t
                )
            ],
        )


def test_duplicate_names_and_targets_are_refused() -> None:
    ups = [DeltaUpstream(name="orders", path="/tmp/o")]
    with pytest.raises(ConfigurationError, match="declared twice"):
        Registry(upstreams=ups * 2, pipelines=[])
    with pytest.raises(ConfigurationError, match="write the same target"):
        Registry(
            upstreams=ups,
            pipelines=[
                Pipeline(
                    name="p1", upstreams=("orders",), target="/tmp/t", keys=("id",), transform=_t
                ),
                Pipeline(
                    name="p2", upstreams=("orders",), target="/tmp/t", keys=("id",), transform=_t
                ),
            ],
        )
    with pytest.raises(ConfigurationError, match="used twice"):
        Registry(
            upstreams=ups,
            pipelines=[
                Pipeline(
                    name="orders",
                    upstreams=("orders",),
                    target="/tmp/t",
                    keys=("id",),
                    transform=_t,
                )
            ],
        )


def test_keys_are_required_and_validated() -> None:
    with pytest.raises(ConfigurationError, match="no key columns"):
        Pipeline(name="p", upstreams=("orders",), target="/tmp/t", keys=(), transform=_t)
    with pytest.raises(ConfigurationError, match="Invalid key column"):
        Pipeline(name="p", upstreams=("orders",), target="/tmp/t", keys=("id`; --",), transform=_t)
    with pytest.raises(ConfigurationError, match="reserved prefix"):
        Pipeline(name="p", upstreams=("orders",), target="/tmp/t", keys=("_wm_seq",), transform=_t)


def test_decorator_takes_name_and_docstring() -> None:
    @pipeline(upstreams=["orders"], target="/tmp/t", keys=["id"])
    def clean_orders(batch):
        """Orders without test rows."""

    assert clean_orders.name == "clean_orders"
    assert clean_orders.description == "Orders without test rows."


def test_observation_reads_version_cdf_and_identity(tmp_path: Path) -> None:
    path = tmp_path / "orders"
    data = pa.table({"id": pa.array([1, 2], pa.int64())})
    write_deltalake(str(path), data, configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(str(path), data, mode="append")
    observer = Observer()
    obs = observer.observe(DeltaUpstream(name="orders", path=str(path)))
    assert (obs.latest_version, obs.cdf_enabled) == (1, True)
    assert latest_local_version(str(path)) == 1
    # Cached per version: a second look with no new commit returns the same record.
    assert observer.observe(DeltaUpstream(name="orders", path=str(path))) is obs
    write_deltalake(str(path), data, mode="append")
    again = observer.observe(DeltaUpstream(name="orders", path=str(path)))
    assert again.latest_version == 2
    assert again.table_id == obs.table_id


@pytest.mark.parametrize("kind", ["missing", "not-delta"])
def test_unavailable_upstream_is_reported_by_name(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "nope"
    if kind == "not-delta":
        path.mkdir()
        (path / "part-0.parquet").write_bytes(b"not really")
    with pytest.raises(
        UpstreamUnavailableError, match=r"Upstream 'ghost' at .*nope.* not a readable Delta"
    ):
        Observer().observe(DeltaUpstream(name="ghost", path=str(path)))


# ------------------------------------------------------------------ read modes and starts


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "stream"}, "mode 'stream' is not one of"),
        ({"on_data_change": "ignore"}, "on_data_change 'ignore' is not one of"),
        ({"start_from": "yesterday"}, "start_from 'yesterday' is not"),
        ({"start_from": -3}, "start_from version -3 is negative"),
        ({"mode": "timestamp"}, "names no cursor column"),
        ({"cursor": "ts"}, "only apply to mode='timestamp'"),
        ({"mode": "timestamp", "cursor": "ts; DROP"}, "Invalid cursor column"),
        ({"mode": "timestamp", "cursor": "ts", "lag_seconds": -1}, "lag_seconds must be"),
    ],
)
def test_upstream_options_are_checked(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        declare_upstream(name="orders", path="/tmp/x", **kwargs)


def test_delta_and_cursor_upstreams_are_distinct_keyword_only_types() -> None:
    delta = DeltaUpstream(name="orders", path="/tmp/o", mode="CDF", max_versions_per_batch=5)
    assert (delta.mode, delta.is_cursor, delta.max_versions_per_batch) == ("cdf", False, 5)
    assert delta.mode is UpstreamMode.CDF  # stored as the enum member, equal to the text
    clicks = CursorUpstream(name="clicks", path="/tmp/c", cursor="ts", tie_break=["id"])
    assert (clicks.mode, clicks.is_cursor, clicks.max_versions_per_batch) == (
        UpstreamMode.TIMESTAMP,
        True,
        None,
    )
    assert clicks.tie_break == ("id",)
    assert (
        declare_upstream(
            name="clicks", path="/tmp/c", mode="TIMESTAMP", cursor="ts", tie_break=["id"]
        )
        == clicks
    )
    assert isinstance(declare_upstream(name="orders", path="/tmp/o"), DeltaUpstream)
    with pytest.raises(TypeError, match="declare DeltaUpstream"):
        Upstream(name="orders", path="/tmp/o")
    with pytest.raises(TypeError, match="positional"):
        DeltaUpstream("orders", path="/tmp/o")  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match=r"declare it as CursorUpstream"):
        DeltaUpstream(name="orders", path="/tmp/o", mode="timestamp")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="has no versions"):
        CursorUpstream(name="clicks", path="/tmp/c", cursor="ts", start_from=3)
    with pytest.raises(ConfigurationError, match="only apply to Delta upstreams"):
        declare_upstream(name="c", path="/tmp/c", mode="timestamp", cursor="ts", on_data_change="x")


def test_write_modes_and_layout_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="merges into its target but has no key"):
        Pipeline(name="p", upstreams=("u",), target="/tmp/t", keys=(), transform=_t)
    assert (
        Pipeline(
            name="p", upstreams=("u",), target="/tmp/t", keys=(), transform=_t, write="append"
        ).write
        is WriteMode.APPEND
    )
    with pytest.raises(ConfigurationError, match="partitioned or clustered, not both"):
        Pipeline(
            name="p",
            upstreams=("u",),
            target="/tmp/t",
            keys=("id",),
            transform=_t,
            partition_by=("d",),
            cluster_by=("id",),
        )
    with pytest.raises(ConfigurationError, match="write 'upsert' is not one of"):
        Pipeline(
            name="p", upstreams=("u",), target="/tmp/t", keys=("id",), transform=_t, write="upsert"
        )


def _table(path: Path, commits: int, *, cdf: bool) -> None:
    for i in range(commits):
        write_deltalake(
            str(path),
            pa.table({"id": pa.array([i], pa.int64())}),
            mode="append",
            configuration={"delta.enableChangeDataFeed": str(cdf).lower()},
        )


def test_start_from_gives_each_upstream_its_first_position(tmp_path: Path) -> None:
    for name in ("a", "b", "c", "d"):
        _table(tmp_path / name, 4, cdf=name != "d")
    when = datetime.now(UTC)
    ups = [
        DeltaUpstream(name="a", path=str(tmp_path / "a")),
        DeltaUpstream(name="b", path=str(tmp_path / "b"), start_from="latest"),
        DeltaUpstream(name="c", path=str(tmp_path / "c"), start_from=2),
        DeltaUpstream(name="d", path=str(tmp_path / "d"), start_from=when.isoformat()),
    ]
    _table(tmp_path / "d", 1, cdf=False)  # version 4 is after `when`
    registry = Registry(
        upstreams=ups,
        pipelines=[
            Pipeline(
                name=f"p_{u.name}",
                upstreams=(u.name,),
                target=f"/tmp/t_{u.name}",
                keys=("id",),
                transform=_t,
            )
            for u in ups
        ],
    )
    look = observe_registry(registry, Observer(), {})
    points = starting_points(registry, look, when)
    assert {u: v for u, (v, _, _) in points.items()} == {"b": 3, "c": 1, "d": 3}
    assert read_mode_of(registry.upstreams["a"], look.observed["a"]) is ReadMode.CDF
    assert read_mode_of(registry.upstreams["d"], look.observed["d"]) is ReadMode.APPEND_ONLY
    # Only pipelines whose upstreams start at the beginning load a snapshot first.
    assert look.bootstrap == ("p_a",)


def test_an_upstream_recreated_since_its_watermark_is_not_planned(tmp_path: Path) -> None:
    _table(tmp_path / "u", 3, cdf=True)
    registry = Registry(
        upstreams=[DeltaUpstream(name="u", path=str(tmp_path / "u"))],
        pipelines=[
            Pipeline(name="p", upstreams=("u",), target="/tmp/t", keys=("id",), transform=_t)
        ],
    )
    store = WatermarkStore(tmp_path / "control")
    store.initialize_watermarks({"u": (2, None, "test")}, actor="t", table_ids={"u": "old-id"})
    look = observe_registry(registry, Observer(), {"u": 2}, marks=store.committed())
    assert "u" in look.errors
    assert "dropped and recreated" in look.errors["u"]
    assert "watermark reset -t u" in look.errors["u"]
    assert look.runnable == {}


def test_target_state_sees_missing_empty_and_filled_targets(tmp_path: Path) -> None:
    observer = Observer()
    target = tmp_path / "t"
    p = Pipeline(name="p", upstreams=("u",), target=str(target), keys=("id",), transform=_t)
    assert observer.target_state(p) == "missing"
    write_deltalake(str(target), pa.table({"id": pa.array([], pa.int64())}), mode="append")
    assert observer.target_state(p) == "empty"
    _table(target, 1, cdf=False)
    assert observer.target_state(p) == "filled"


# ------------------------------------------------------------------ the Delta log reader


@pytest.mark.parametrize("route", ["local", "storage-layer"])
def test_the_delta_log_reader_lists_reads_and_finds_missing_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """One reader for local paths and object stores; the object-store route (delta-rs'
    storage layer) is exercised on the same real table by declaring it not local."""
    path = tmp_path / "orders"
    _table(path, 3, cdf=False)
    if route == "storage-layer":
        monkeypatch.setattr(DeltaLog, "local", property(lambda self: False))
    log = DeltaLog(str(path))
    assert log.local is (route == "local")
    assert log.versions() == {0, 1, 2}
    assert log.latest_version() == 2
    actions = log.actions(1)
    assert actions is not None
    assert any("add" in a for a in actions)
    assert any("commitInfo" in a for a in actions)
    assert log.read(7) is None
    assert log.actions(7) is None
    assert log.modified(7) is None
    assert log.modified(1) is not None
    assert [v for v, _ in log.history()] == [2, 1, 0]
    (path / commit_file(0)).unlink()  # what log cleanup does
    assert log.missing(range(0, 3)) == [0]
    assert log.versions() == {1, 2}


def test_a_warm_observation_with_nothing_new_lists_the_log_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path: no table load, one listing of ``_delta_log``, no file opened; a new
    commit is read from its commit file, still without a table load."""
    path = tmp_path / "orders"
    _table(path, 2, cdf=True)
    observer, upstream = Observer(), DeltaUpstream(name="orders", path=str(path))
    observer.observe(upstream)
    loads: list[str] = []
    listings: list[str] = []

    class CountingTable(observer_module.DeltaTable):
        def __init__(self, table_uri: str, *args: object, **kwargs: object) -> None:
            loads.append(table_uri)
            super().__init__(table_uri, *args, **kwargs)

    real_listdir, real_scandir = os.listdir, os.scandir

    def counting_listdir(folder: str) -> list[str]:
        listings.append(folder)
        return real_listdir(folder)

    def counting_scandir(folder: str) -> object:
        listings.append(folder)
        return real_scandir(folder)

    monkeypatch.setattr(observer_module, "DeltaTable", CountingTable)
    monkeypatch.setattr(os, "listdir", counting_listdir)
    monkeypatch.setattr(os, "scandir", counting_scandir)
    before = REPLAY_COUNTS.commits
    observer.observe(upstream)
    assert (loads, len(listings), REPLAY_COUNTS.commits - before) == ([], 1, 0)
    _table(path, 1, cdf=True)
    assert observer.observe(upstream).latest_version == 2
    assert (loads, REPLAY_COUNTS.commits - before) == ([], 1)


# ------------------------------------------------------------------ observation rules (core)


def test_recreation_is_one_rule_the_table_id_first() -> None:
    ref = "its committed watermark 5"
    assert recreation_found(7, "a", floor=5, reference=ref, expected_table_id="a") is None
    assert recreation_found(5, None, floor=5, reference=ref) is None
    assert recreation_found(4, "", floor=5, reference=ref, expected_table_id="a") == (
        "it is at version 4, below its committed watermark 5"
    )
    # A new table with fewer versions and another id: the id is named.
    assert recreation_found(2, "b", floor=5, reference=ref, expected_table_id="a") == (
        "its table id is b, not a as when its committed watermark 5 was recorded"
    )
    obs = Observation("u", "/p", 9, True, "new", "fp")

    def mark_on(table_id: str) -> Watermark:
        return Watermark(
            "u", 5, None, WatermarkHow.AUTO, datetime.now(UTC), None, table_id=table_id
        )

    mark = mark_on("old")
    error = recreation(obs, mark)
    assert error is not None
    assert error.fix == recreated_fix("u")
    assert "`watermark reset -t u --force`" in str(error)
    assert recreation(obs, None) is None
    assert recreation(obs, mark_on("new")) is None


@pytest.mark.parametrize(
    ("mode", "cdf", "expected"),
    [
        ("auto", True, ReadMode.CDF),
        ("auto", False, ReadMode.APPEND_ONLY),
        ("cdf", False, ReadMode.CDF),
        ("append_only", True, ReadMode.APPEND_ONLY),
        ("snapshot", True, ReadMode.SNAPSHOT),
    ],
)
def test_read_mode_follows_the_configured_mode_and_the_cdf_flag(
    mode: str, cdf: bool, expected: ReadMode
) -> None:
    upstream = DeltaUpstream(name="u", path="/tmp/u", mode=mode)
    assert read_mode_of(upstream, Observation("u", "/tmp/u", 3, cdf, "id", "fp")) is expected


def test_first_loads_missing_always_empty_only_before_a_success() -> None:
    assert needs_first_load(TargetState.MISSING, ever_succeeded=True)
    assert needs_first_load(TargetState.EMPTY, ever_succeeded=False)
    assert not needs_first_load(TargetState.EMPTY, ever_succeeded=True)
    assert not needs_first_load(TargetState.FILLED, ever_succeeded=False)


def test_starting_point_rules() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    table = Observation("u", "/p", 4, True, "id", "fp")
    cursor = Observation("c", "/c", -1, False, "", "", "state")
    asked: list[datetime] = []

    def version_by(when: datetime) -> int:
        asked.append(when)
        return version_committed_by([(0, 0), (1, 10), (2, 20)], when)

    assert starting_point("beginning", table, now, version_by) is None
    assert starting_point("latest", table, now, version_by) == (
        4,
        None,
        "start_from=latest: after v4",
    )
    assert starting_point(9, table, now, version_by)[0] == 4  # past the end: from the next
    assert starting_point(2, table, now, version_by)[0] == 1
    assert asked == []  # the history is read only for a timestamp start
    at = datetime.fromtimestamp(0.015, tz=UTC)
    assert starting_point(at, table, now, version_by)[0] == 1
    assert asked == [at]
    assert version_committed_by([(0, 10)], datetime.fromtimestamp(0, tz=UTC)) == -1
    micros = int(now.timestamp() * 1_000_000)
    assert starting_point("latest", cursor, now, version_by)[:2] == (None, (micros,))
