"""Attacks on the `rewrite` strategy against the invariants (I1-I6), with real Spark and
real Delta tables.

A rewrite writes a pipeline's whole full transform over its target in ONE overwrite
commit that carries the batch's Delta transaction (``watermark:<pipeline>`` at the
batch's position), every row stamped with ``_wm_seq`` and ``_wm_batch_id``. Each test
below drives a sequence that could break that: replays and backfills of older batches
around a rewrite, forced ``set``/``reset`` fencing a planned or applied rewrite, a run
dying right after the rewrite's commit (``simulate_crash_at``), writers committing to the
target while the rewrite's write job runs, and the edges (an empty output, a vacuumed
target or upstream snapshot, a schema change, NULL and duplicate keys). Every check reads
the target itself: its rows, their ``_wm_seq``, its Delta history and transactions, and the
checkpoints.

Writers racing a rewrite are released from inside the rewrite's own write job: a Python
UDF in the full transform (deterministic, so the plan checks pass) blocks its first row
until the racing writer, run from a thread of this process through another Spark session
(or the store and delta-rs), has committed.
"""

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from delta.tables import DeltaTable
from deltalake import DeltaTable as RsDeltaTable
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from watermark_dagster.config.batch_context import BatchContext
from watermark_dagster.config.pipeline import pipeline, sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.faults import SimulatedCrash, simulate_crash_at
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.core.records import Batch, BatchStatus, CheckpointStatus
from watermark_dagster.errors import (
    BatchStateError,
    ReplayRefusedError,
    RetryableError,
    TerminalError,
    UpstreamSchemaChangedError,
    UpstreamUnreadableError,
)
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations import manual, replay
from watermark_dagster.operations import run_pipeline as run_pipeline_module
from watermark_dagster.operations.coordinate import finalize_batch, look_before_planning, plan_next
from watermark_dagster.operations.decide import decide_pipeline
from watermark_dagster.operations.run_pipeline import (
    execute_pipeline,
    run_pipeline,
)
from watermark_dagster.store import WatermarkStore
from watermark_dagster.write import commits, duplicate_keys, targets
from watermark_dagster.write.commits import FENCE, label_prefix, parse_label

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

CDF = {"delta.enableChangeDataFeed": "true"}
COPY_SQL = "SELECT id, value FROM up"
WAIT_SECONDS = 180  # a gate never reached fails the test instead of hanging it


# ------------------------------------------------------------------ lake and pipelines


@dataclass
class Lake:
    """One upstream ``up`` (id, value; change data feed on), targets and control tables."""

    root: Path

    @property
    def up(self) -> str:
        return str(self.root / "up")

    @property
    def control(self) -> str:
        return str(self.root / "control")

    def target(self, name: str) -> str:
        return str(self.root / name)

    def store(self) -> WatermarkStore:
        return WatermarkStore(self.control)

    def latest(self) -> int:
        return RsDeltaTable(self.up).version()


def _rows(ids: list[int | None], values: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "value": pa.array(values, pa.int64())})


def _seed(root: Path, ids: list[int | None] | None = None) -> Lake:
    """Version 0 of ``up``: ids 0..5 (or ``ids``), value 10 * id (0 for a NULL id)."""
    lake = Lake(root)
    chosen = list(range(6)) if ids is None else ids
    write_deltalake(lake.up, _rows(chosen, [10 * (i or 0) for i in chosen]), configuration=CDF)
    return lake


def _update(lake: Lake, predicate: str, value: str) -> None:
    RsDeltaTable(lake.up).update(predicate=predicate, updates={"value": value})


def _delete(lake: Lake, predicate: str) -> None:
    RsDeltaTable(lake.up).delete(predicate)


def _append(lake: Lake, ids: list[int | None], values: list[int]) -> None:
    write_deltalake(lake.up, _rows(ids, values), mode="append")


def _copied(lake: Lake, strategy: str, name: str = "copied") -> Registry:
    """A declared copy of ``up`` keyed on ``id``, with ``strategy``; one registry per
    strategy over the same target (an operator changing the configuration between
    batches)."""
    copy = sql_pipeline(
        name=name,
        sql=COPY_SQL,
        upstreams={"up": "id"},
        target=lake.target(name),
        keys=["id"],
        strategy=strategy,  # type: ignore[arg-type]
    )
    return Registry(upstreams=[DeltaUpstream(name="up", path=lake.up)], pipelines=[copy])


