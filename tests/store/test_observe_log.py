"""Observation from the Delta log alone: only the new commits of a table whose version moved,
the newest checkpoint and the commits after it for a table not seen before, and a delta-rs
load only where the log cannot answer. Every observation is compared with what a full
delta-rs load of the same table gives."""

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Schema, write_deltalake
from deltalake.schema import Field, PrimitiveType

from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.observations import Observation
from watermark_dagster.errors import UpstreamUnavailableError
from watermark_dagster.observe import observer as observer_module
from watermark_dagster.observe.log import (
    REPLAY_COUNTS,
    Protocol,
    commit_file,
    commit_history,
    latest_local_version,
    list_local_log,
    replay_local_log,
)
from watermark_dagster.observe.observer import Observer


def full_load(path: Path) -> tuple[int, bool, str, str]:
    """What a full delta-rs load says: version, CDF flag, table id, schema fingerprint
    (computed as the observer always has, independently of the code under test)."""
    dt = DeltaTable(str(path))
    metadata = dt.metadata()
    config = {k.lower(): v for k, v in (metadata.configuration or {}).items()}
    cdf = str(config.get("delta.enablechangedatafeed", "false")).lower() == "true"
    fingerprint = hashlib.sha256(dt.schema().to_json().encode()).hexdigest()[:16]
    return dt.version(), cdf, str(metadata.id), fingerprint


def seen(obs: Observation) -> tuple[int, bool, str, str]:
    return obs.latest_version, obs.cdf_enabled, obs.table_id, obs.schema_fingerprint


def protocol_of(path: Path) -> Protocol:
    p = DeltaTable(str(path)).protocol()
    return Protocol(
        p.min_reader_version,
        p.min_writer_version,
        None if p.reader_features is None else tuple(sorted(p.reader_features)),
        None if p.writer_features is None else tuple(sorted(p.writer_features)),
    )