def _gate_udf(gate: str):
    """The identity on ``value``, except that while ``gate/armed`` exists its first call
    (over every task and attempt) creates ``gate/started`` and waits for ``gate/release``:
    it holds the write job that evaluates it, inside Delta's transaction, until a racing
    writer has committed. A closure, so Spark's Python workers need not import this file."""

    def passthrough(value: Any) -> Any:
        if os.path.exists(os.path.join(gate, "armed")):
            try:
                os.close(os.open(os.path.join(gate, "started"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return value
            deadline = time.monotonic() + 170
            while not os.path.exists(os.path.join(gate, "release")):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        return value

    # Row by row (pickled), not Arrow: Spark 4.2's Arrow UDF over Delta's columnar scan
    # hung in this job's shuffle map stage (both sides waiting to read).
    return F.udf(passthrough, "long", useArrow=False)


def _gated(lake: Lake, gate: Path) -> Registry:
    """A hand-written copy of ``up`` with a full transform holding the gate, and
    ``strategy='rewrite'``: its first load runs the hand-written transform (no gate), every
    later batch rewrites through the gate."""
    hold = _gate_udf(str(gate))

    def full(up: DataFrame) -> DataFrame:
        return up.select("id", hold(F.col("value")).alias("value"))

    @pipeline(
        upstreams=["up"],
        target=lake.target("gated"),
        keys=["id"],
        name="gated",
        full_transform=full,
        strategy="rewrite",
    )
    def gated(batch: BatchContext) -> DataFrame:
        return batch["up"].net_changes(["id"]).drop("_commit_timestamp")

    return Registry(upstreams=[DeltaUpstream(name="up", path=lake.up)], pipelines=[gated])


# ------------------------------------------------------------------ running batches


def _plan(registry: Registry, store: WatermarkStore) -> Batch:
    look = look_before_planning(registry, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None
    return batch


def _run(spark: SparkSession, registry: Registry, store: WatermarkStore, batch_id: str, name: str):
    return execute_pipeline(
        spark=spark,
        store=store,
        registry=registry,
        pipeline_name=name,
        batch_id=batch_id,
        run_id="test",
    )


def _finalize(registry: Registry, store: WatermarkStore, batch_id: str) -> None:
    finalize_batch(store, store.get_batch(batch_id), registry=registry, actor="test")


def _cycle(spark: SparkSession, registry: Registry, store: WatermarkStore) -> Batch:
    """Plan, run every pipeline of the batch, finalize; the batch as it ended."""
    batch = _plan(registry, store)
    for name in batch.pipelines:
        _run(spark, registry, store, batch.batch_id, name)
    _finalize(registry, store, batch.batch_id)
    ended = store.get_batch(batch.batch_id)
    assert ended.status is BatchStatus.COMPLETED, ended
    return ended


def _executor(spark: SparkSession, registry: Registry, store: WatermarkStore):
    def execute(batch_id: str, pipelines: Any) -> list[str | None]:
        errors: list[str | None] = []
        for name in pipelines:
            try:
                _run(spark, registry, store, batch_id, name)
            except Exception as e:  # the replay records it as FAILED
                errors.append(str(e))
        return errors

    return execute


def _replay(
    spark: SparkSession, registry: Registry, store: WatermarkStore, first: int, last: int
) -> replay.ReplayResult:
    plan = replay.plan_replay(store, registry, "up", VersionRange(first, last))
    return replay.run_replay(store, registry, plan, execute=_executor(spark, registry, store))


def _backfill(spark: SparkSession, registry: Registry, store: WatermarkStore, of: str) -> Batch:
    """What a backfill of batch ``of``'s partition runs: a REPLAY of its ranges."""
    name = next(iter(registry.pipelines))
    plan = replay.plan_backfill_replay(store, registry, store.get_batch(of), name)
    again = replay.start_backfill_replay(store, registry, plan, actor="test")
    _run(spark, registry, store, again.batch_id, name)
    store.set_batch_status(again.batch_id, BatchStatus.COMPLETED, actor="test")
    return store.get_batch(again.batch_id)


# ------------------------------------------------------------------ reading the lake


def _upstream_at(lake: Lake, version: int) -> dict[int | None, int]:
    table = RsDeltaTable(lake.up, version=version).to_pyarrow_table(columns=["id", "value"])
    return dict(zip(table["id"].to_pylist(), table["value"].to_pylist(), strict=True))


def _target(spark: SparkSession, path: str) -> dict[int | None, tuple[int, int, str]]:
    """``id -> (value, _wm_seq, _wm_batch_id)``; fails on a key held twice."""
    rows = spark.read.format("delta").load(path).select("id", "value", "_wm_seq", "_wm_batch_id")
    found = [tuple(r) for r in rows.collect()]
    held = Counter(r[0] for r in found)
    assert all(n == 1 for n in held.values()), f"keys held twice: {held}"
    return {r[0]: (r[1], r[2], r[3]) for r in found}


def _assert_exact(spark: SparkSession, lake: Lake, name: str) -> None:
    """The target equals a full recompute at the committed version (for these copies of
    ``up``, its snapshot there, read with delta-rs), each key once (I4)."""
    committed = lake.store().committed_versions()["up"]
    assert committed is not None
    expected = _upstream_at(lake, committed)
    got = {k: v[0] for k, v in _target(spark, lake.target(name)).items()}
    assert got == expected, (committed, got, expected)


def _seqs(spark: SparkSession, path: str) -> dict[int | None, int]:
    return {k: v[1] for k, v in _target(spark, path).items()}


def _assert_no_regression(before: dict[Any, int], after: dict[Any, int]) -> None:
    """I5: no key's ``_wm_seq`` went down."""
    regressed = {
        k: (before[k], after[k]) for k in before.keys() & after.keys() if after[k] < before[k]
    }
    assert not regressed, regressed


def _history(path: str) -> list[dict[str, Any]]:
    """The target's commits, oldest first."""
    return sorted((dict(c) for c in RsDeltaTable(path).history()), key=lambda c: c["version"])


def _data_commits(path: str, name: str, batch_id: str) -> list[dict[str, Any]]:
    """The commits labelled as ``name``'s write of ``batch_id`` (fences and preparatory
    commits carry other labels)."""
    prefix = label_prefix(name, batch_id)
    return [c for c in _history(path) if str(c.get("userMetadata") or "").startswith(prefix)]


def _fences(path: str, name: str, batch_id: str) -> list[dict[str, Any]]:
    prefix = FENCE + label_prefix(name, batch_id)
    return [c for c in _history(path) if str(c.get("userMetadata") or "").startswith(prefix)]


def _assert_rewrite_commit(path: str, name: str, batch: Batch) -> dict[str, Any]:
    """The batch's one data commit is an overwrite carrying its transaction."""
    [commit] = _data_commits(path, name, batch.batch_id)
    assert commit["operation"] == "WRITE", commit
    assert commit["operationParameters"]["mode"] == "Overwrite", commit
    # The transaction names the control root the commit's label names.
    written = parse_label(commit)
    assert written is not None, commit
    assert written.root is not None, commit
    app_id = f"watermark:{written.root}:{name}"
    assert RsDeltaTable(path).transaction_version(app_id) >= batch.write_seq
    return commit


def _checkpoint_states(store: WatermarkStore, batch_id: str, name: str) -> list[CheckpointStatus]:
    found = store.checkpoints(batch_id=batch_id, pipeline=name)
    return [c.status for c in sorted(found, key=lambda c: c.attempt)]


# ------------------------------------------------------------------ 1. replays around rewrites


def test_replays_and_a_backfill_of_older_batches_after_a_rewrite_regress_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """b2 rewrites the target (every row at position 2); b3 is incremental (an operator
    switched the strategy) and moves id 0 and deletes id 4, so ids it did not touch keep
    position 2. Then, with b3 applied: a replay of b2's whole range (written at b2's own
    position, the guard's equality lets it rewrite the untouched rows) and a backfill of
    b2's partition. Neither may bring back b2's value of id 0 (100), re-insert id 4 or id
    3, or lower a ``_wm_seq``; the target equals a recompute at the committed version.
    Then b4 rewrites over what the replays wrote: one overwrite, every row at b4's
    position."""
    lake = _seed(tmp_path)
    rewrite, incremental = _copied(lake, "rewrite"), _copied(lake, "incremental")
    store = lake.store()
    _cycle(spark, rewrite, store)  # b1: the first load of v0
    _update(lake, "id < 2", "value + 100")  # v1
    _delete(lake, "id = 3")  # v2
    _append(lake, [6, 7], [60, 70])  # v3
    b2 = _cycle(spark, rewrite, store)
    assert str(b2.inputs["up"].range) == str(VersionRange(1, 3))
    assert [str(r.strategy) for r in store.strategy_runs("copied")] == ["rewrite"]
    _assert_rewrite_commit(lake.target("copied"), "copied", b2)
    assert set(_seqs(spark, lake.target("copied")).values()) == {b2.write_seq}

    _update(lake, "id = 0", "500")  # v4
    _delete(lake, "id = 4")  # v5
    b3 = _cycle(spark, incremental, store)
    seqs = _seqs(spark, lake.target("copied"))
    assert seqs[0] == b3.write_seq
    assert 4 not in seqs
    assert seqs[1] == b2.write_seq  # untouched by b3: still the rewrite's position
    _assert_exact(spark, lake, "copied")

    whole = _replay(spark, incremental, store, 1, 3)
    assert whole.status is BatchStatus.COMPLETED, whole.error
    assert whole.batch.write_seq == b2.write_seq
    # At b2's own position the guard lets it rewrite the rows b3 left (ids 1, 6, 7).
    [wrote] = _data_commits(lake.target("copied"), "copied", whole.batch.batch_id)
    assert int(wrote["operationMetrics"]["numTargetRowsUpdated"]) == 3, wrote
    backfill = _backfill(spark, incremental, store, b2.batch_id)
    assert backfill.write_seq == b2.write_seq
    after = _seqs(spark, lake.target("copied"))
    _assert_no_regression(seqs, after)
    assert after == seqs  # each row's position is what the newest write of it gave
    target = _target(spark, lake.target("copied"))
    assert target[0][0] == 500
    assert 3 not in target
    assert 4 not in target
    _assert_exact(spark, lake, "copied")
    # Nothing a replay wrote was an insert or a delete.
    for commit in _history(lake.target("copied")):
        if commit["operation"] == "MERGE" and b3.batch_id not in str(commit.get("userMetadata")):
            metrics = commit["operationMetrics"]
            assert int(metrics["numTargetRowsInserted"]) == 0, commit
            assert int(metrics["numTargetRowsDeleted"]) == 0, commit

    # The reverse order: a rewrite over what the replays wrote.
    _update(lake, "id = 6", "666")  # v6
    b4 = _cycle(spark, rewrite, store)
    assert _assert_rewrite_commit(lake.target("copied"), "copied", b4)["version"] > wrote["version"]
    final = _target(spark, lake.target("copied"))
    assert {(s, b) for _, s, b in final.values()} == {(b4.write_seq, b4.batch_id)}
    _assert_exact(spark, lake, "copied")


# ------------------------------------------------------------------ 2. forced changes


@contextlib.contextmanager
def _past_its_check() -> Iterator[None]:
    """A run that re-read its batch just before the abandon: its own check passes (the
    race the fence closes; as tests/model/harness.py injects it)."""
    checked = run_pipeline_module._refuse_abandoned  # pyright: ignore[reportPrivateUsage]
    run_pipeline_module._refuse_abandoned = lambda *_a, **_k: None  # pyright: ignore[reportPrivateUsage]
    try:
        yield
    finally:
        run_pipeline_module._refuse_abandoned = checked  # pyright: ignore[reportPrivateUsage]


def _force_set(
    spark: SparkSession, registry: Registry, store: WatermarkStore, version: int | None
) -> manual.ChangeResult:
    """`watermark set -t up --version V --force` (or `reset --force` for None)."""
    preview = manual.preview_change(store, registry, "up", version, force=True, actor="op")
    assert preview.changed
    fencing = manual.Fencing(stop_runs=lambda _batch: (), spark=lambda: spark)
    return manual.apply_change(store, registry, preview, reason="test", force=True, fencing=fencing)


def _two_version_seed(root: Path) -> Lake:
    """v0 and v1 before the first load, so that a forced set can go back to v0."""
    lake = _seed(root)
    _update(lake, "id = 5", "55")
    return lake


def test_a_rewrite_that_passed_its_check_lands_nothing_after_a_forced_set(
    spark: SparkSession, tmp_path: Path
) -> None:
    """b2 (a rewrite) is planned and its run has decided to write when `watermark set -t
    up --version 0 --force` abandons it: the target is fenced (an empty commit recording
    b2's transaction). The run's rewrite, past its own check, is refused naming the fence
    and commits nothing; its checkpoint is FAILED. The next batch re-reads v1.. under a new
    position and rewrites: the target is exact, every row at b3's position."""
    lake = _two_version_seed(tmp_path)
    registry = _copied(lake, "rewrite")
    store = lake.store()
    _cycle(spark, registry, store)  # b1: v0..v1
    _update(lake, "id = 0", "1000")  # v2
    _append(lake, [9], [90])  # v3
    b2 = _plan(registry, store)
    decision = decide_pipeline(
        store=store, registry=registry, pipeline_name="copied", batch_id=b2.batch_id
    )
    assert decision.skip is None
    forced = _force_set(spark, registry, store, 0)
    assert forced.fenced == ("copied",), forced
    assert store.get_batch(b2.batch_id).status is BatchStatus.ABANDONED
    [fence] = _fences(lake.target("copied"), "copied", b2.batch_id)
    before = RsDeltaTable(lake.target("copied")).version()
    assert before == fence["version"]
    with pytest.raises(BatchStateError, match="fenced against it"), _past_its_check():
        run_pipeline(spark=spark, store=store, registry=registry, decision=decision)
    assert RsDeltaTable(lake.target("copied")).version() == before
    assert _data_commits(lake.target("copied"), "copied", b2.batch_id) == []
    assert _checkpoint_states(store, b2.batch_id, "copied") == [CheckpointStatus.FAILED]

    b3 = _cycle(spark, registry, store)
    assert str(b3.inputs["up"].range) == str(VersionRange(1, 3))
    assert "copied" not in b3.full_load  # nothing of b2 landed: no reload owed
    _assert_rewrite_commit(lake.target("copied"), "copied", b3)
    assert set(_seqs(spark, lake.target("copied")).values()) == {b3.write_seq}
    _assert_exact(spark, lake, "copied")


def test_a_forced_set_after_a_rewrite_landed_recovers_it_and_the_reload_is_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    """b2's rewrite commits and its run dies before the checkpoint (a crash at
    ``after_target_commit``). `watermark set -t up --version 0 --force` then abandons b2:
    the target's own record (b2's labelled overwrite) recovers the run as succeeded, no
    fence is committed (the write won), and since the target holds b2's rows, which the
    watermark (v0) no longer covers, the next batch reloads it. A late retry of b2's run
    is refused (the batch is abandoned). The target is exact, every row at b3's position."""
    lake = _two_version_seed(tmp_path)
    registry = _copied(lake, "rewrite")
    store = lake.store()
    _cycle(spark, registry, store)
    _update(lake, "id = 0", "1000")  # v2
    _delete(lake, "id = 2")  # v3
    b2 = _plan(registry, store)
    with pytest.raises(SimulatedCrash), simulate_crash_at("after_target_commit"):
        _run(spark, registry, store, b2.batch_id, "copied")
    _assert_rewrite_commit(lake.target("copied"), "copied", b2)
    forced = _force_set(spark, registry, store, 0)
    assert forced.recovered == ("copied",), forced
    assert forced.fenced == ()
    assert _fences(lake.target("copied"), "copied", b2.batch_id) == []
    assert "copied" in forced.reloads, forced
    recovered = [
        h for h in store.history(batch_id=b2.batch_id) if h["event"] == "PIPELINE_RECOVERED"
    ]
    assert [h["pipeline"] for h in recovered] == ["copied"]
    with pytest.raises(BatchStateError, match="abandoned"):
        _run(spark, registry, store, b2.batch_id, "copied")

    b3 = _cycle(spark, registry, store)
    assert "copied" in b3.full_load
    assert len(_data_commits(lake.target("copied"), "copied", b2.batch_id)) == 1  # still one
    target = _target(spark, lake.target("copied"))
    assert {(s, b) for _, s, b in target.values()} == {(b3.write_seq, b3.batch_id)}
    _assert_exact(spark, lake, "copied")


# ------------------------------------------------------------------ 3. a crash after the commit


def test_a_rewrite_killed_after_its_commit_is_applied_once_then_replays_change_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The run dies right after the rewrite's commit (``after_target_commit``, the
    in-process stand-in for a SIGKILL): the checkpoint stays RUNNING. The target is then
    vacuumed (the first load's files are deleted). The retry finds the batch's transaction
    in the target and commits nothing; the batch finalizes. The retry measured nothing,
    so `auto` has no run to weigh from it, but it records the rewrite its batch's commit
    shows. A replay of the batch's whole range runs and changes no row; so does a replay
    ending inside it, allowed as after any rewrite (every row carries the batch's
    position: the replay, written just below it, is guarded out)."""
    lake = _seed(tmp_path)
    registry = _copied(lake, "rewrite")
    store = lake.store()
    _cycle(spark, registry, store)
    _update(lake, "id < 3", "value + 1")  # v1
    _delete(lake, "id = 4")  # v2
    b2 = _plan(registry, store)
    with pytest.raises(SimulatedCrash), simulate_crash_at("after_target_commit"):
        _run(spark, registry, store, b2.batch_id, "copied")
    assert _checkpoint_states(store, b2.batch_id, "copied") == [CheckpointStatus.RUNNING]
    commit = _assert_rewrite_commit(lake.target("copied"), "copied", b2)
    files = len(list(Path(lake.target("copied")).glob("*.parquet")))
    vacuuming = spark.newSession()  # delta-rs cannot vacuum a clustered table
    vacuuming.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    # VACUUM lists the table in as many tasks as this says (10,000 by default: 40 s here).
    vacuuming.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "2")
    vacuumed = vacuuming.sql(f"VACUUM delta.`{lake.target('copied')}` RETAIN 0 HOURS")
    assert vacuumed.collect()
    assert len(list(Path(lake.target("copied")).glob("*.parquet"))) < files
    vacuumed_at = RsDeltaTable(lake.target("copied")).version()  # VACUUM START/END commits

    retry = _run(spark, registry, store, b2.batch_id, "copied")
    assert retry.write is not None
    assert retry.write.already_applied
    assert RsDeltaTable(lake.target("copied")).version() == vacuumed_at
    assert [c["version"] for c in _data_commits(lake.target("copied"), "copied", b2.batch_id)] == [
        commit["version"]
    ]
    assert _checkpoint_states(store, b2.batch_id, "copied") == [
        CheckpointStatus.RUNNING,
        CheckpointStatus.SUCCESS,
    ]
    _finalize(registry, store, b2.batch_id)
    assert store.get_batch(b2.batch_id).status is BatchStatus.COMPLETED
    _assert_exact(spark, lake, "copied")
    stamped = _target(spark, lake.target("copied"))
    assert {(s, b) for _, s, b in stamped.values()} == {(b2.write_seq, b2.batch_id)}

    whole = _replay(spark, registry, store, 1, 2)
    assert whole.status is BatchStatus.COMPLETED, whole.error
    replayed = _target(spark, lake.target("copied"))  # values and positions as they were
    assert {k: v[:2] for k, v in replayed.items()} == {k: v[:2] for k, v in stamped.items()}
    assert store.strategy_runs("copied") == []  # nothing measured: a first load, a retry
    inside = _replay(spark, registry, store, 1, 1)
    assert inside.status is BatchStatus.COMPLETED, inside.error
    after = _target(spark, lake.target("copied"))
    assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in stamped.items()}


# ------------------------------------------------------------------ 4. racing writers


@dataclass
class Race:
    """What a writer racing the rewrite did (set by its thread)."""

    done: bool = False
    result: Any = None
    error: BaseException | None = None


@contextlib.contextmanager
def _racing(gate: Path, action: Callable[[], Any]) -> Iterator[Race]:
    """Arm the gate; once the rewrite's write job holds on it, run ``action`` (the racing
    writer) in a thread, then release the job."""
    race = Race()
    finished = threading.Event()

    def run() -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while not (gate / "started").exists():
            if finished.is_set() or time.monotonic() > deadline:
                (gate / "release").touch()
                return
            time.sleep(0.05)
        try:
            race.result = action()
        except BaseException as e:  # reported by the test
            race.error = e
        finally:
            race.done = True
            (gate / "release").touch()

    gate.mkdir(exist_ok=True)
    (gate / "armed").touch()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield race
    finally:
        finished.set()
        thread.join(WAIT_SECONDS)
        (gate / "armed").unlink(missing_ok=True)


RACERS = ("foreign_delete_then_give_up", "same_batch", "older_replay", "fence")


@pytest.mark.parametrize("racer", RACERS)
def test_a_writer_committing_during_the_rewrite_never_leaves_half_a_batch(
    spark: SparkSession, tmp_path: Path, racer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer commits to the target while b2's rewrite job runs, inside its transaction.

    * ``foreign_delete_then_give_up``: a DELETE from another session, with one attempt
      allowed: the rewrite loses the commit race, fails retryably, commits nothing and
      records FAILED (the foreign delete stands); the retry lands once and overwrites it.
    * ``same_batch``: a second run of b2 (another session) rewrites first. The first run
      loses, finds b2's transaction and commits nothing: one data commit for b2, two
      SUCCESS checkpoints.
    * ``older_replay``: a replay of b1's range (a version-guarded MERGE at b1's position)
      commits first; the rewrite is decided again and stamps every row with b2's position.
    * ``fence``: `watermark set -t up --version 0 --force` abandons b2 and fences the
      target; the rewrite's commit fails (Delta's concurrent transaction), is reported as
      fenced, and never lands; the next batch is exact.

    In every case the target is exact and no checkpoint says SUCCESS without b2's data in
    the target (its labelled overwrite, or its transaction recorded by that overwrite)."""
    lake = _two_version_seed(tmp_path)
    gate = tmp_path / "gate"
    registry = _gated(lake, gate)
    store = lake.store()
    target = lake.target("gated")
    b1 = _cycle(spark, registry, store)  # v0..v1, hand-written first load (no gate)
    _update(lake, "id = 0", "1000")  # v2
    _append(lake, [6], [60])  # v3
    b2 = _plan(registry, store)
    other = spark.newSession()

    def act() -> Any:
        if racer.startswith("foreign_delete"):
            DeltaTable.forPath(other, target).delete("id = 2")
            return None
        if racer == "same_batch":
            return _run(other, registry, WatermarkStore(lake.control), b2.batch_id, "gated")
        if racer == "older_replay":
            return _replay(other, registry, WatermarkStore(lake.control), 0, 1)
        assert racer == "fence"
        return _force_set(other, registry, WatermarkStore(lake.control), 0)

    if racer == "foreign_delete_then_give_up":
        monkeypatch.setattr(targets, "CONFLICT_ATTEMPTS", 1)
    outcome, error = None, None
    with _racing(gate, act) as race:
        try:
            outcome = _run(spark, registry, store, b2.batch_id, "gated")
        except Exception as e:  # judged below, per racer
            error = e
    assert race.done, "the rewrite's job never reached the gate"
    assert race.error is None, race.error
    history = _history(target)
    ours = _data_commits(target, "gated", b2.batch_id)
    states = _checkpoint_states(store, b2.batch_id, "gated")

    if racer == "fence":
        assert isinstance(error, BatchStateError), error
        assert "fenced against it" in str(error), error
        assert ours == []  # b2's rewrite never landed
        assert len(_fences(target, "gated", b2.batch_id)) == 1
        assert states == [CheckpointStatus.FAILED]
        assert store.get_batch(b2.batch_id).status is BatchStatus.ABANDONED
        b3 = _cycle(spark, registry, store)
        assert str(b3.inputs["up"].range) == str(VersionRange(1, 3))
        assert set(_seqs(spark, target).values()) == {b3.write_seq}
        _assert_exact(spark, lake, "gated")
        return

    if racer == "foreign_delete_then_give_up":
        assert isinstance(error, RetryableError), error
        assert "lost 1 commit races" in str(error)
        assert ours == []
        assert states == [CheckpointStatus.FAILED]
        assert 2 not in _target(spark, target)  # the foreign delete stands, nothing else
        monkeypatch.setattr(targets, "CONFLICT_ATTEMPTS", 6)
        outcome, error = _run(spark, registry, store, b2.batch_id, "gated"), None
        ours = _data_commits(target, "gated", b2.batch_id)
        states = _checkpoint_states(store, b2.batch_id, "gated")
        assert states == [CheckpointStatus.FAILED, CheckpointStatus.SUCCESS]

    assert error is None, error
    assert outcome is not None
    assert outcome.write is not None
    [commit] = ours  # exactly one data commit for b2, whichever run made it
    assert commit["operation"] == "WRITE"
    assert commit["operationParameters"]["mode"] == "Overwrite"
    if racer == "foreign_delete_then_give_up":
        [foreign] = [c for c in history if c["operation"] == "DELETE"]
        assert foreign["version"] < commit["version"]
    elif racer == "same_batch":
        assert outcome.write.already_applied, outcome.write
        assert outcome.write.conflicts >= 1, outcome.write
        assert race.result.write is not None
        assert race.result.write.committed
        assert states == [CheckpointStatus.SUCCESS, CheckpointStatus.SUCCESS]
    elif racer == "older_replay":
        assert race.result.status is BatchStatus.COMPLETED, race.result.error
        assert race.result.batch.write_seq == b1.write_seq
        [merged] = _data_commits(target, "gated", race.result.batch.batch_id)
        assert merged["version"] < commit["version"]
        assert outcome.write.conflicts >= 1, outcome.write
        assert states == [CheckpointStatus.SUCCESS]
    _finalize(registry, store, b2.batch_id)
    rows = _target(spark, target)
    assert {(s, b) for _, s, b in rows.values()} == {(b2.write_seq, b2.batch_id)}
    _assert_exact(spark, lake, "gated")


# ------------------------------------------------------------------ 5. edges


def test_an_empty_rewrite_empties_the_target_in_one_commit_and_replays_insert_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Every upstream row deleted: the rewrite's output is empty. It still commits (one
    overwrite carrying b2's transaction) and the target is empty; a retry commits nothing;
    a replay of b1's range re-inserts nothing (a replay never inserts a key the target
    lacks); new rows then come back through the next rewrite."""
    lake = _seed(tmp_path)
    registry = _copied(lake, "rewrite")
    store = lake.store()
    _cycle(spark, registry, store)
    _delete(lake, "id >= 0")  # v1: nothing left
    b2 = _cycle(spark, registry, store)
    commit = _assert_rewrite_commit(lake.target("copied"), "copied", b2)
    assert _target(spark, lake.target("copied")) == {}
    metrics = commit["operationMetrics"]
    assert int(metrics.get("numOutputRows", 0)) == 0, metrics
    assert int(metrics["numRemovedFiles"]) >= 1, metrics
    again = _run(spark, registry, store, b2.batch_id, "copied")  # a backfill after success
    assert again.skip is not None
    assert again.skip.value == "already_applied"
    # A replay of b1's range (v0's inserts, at b1's position) inserts no key the target lacks.
    replayed = _replay(spark, registry, store, 0, 0)
    assert replayed.status is BatchStatus.COMPLETED, replayed.error
    assert _target(spark, lake.target("copied")) == {}
    _append(lake, [1, 2], [11, 22])  # v2
    b3 = _cycle(spark, registry, store)
    _assert_rewrite_commit(lake.target("copied"), "copied", b3)
    _assert_exact(spark, lake, "copied")


def _vacuum_upstream(lake: Lake) -> list[str]:
    return RsDeltaTable(lake.up).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )


def test_a_rewrite_whose_snapshot_was_vacuumed_fails_naming_the_upstream(
    spark: SparkSession, tmp_path: Path
) -> None:
    """b2 pins ``up`` v1..v1; before it runs, v2 rewrites every file and a VACUUM (0 hours)
    deletes v1's files and change files. The same batch run incrementally fails with
    UpstreamUnreadableError naming ``up``, the range and the reset command (I6); the
    rewrite must fail the same way, with nothing written."""
    lake = _seed(tmp_path)
    rewrite = _copied(lake, "rewrite")
    store = lake.store()
    _cycle(spark, rewrite, store)
    _update(lake, "id = 0", "100")  # v1
    b2 = _plan(rewrite, store)
    _update(lake, "id >= 0", "value + 1")  # v2: every file rewritten
    assert _vacuum_upstream(lake)
    version = RsDeltaTable(lake.target("copied")).version()
    with pytest.raises(UpstreamUnreadableError, match=r"Upstream 'up'") as incremental:
        _run(spark, _copied(lake, "incremental"), store, b2.batch_id, "copied")
    assert "watermark reset -t up" in (incremental.value.fix or "")
    assert RsDeltaTable(lake.target("copied")).version() == version
    with pytest.raises(UpstreamUnreadableError, match=r"Upstream 'up'") as rewritten:
        _run(spark, rewrite, store, b2.batch_id, "copied")
    assert "watermark reset -t up" in (rewritten.value.fix or "")
    assert RsDeltaTable(lake.target("copied")).version() == version


def test_schema_changes_of_the_upstream_around_a_rewrite(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An added nullable column (compatible) reaches the target through the rewrite, every
    row stamped; a replay of the range before it then changes nothing. A column retyped
    (incompatible) fails the next batch before anything is written, naming the upstream
    and the reset command (I6), rewrite or not."""
    lake = _seed(tmp_path)
    star = sql_pipeline(
        name="star",
        sql="SELECT * FROM up",
        upstreams={"up": "id"},
        target=lake.target("star"),
        keys=["id"],
        strategy="rewrite",
    )
    registry = Registry(upstreams=[DeltaUpstream(name="up", path=lake.up)], pipelines=[star])
    store = lake.store()
    _cycle(spark, registry, store)
    _update(lake, "id = 1", "111")  # v1
    _cycle(spark, registry, store)  # b2
    wider = pa.table(
        {
            "id": pa.array([7], pa.int64()),
            "value": pa.array([70], pa.int64()),
            "note": pa.array(["new"], pa.string()),
        }
    )
    write_deltalake(lake.up, wider, mode="append", schema_mode="merge")  # v2
    b3 = _cycle(spark, registry, store)
    _assert_rewrite_commit(lake.target("star"), "star", b3)
    rows = spark.read.format("delta").load(lake.target("star"))
    assert "note" in rows.columns
    got = {(r["id"], r["value"], r["note"], r["_wm_seq"]) for r in rows.collect()}
    assert (7, 70, "new", b3.write_seq) in got
    assert {s for *_, s in got} == {b3.write_seq}
    assert {(i, v) for i, v, *_ in got} == set(_upstream_at(lake, 2).items())
    before = _target(spark, lake.target("star"))
    assert _replay(spark, registry, store, 1, 1).status is BatchStatus.COMPLETED
    assert _target(spark, lake.target("star")) == before

    retyped = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "value": pa.array(["a", "b"], pa.string()),
            "note": pa.array([None, None], pa.string()),
        }
    )
    write_deltalake(lake.up, retyped, mode="overwrite", schema_mode="overwrite")  # v3
    version = RsDeltaTable(lake.target("star")).version()
    b4 = _plan(registry, store)
    with pytest.raises(UpstreamSchemaChangedError, match="'value' changed type") as e:
        _run(spark, registry, store, b4.batch_id, "star")
    assert "watermark reset -t up" in (e.value.fix or "")
    assert RsDeltaTable(lake.target("star")).version() == version