class Counts:
    """Table loads by the observer and files read by replays, since the last ``take``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loads: list[str] = []
        self.threads: set[str] = set()  # the threads tables were loaded on
        counts = self

        class CountingTable(observer_module.DeltaTable):
            def __init__(self, table_uri: str, *args: Any, **kwargs: Any) -> None:
                counts.loads.append(table_uri)
                counts.threads.add(threading.current_thread().name.split("_")[0])
                super().__init__(table_uri, *args, **kwargs)

        monkeypatch.setattr(observer_module, "DeltaTable", CountingTable)
        self._commits, self._checkpoints = REPLAY_COUNTS.commits, REPLAY_COUNTS.checkpoints

    def take(self) -> tuple[int, int, int]:
        """(table loads, commit files read, checkpoints read) since the last call."""
        out = (
            len(self.loads),
            REPLAY_COUNTS.commits - self._commits,
            REPLAY_COUNTS.checkpoints - self._checkpoints,
        )
        self.loads.clear()
        self._commits, self._checkpoints = REPLAY_COUNTS.commits, REPLAY_COUNTS.checkpoints
        return out


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    return Counts(monkeypatch)


def _rows(start: int, n: int = 2, **extra: pa.Array) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()), **extra})


def history(path: Path) -> Iterator[str]:
    """A table's life through the operations that change what an observation reports (or
    must not): appends, a new column, CDF turned on, OPTIMIZE, a checkpoint and many commits
    after it, the table replaced in place by a new one (new id, other schema), a delete."""
    p = str(path)
    write_deltalake(p, _rows(0))
    yield "created"
    for i in range(3):
        write_deltalake(p, _rows(10 * i), mode="append")
        yield f"append {i}"
    write_deltalake(p, _rows(40, note=pa.array(["a", "b"])), mode="append", schema_mode="merge")
    yield "column added"
    DeltaTable(p).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    yield "CDF on"
    write_deltalake(p, _rows(50, note=pa.array(["c", "d"])), mode="append")
    yield "append after CDF on"
    DeltaTable(p).optimize.compact()
    yield "OPTIMIZE"
    DeltaTable(p).create_checkpoint()
    yield "checkpoint (no new commit)"
    for i in range(12):
        write_deltalake(p, _rows(100 + 10 * i, note=pa.array(["e", "f"])), mode="append")
        yield f"past the checkpoint {i}"
    schema = Schema([Field("key", PrimitiveType("string")), Field("n", PrimitiveType("long"))])
    DeltaTable.create(p, schema=schema, mode="overwrite")
    yield "replaced in place (new id)"
    write_deltalake(p, pa.table({"key": ["k"], "n": pa.array([1], pa.int64())}), mode="append")
    yield "append to the new table"
    DeltaTable(p).delete("n = 1")
    yield "delete"


def test_observations_from_the_log_equal_a_full_load_through_a_tables_history(
    tmp_path: Path, counts: Counts
) -> None:
    """At every step of the history: an observer that has followed the table reads only the
    new commit files (no table load except for a protocol it has not seen accepted), and an
    observer that has never seen the table reads the newest checkpoint and the commits after
    it; both equal a full load."""
    path = tmp_path / "orders"
    upstream = DeltaUpstream(name="orders", path=str(path))
    warm = Observer()
    previous, protocols = -1, set[Protocol]()
    ids, checkpoint_read = set[str](), False
    for step in history(path):
        expected = full_load(path)
        protocol = protocol_of(path)
        version = expected[0]

        assert seen(warm.observe(upstream)) == expected, step
        loads, commits, checkpoints = counts.take()
        assert loads == (0 if protocol in protocols else 1), step
        assert (commits, checkpoints) == (version - previous, 0), step
        protocols.add(protocol)
        previous = version

        # Cold: a new observer, which a copy of the table taught the protocol, observes the
        # table itself from its log without loading it.
        cold = Observer()
        twin = tmp_path / f"twin-{version}"
        shutil.copytree(path, twin, dirs_exist_ok=True)
        cold.observe(DeltaUpstream(name="twin", path=str(twin)))
        counts.take()
        assert seen(cold.observe(upstream)) == expected, step
        loads, commits, checkpoints = counts.take()
        checkpoint = max(
            (int(n[:20]) for n in os.listdir(twin / "_delta_log") if n.endswith(".parquet")),
            default=-1,
        )
        assert (loads, checkpoints) == (0, int(checkpoint >= 0)), step
        # Only commits after the checkpoint, newest first until both actions are found.
        assert commits <= version - checkpoint, step
        checkpoint_read |= checkpoint >= 0
        ids.add(expected[2])
    assert checkpoint_read
    assert len(ids) == 2
    assert len(protocols) >= 2


def test_a_replayed_snapshot_holds_the_protocol_and_metadata_delta_rs_reads(
    tmp_path: Path,
) -> None:
    """The log reader alone, step by step: from nothing and from the previous snapshot."""
    path = tmp_path / "orders"
    since = None
    for step in history(path):
        names = list_local_log(str(path))
        assert names is not None
        dt = DeltaTable(str(path))
        for snapshot in (
            replay_local_log(str(path), names),
            replay_local_log(str(path), names, since),
        ):
            assert snapshot is not None, step
            assert snapshot.version == dt.version(), step
            assert snapshot.protocol == protocol_of(path), step
            assert snapshot.metadata.table_id == dt.metadata().id, step
            assert dict(snapshot.metadata.configuration) == dt.metadata().configuration, step
            parsed = Schema.from_json(snapshot.metadata.schema_string).to_json()
            assert parsed == dt.schema().to_json(), step
        since = snapshot


def test_commits_removed_by_log_cleanup_are_read_from_the_checkpoint(
    tmp_path: Path, counts: Counts
) -> None:
    """The version the observer last saw is gone (log cleanup after a checkpoint): it reads
    the checkpoint and the commits after it, not the table."""
    path = tmp_path / "orders"
    upstream = DeltaUpstream(name="orders", path=str(path))
    for i in range(4):
        write_deltalake(str(path), _rows(i), mode="append")
    observer = Observer()
    observer.observe(upstream)
    for i in range(4, 15):
        write_deltalake(str(path), _rows(i), mode="append")
    DeltaTable(str(path)).create_checkpoint()
    for i in range(15, 18):
        write_deltalake(str(path), _rows(i), mode="append")
    for v in range(0, 14):
        (path / commit_file(v)).unlink()  # what log cleanup does
    counts.take()
    assert seen(observer.observe(upstream)) == full_load(path)
    assert counts.take() == (0, 3, 1)


def test_a_table_the_log_cannot_describe_is_loaded(tmp_path: Path, counts: Counts) -> None:
    """The only checkpoint is one the log reader does not read (multi-part) and the commits
    before it are gone: delta-rs loads the table."""
    path = tmp_path / "orders"
    upstream = DeltaUpstream(name="orders", path=str(path))
    for i in range(6):
        write_deltalake(str(path), _rows(i), mode="append")
    observer = Observer()
    observer.observe(upstream)
    DeltaTable(str(path)).create_checkpoint()
    log = path / "_delta_log"
    (log / f"{5:020d}.checkpoint.parquet").rename(
        log / f"{5:020d}.checkpoint.{1:010d}.{1:010d}.parquet"
    )
    last = json.loads((log / "_last_checkpoint").read_text())
    (log / "_last_checkpoint").write_text(json.dumps({**last, "parts": 1}))
    write_deltalake(str(path), _rows(6), mode="append")
    for v in range(0, 6):
        (path / commit_file(v)).unlink()
    counts.take()
    assert seen(observer.observe(upstream)) == full_load(path)
    assert counts.take()[0] == 1


def test_a_table_recreated_at_the_same_path_is_read_as_the_new_table(
    tmp_path: Path, counts: Counts
) -> None:
    """Dropped and recreated with more versions than the observer saw: the commit file of
    the version it saw is another file now, so it reads the new table from the start
    instead of carrying the old table's id forward."""
    path = tmp_path / "orders"
    upstream = DeltaUpstream(name="orders", path=str(path))
    for i in range(3):
        write_deltalake(str(path), _rows(i), mode="append")
    observer = Observer()
    before = observer.observe(upstream)
    shutil.rmtree(path)
    for i in range(6):
        write_deltalake(str(path), _rows(i), mode="append")
    counts.take()
    after = observer.observe(upstream)
    assert seen(after) == full_load(path)
    assert after.table_id != before.table_id
    assert counts.take() == (0, 6, 0)


def test_a_protocol_delta_rs_refuses_is_refused_warm_and_cold(
    tmp_path: Path, counts: Counts
) -> None:
    """A new commit asks for a reader feature delta-rs does not support: the table is
    unavailable exactly as a full load says, whether the observer knew the table or not."""
    path = tmp_path / "orders"
    upstream = DeltaUpstream(name="orders", path=str(path))
    write_deltalake(str(path), _rows(0))
    observer = Observer()
    observer.observe(upstream)
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["futureFeature"],
        "writerFeatures": ["futureFeature"],
    }
    commit = [{"commitInfo": {"timestamp": 1, "operation": "UPGRADE"}}, {"protocol": protocol}]
    (path / commit_file(1)).write_text("".join(json.dumps(a) + "\n" for a in commit))
    with pytest.raises(Exception, match="futureFeature"):
        DeltaTable(str(path))
    counts.take()
    for who in (observer, Observer()):
        with pytest.raises(UpstreamUnavailableError, match="futureFeature"):
            who.observe(upstream)
    assert counts.take()[0] == 2


def test_observe_all_keeps_the_order_and_reads_only_what_changed(
    tmp_path: Path, counts: Counts
) -> None:
    """Unchanged tables come from the cache, a changed one costs its new commit; results
    come back in the order given, errors included."""
    ups = [DeltaUpstream(name=n, path=str(tmp_path / n)) for n in ("d", "c", "b", "a")]
    for u in ups[1:]:
        write_deltalake(u.path, _rows(0))
    observer = Observer(workers=3)
    first = observer.observe_all(ups)
    assert list(first) == ["d", "c", "b", "a"]
    assert isinstance(first["d"], UpstreamUnavailableError)
    for u in ups[1:]:
        obs = first[u.name]
        assert isinstance(obs, Observation)
        assert seen(obs) == full_load(Path(u.path))
    write_deltalake(ups[2].path, _rows(1), mode="append")
    counts.take()
    again = observer.observe_all(ups)
    assert again["c"] is first["c"]
    assert again["a"] is first["a"]
    changed = again["b"]
    assert isinstance(changed, Observation)
    assert seen(changed) == full_load(Path(ups[2].path))
    assert counts.take() == (0, 1, 0)