def test_null_and_duplicate_keys_through_rewrites_and_merges(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A NULL id is a key like any other: the rewrite writes it once, an incremental MERGE
    then updates that row (never a second NULL row), and a second NULL id upstream is a
    duplicate key the rewrite refuses with nothing committed."""
    lake = _seed(tmp_path, ids=[None, 1, 2])
    rewrite, incremental = _copied(lake, "rewrite"), _copied(lake, "incremental")
    store = lake.store()
    _cycle(spark, rewrite, store)
    _update(lake, "id IS NULL", "7")  # v1
    b2 = _cycle(spark, rewrite, store)
    _assert_rewrite_commit(lake.target("copied"), "copied", b2)
    assert _target(spark, lake.target("copied"))[None] == (7, b2.write_seq, b2.batch_id)
    _update(lake, "id IS NULL", "8")  # v2
    b3 = _cycle(spark, incremental, store)
    assert _target(spark, lake.target("copied"))[None] == (8, b3.write_seq, b3.batch_id)
    _assert_exact(spark, lake, "copied")

    _append(lake, [None], [9])  # v3: a second row of the NULL key
    version = RsDeltaTable(lake.target("copied")).version()
    b4 = _plan(rewrite, store)
    with pytest.raises(TerminalError, match=r"several rows for key"):
        _run(spark, rewrite, store, b4.batch_id, "copied")
    assert RsDeltaTable(lake.target("copied")).version() == version
    assert _checkpoint_states(store, b4.batch_id, "copied") == [CheckpointStatus.FAILED]


def test_the_rewrites_duplicate_key_refusal_names_a_key_with_a_null_part(
    spark: SparkSession,
) -> None:
    """The check inside a rewrite's write job, on its own: key (1, NULL) held twice. The
    refusal must name that key, not {'a': 1} (another key, which may well exist)."""
    frame = spark.createDataFrame(
        [(1, None, 10), (1, None, 11), (1, 2, 12)], "a long, b long, v long"
    )
    with pytest.raises(Exception, match="watermark-duplicate-key") as failed:
        duplicate_keys.refusing_duplicate_keys(frame, ["a", "b"]).collect()
    assert duplicate_keys.duplicate_key_in(failed.value) == {"a": 1, "b": None}


def test_a_merge_retried_after_more_commits_than_it_reads_is_found_by_its_transaction(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `full` batch dies right after its MERGE commit, then more commits than a retry
    reads (``RECENT_COMMITS``, 100; 5 here, to keep the test short) land on the target
    (table property changes: OPTIMIZE, other writers), so the batch's labelled commit is
    older than those the retry reads. The retry (the operator
    switched the strategy to `incremental` meanwhile) must still find its write, by the
    pipeline's Delta transaction at the batch's position, and report it applied: it must
    not record `incremental` for a batch that `full` wrote, which would let a replay
    ending inside the batch roll keys back (it did, before)."""
    lake = _seed(tmp_path)
    store = lake.store()
    _cycle(spark, _copied(lake, "full"), store)
    _update(lake, "id < 3", "value + 1")  # v1
    _delete(lake, "id = 4")  # v2
    full = _copied(lake, "full")
    b2 = _plan(full, store)
    with pytest.raises(SimulatedCrash), simulate_crash_at("after_target_commit"):
        _run(spark, full, store, b2.batch_id, "copied")
    [commit] = _data_commits(lake.target("copied"), "copied", b2.batch_id)
    monkeypatch.setattr(commits, "RECENT_COMMITS", 5)
    for n in range(6):
        spark.sql(
            f"ALTER TABLE delta.`{lake.target('copied')}` SET TBLPROPERTIES ('probe' = '{n}')"
        )
    before = _seqs(spark, lake.target("copied"))

    retry = _run(spark, _copied(lake, "incremental"), store, b2.batch_id, "copied")
    assert retry.write is not None
    assert retry.write.already_applied, retry.write
    assert [c["version"] for c in _data_commits(lake.target("copied"), "copied", b2.batch_id)] == [
        commit["version"]
    ]
    assert [run.batch_id for run in store.strategy_runs("copied")] == []
    incremental = _copied(lake, "incremental")
    _finalize(incremental, store, b2.batch_id)
    _assert_exact(spark, lake, "copied")
    try:
        inside = _replay(spark, incremental, store, 1, 1)
    except ReplayRefusedError:
        pass  # a retried MERGE records no strategy: a replay inside it stays refused
    else:
        assert inside.status is BatchStatus.COMPLETED, inside.error
    _assert_no_regression(before, _seqs(spark, lake.target("copied")))
    _assert_exact(spark, lake, "copied")