def test_observe_all_loads_object_store_tables_on_worker_threads(
    tmp_path: Path, counts: Counts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables delta-rs must load whole (object stores; these real tables are declared
    remote) are loaded on the worker threads, each result in its place."""
    ups = [DeltaUpstream(name=f"t{i}", path=str(tmp_path / f"t{i}")) for i in range(3)]
    for u in ups:
        write_deltalake(u.path, _rows(0))
    monkeypatch.setattr(observer_module, "is_local", lambda _path: False)
    looked = Observer(workers=2).observe_all(ups)
    assert counts.threads == {"observe"}
    assert len(counts.loads) == 3
    for u in ups:
        obs = looked[u.name]
        assert isinstance(obs, Observation)
        assert seen(obs) == full_load(Path(u.path))


def test_observers_shared_by_threads_agree_with_a_full_load(tmp_path: Path) -> None:
    """Several threads observe the same tables through one observer while they are written
    to; afterwards every observation equals a full load."""
    ups = [DeltaUpstream(name=f"t{i}", path=str(tmp_path / f"t{i}")) for i in range(4)]
    for u in ups:
        write_deltalake(u.path, _rows(0))
    observer = Observer(workers=2)
    stop = threading.Event()
    failures: list[BaseException] = []

    def look() -> None:
        while not stop.is_set():
            try:
                for obs in observer.observe_all(ups).values():
                    assert isinstance(obs, Observation)
            except BaseException as e:  # reported by the main thread
                failures.append(e)
                return

    threads = [threading.Thread(target=look) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(1, 6):
            for u in ups:
                write_deltalake(u.path, _rows(i), mode="append")
        DeltaTable(ups[0].path).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    for u in ups:
        assert latest_local_version(u.path) is not None
        assert seen(observer.observe(u)) == full_load(Path(u.path))


def _labelled(path: Path, label: str, *, first: bool = False) -> None:
    write_deltalake(
        str(path),
        pa.table({"a": pa.array([1], pa.int64())}),
        mode="overwrite" if first else "append",
        commit_properties=CommitProperties(custom_metadata={"userMetadata": label}),
    )


def test_a_history_read_on_a_table_loaded_before_new_commits_numbers_them_truly(
    tmp_path: Path,
) -> None:
    """delta-rs numbers a history down from the version its table object was loaded at,
    yet lists the commits made since: each number would be short by the commits missed
    (a label found at the wrong version). commit_history brings the table up to date."""
    path = tmp_path / "t"
    for version in range(3):
        _labelled(path, f"c{version}", first=version == 0)
    stale = DeltaTable(str(path))
    for version in (3, 4):
        _labelled(path, f"c{version}")
    raw = {c["userMetadata"]: c["version"] for c in stale.history(10)}
    assert raw["c4"] == 2, raw  # what delta-rs itself says: two short
    stale = DeltaTable(str(path), version=2)
    got = {c["userMetadata"]: c["version"] for c in commit_history(stale, 10)}
    assert got == {f"c{v}": v for v in range(5)}
    assert stale.version() == 4
    assert [c["userMetadata"] for c in commit_history(DeltaTable(str(path)), 2)] == ["c4", "c3"]
    # The newest two at the loaded version and every commit since: a label committed just
    # after the load (a fence) is not pushed out of the window by the commits after it.
    since = commit_history(DeltaTable(str(path), version=2), 2)
    assert [c["userMetadata"] for c in since] == ["c4", "c3", "c2", "c1"]
    after = commit_history(DeltaTable(str(path), version=1), after=2)
    assert [(c["version"], c["userMetadata"]) for c in after] == [(4, "c4"), (3, "c3")]
    assert commit_history(DeltaTable(str(path)), after=4) == []
