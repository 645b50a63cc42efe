"""The ``maintain`` strategy: declared aggregates kept from the change rows.

Two declared SQL pipelines over ``customers`` and ``payments`` run ``maintain`` through
every kind of change: inserts, amounts changed and set to NULL, payments moved between
customers and into the NULL customer group, a group emptied and filled again, a batch in
which only the customers change, the target vacuumed. After every batch each target must
equal the same SQL run by Spark over the upstreams' current tables, and the state must
have been brought forward the way its labels promise: rebuilt once, then only the change
rows' groups merged (the MERGE's source rows are counted); a replay of an old range
recomputes from its snapshots and leaves the states alone. A process killed after the
state's commit and before the target's (or after the target's) recovers with nothing lost
or added twice; a floating-point sum is
not maintained (``auto`` runs ``incremental`` and says why; a configured ``maintain`` is
refused with nothing written).
"""

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from tests.conftest import REPO
from tests.support.cycles import cycle_outcomes
from watermark_dagster.config.pipeline import Pipeline, StrategyValue, sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core import strategy as strategy_rule
from watermark_dagster.core.faults import ENV as FAULTS_ENV
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.core.strategy import Strategy
from watermark_dagster.errors import RetryableError, TerminalError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import look_before_planning, plan_next
from watermark_dagster.operations.decide import PipelineOutcome
from watermark_dagster.operations.replay import plan_replay, run_replay
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.read import maintain
from watermark_dagster.read.maintain import state_location
from watermark_dagster.read.state_log import STATE_LABEL
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.spark

CDF = {"delta.enableChangeDataFeed": "true"}
TOTALS_SQL = """
SELECT p.customer_id, COUNT(*) AS payments, COUNT(p.amount) AS priced, SUM(p.amount) AS total,
       AVG(p.amount) AS mean, COUNT_IF(p.amount > 100) AS big, SUM(p.amount) + COUNT(*) AS mixed
FROM payments p
WHERE p.payment_id <> 13
GROUP BY p.customer_id
HAVING COUNT(*) > 1 OR SUM(p.amount) > 50
"""
CUSTOMER_PAYMENTS_SQL = """
SELECT c.customer_id, c.name, COALESCE(t.total, 0) AS total_paid, COALESCE(t.n, 0) AS n
FROM customers c
LEFT JOIN (
  SELECT customer_id, SUM(amount) AS total, COUNT(*) AS n FROM payments GROUP BY customer_id
) t ON t.customer_id = c.customer_id
"""
QUERIES = {"totals": TOTALS_SQL, "customer_payments": CUSTOMER_PAYMENTS_SQL}


def _customers(rows: Sequence[tuple[int, str]]) -> pa.Table:
    return pa.table(
        {
            "customer_id": pa.array([r[0] for r in rows], pa.int64()),
            "name": pa.array([r[1] for r in rows], pa.string()),
        }
    )


def _payments(rows: Sequence[tuple[int, int | None, int | None]]) -> pa.Table:
    return pa.table(
        {
            "payment_id": pa.array([r[0] for r in rows], pa.int64()),
            "customer_id": pa.array([r[1] for r in rows], pa.int64()),
            "amount": pa.array([r[2] for r in rows], pa.int64()),
        }
    )


def _seed(root: Path) -> None:
    write_deltalake(
        str(root / "customers"),
        _customers([(1, "ada"), (2, "bo"), (3, "cy"), (4, "di")]),
        configuration=CDF,
    )
    payments = [(10 + i, 1 + i % 3, 20 * i) for i in range(9)] + [(13, 1, 5), (30, None, 70)]
    write_deltalake(str(root / "payments"), _payments(payments), configuration=CDF)


def registry_at(
    root: Path, strategy: StrategyValue = "maintain", names: Sequence[str] = tuple(QUERIES)
) -> Registry:
    """The maintained pipelines ``names`` over ``root``'s upstreams."""
    pipelines: list[Pipeline] = [
        sql_pipeline(
            name="totals",
            sql=TOTALS_SQL,
            upstreams={"payments": "customer_id"},
            keys=["customer_id"],
            target=str(root / "totals"),
            strategy=strategy,
        ),
        sql_pipeline(
            name="customer_payments",
            sql=CUSTOMER_PAYMENTS_SQL,
            upstreams={"customers": "customer_id", "payments": "customer_id"},
            keys=["customer_id"],
            target=str(root / "customer_payments"),
            strategy=strategy,
        ),
    ]
    upstreams = [DeltaUpstream(name=n, path=str(root / n)) for n in ("customers", "payments")]
    return Registry(upstreams=upstreams, pipelines=[p for p in pipelines if p.name in names])


def cycle(spark: SparkSession, registry: Registry, store: WatermarkStore) -> list[PipelineOutcome]:
    """Plan (or resume) a batch, run its pipelines that have not succeeded, finalize it."""
    return cycle_outcomes(spark, registry, store)[1]


def _rows(spark: SparkSession, frame: Any) -> list[tuple]:
    return sorted((tuple(r) for r in frame.collect()), key=repr)


def check_targets(
    spark: SparkSession, root: Path, step: str, names: Sequence[str] = tuple(QUERIES)
) -> None:
    """Each target of ``names`` equals its SQL run by Spark over the upstreams' current
    tables."""
    for upstream in ("customers", "payments"):
        spark.read.format("delta").load(str(root / upstream)).createOrReplaceTempView(upstream)
    for name, sql in ((n, QUERIES[n]) for n in names):
        want = spark.sql(sql)
        got = spark.read.format("delta").load(str(root / name)).select(*want.columns)
        assert _rows(spark, got) == _rows(spark, want), (step, name)


def _state_history(root: Path, pipeline: str) -> list[dict[str, Any]]:
    """The state table's commits, oldest first."""
    location = state_location(str(root / pipeline), "payments")
    return list(reversed(DeltaTable(location).history()))


def _compacted_and_vacuumed(spark: SparkSession, location: str) -> list[dict[str, Any]]:
    """A user's ``OPTIMIZE`` then ``VACUUM`` of no retention on a state table; its history
    after them, oldest first."""
    spark.sql(f"OPTIMIZE delta.`{location}` ZORDER BY (_wm_g0)")  # rewrites even one file
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    was = spark.conf.get(check, "true")
    spark.conf.set(check, "false")
    try:
        spark.sql(f"VACUUM delta.`{location}` RETAIN 0 HOURS")
    finally:
        spark.conf.set(check, was or "true")
    history = list(reversed(DeltaTable(location).history()))
    assert [c["operation"] for c in history[-3:]] == ["OPTIMIZE", "VACUUM START", "VACUUM END"]
    assert int(history[-1]["operationMetrics"]["numDeletedFiles"]) > 0, history[-1]
    return history


def _strategies(outcomes: list[PipelineOutcome]) -> dict[str, str]:
    return {
        o.pipeline: f"{o.strategy.choice.strategy}: {o.strategy.choice.reason}"
        for o in outcomes
        if o.strategy is not None
    }


def test_maintained_targets_follow_every_change_from_the_change_rows_alone(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "lake"
    _seed(root)
    registry = registry_at(root)
    store = WatermarkStore(root / "_control")
    cycle(spark, registry, store)  # first loads
    check_targets(spark, root, "first load")

    payments = lambda: DeltaTable(str(root / "payments"))  # noqa: E731
    customers = lambda: DeltaTable(str(root / "customers"))  # noqa: E731
    steps = [
        (
            "inserts, an amount changed, one set to NULL, a payment moved to customer 4",
            lambda: (
                write_deltalake(
                    str(root / "payments"), _payments([(40, 4, 300), (41, 2, 7)]), mode="append"
                ),
                payments().update(predicate="payment_id = 11", updates={"amount": "999"}),
                payments().update(predicate="payment_id = 12", updates={"amount": "NULL"}),
                payments().update(predicate="payment_id = 14", updates={"customer_id": "4"}),
            ),
        ),
        (
            "customer 2's group emptied; payments without a customer added",
            lambda: (
                payments().delete(predicate="customer_id = 2"),
                write_deltalake(
                    str(root / "payments"), _payments([(50, None, 1), (51, None, 2)]), mode="append"
                ),
            ),
        ),
        (
            "only a customer renamed",
            lambda: customers().update(updates={"name": "'x'"}, predicate="customer_id = 3"),
        ),
        (
            "customer 2 back, a payment moved into the NULL group, a new customer",
            lambda: (
                write_deltalake(str(root / "payments"), _payments([(60, 2, 80)]), mode="append"),
                payments().update(predicate="payment_id = 10", updates={"customer_id": "NULL"}),
                write_deltalake(str(root / "customers"), _customers([(5, "eve")]), mode="append"),
            ),
        ),
    ]
    ran: list[dict[str, str]] = []
    for step, change in steps:
        change()
        outcomes = cycle(spark, registry, store)
        check_targets(spark, root, step)
        ran.append(_strategies(outcomes))
    assert all(s.startswith("maintain") for r in ran for s in r.values()), ran
    # The first maintained batch rebuilt each state from the snapshot, later ones added.
    assert "payments state rebuilt (none -> v" in ran[0]["totals"], ran[0]
    assert "payments state added" in ran[1]["totals"], ran[1]
    assert "payments state found" in ran[2]["customer_payments"], ran[2]  # payments unchanged
    assert "payments state added" in ran[3]["customer_payments"], ran[3]
    # auto never takes the rebuild as maintaining's cost: the history says which it was.
    # (customer_payments' third batch found its state there: no rebuild either.)
    for name, rebuilt in (
        ("totals", [True, False, False]),
        ("customer_payments", [True] + [False] * 3),
    ):
        measured = [r for r in store.strategy_runs(name) if r.strategy is Strategy.MAINTAIN]
        assert [r.rebuilt for r in measured] == rebuilt, (name, measured)
    history = _state_history(root, "totals")
    operations = [c["operation"] for c in history]
    assert operations[0] in ("WRITE", "CREATE OR REPLACE TABLE AS SELECT"), operations
    assert operations[1:] == ["MERGE", "MERGE"], operations
    # The MERGE's source is one row per group the range's change rows touched: customer 2
    # and the NULL group (step 2), not every group.
    assert int(history[1]["operationMetrics"]["numSourceRows"]) == 2, history[1]
    labels = [str(c.get("userMetadata") or "") for c in history]
    assert all(label.startswith(STATE_LABEL) for label in labels), labels

    # A replay of an old range recomputes the touched keys from its snapshots (I5: no row
    # moves back) and leaves the states as they are: the next batch adds to them.
    states = {p: len(_state_history(root, p)) for p in QUERIES}
    plan = plan_replay(store, registry, "payments", VersionRange(1, 2))

    def execute(batch_id: str, pipelines: Sequence[str]) -> list[str | None]:
        for name in pipelines:
            outcome = execute_pipeline(
                spark=spark,
                store=store,
                registry=registry,
                pipeline_name=name,
                batch_id=batch_id,
                run_id="replay",
            )
            assert outcome.strategy is not None
            assert outcome.strategy.choice.strategy is Strategy.INCREMENTAL
        return []

    run_replay(store, registry, plan, execute=execute, actor="test")
    check_targets(spark, root, "a replay of payments versions 1-2")
    assert {p: len(_state_history(root, p)) for p in QUERIES} == states

    # The target vacuumed: its state folder is not the target's files, and stays.
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    spark.sql(f"VACUUM delta.`{root / 'totals'}` RETAIN 0 HOURS")
    write_deltalake(str(root / "payments"), _payments([(70, 3, 3)]), mode="append")
    outcomes = cycle(spark, registry, store)
    check_targets(spark, root, "after a replay and a VACUUM")
    assert all("payments state added" in s for s in _strategies(outcomes).values())


@pytest.mark.parametrize("point", ["after_state_commit", "after_target_commit"])
def test_a_run_killed_around_its_state_commit_loses_and_doubles_nothing(
    point: str, spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "lake"
    _seed(root)
    registry = registry_at(root, names=["totals"])
    store = WatermarkStore(root / "_control")
    cycle(spark, registry, store)
    DeltaTable(str(root / "payments")).update(
        predicate="customer_id = 1", updates={"amount": "amount + 1"}
    )
    cycle(spark, registry, store)  # the states are rebuilt: the killed batch adds to them
    write_deltalake(str(root / "payments"), _payments([(80, 1, 9), (81, 3, 4)]), mode="append")
    DeltaTable(str(root / "payments")).delete(predicate="payment_id = 12")
    child = subprocess.run(
        [sys.executable, "-m", "tests.spark.test_maintain", str(root)],
        cwd=REPO,
        env={**os.environ, FAULTS_ENV: f"{point}@totals"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == -9, child.stdout[-2000:] + child.stderr[-3000:]
    before = _state_history(root, "totals")
    assert f" v={DeltaTable(str(root / 'payments')).version()} from=" in str(
        before[-1]["userMetadata"]
    )
    if point == "after_state_commit":
        # The state compacted and its old files deleted before the batch resumes: the
        # labelled version cannot be read any more, the compacted one holds its rows.
        before = _compacted_and_vacuumed(spark, state_location(str(root / "totals"), "payments"))
    outcomes = cycle(spark, registry, store)  # the open batch, resumed
    check_targets(spark, root, f"killed {point}, resumed", names=["totals"])
    assert store.open_batch() is None
    # The state was brought forward once: the resumed run found it at the range's end.
    assert _state_history(root, "totals") == before
    assert "payments state found" in _strategies(outcomes).get("totals", "payments state found")
    target = DeltaTable(str(root / "totals")).history()
    merges = [
        c for c in target if str(c.get("userMetadata") or "").startswith("watermark pipeline")
    ]
    batches = [str(c["userMetadata"]).split(" seq=")[0] for c in merges]
    assert len(batches) == len(set(batches)), batches  # one data commit per batch


def test_two_runs_of_one_batch_never_add_its_deltas_twice(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run B reads the state's label (it reflects the version before the range), run A of
    the same batch adds the deltas and writes the target, the batch is finalized, and run C
    of the next batch reads A's label; only then B's MERGE runs, then C's. Each MERGE read a
    newer version than its run believed, which Delta does not see as a conflict: B and C
    must fail retryable without writing, and no later run may believe the doubled state or
    what C added on top of it (C's retry rebuilds)."""
    root = tmp_path / "lake"
    _seed(root)
    registry = registry_at(root, names=["totals"])
    store = WatermarkStore(root / "_control")
    cycle(spark, registry, store)  # a first load
    write_deltalake(str(root / "payments"), _payments([(40, 1, 5)]), mode="append")
    cycle(spark, registry, store)  # the state is rebuilt
    write_deltalake(str(root / "payments"), _payments([(41, 2, 7), (42, None, 1)]), mode="append")
    look = look_before_planning(registry, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None

    def run(name: str, batch_id: str = batch.batch_id) -> PipelineOutcome:
        return execute_pipeline(
            spark=spark,
            store=store,
            registry=registry,
            pipeline_name="totals",
            batch_id=batch_id,
            run_id=name,
        )

    real = maintain._add_deltas
    calls: list[str] = []
    b_merge: list[tuple[Any, ...]] = []
    after_c: list[int] = []

    def interleaved(*args: Any) -> None:
        calls.append("call")
        if len(calls) == 1:  # B has read the label: A runs the whole batch, then C
            b_merge.append(args)
            outcome = run("A")  # the second call: A adds the deltas
            assert outcome.write is not None, outcome
            assert outcome.write.committed, outcome
            cycle(spark, registry, store)  # A succeeded: the batch is finalized
            write_deltalake(str(root / "payments"), _payments([(43, 1, 2)]), mode="append")
            look = look_before_planning(registry, Observer(), store, actor="test")
            following, _ = plan_next(store, look, actor="test")
            assert following is not None
            with pytest.raises(RetryableError, match="another run changed the aggregate state"):
                run("C", following.batch_id)  # the third call
            after_c.append(DeltaTable(str(root / "totals")).version())
            return  # B's MERGE ran during C's call
        if len(calls) == 3:  # C has read A's label: B's MERGE runs first
            real(*b_merge[0])
        real(*args)

    monkeypatch.setattr(maintain, "_add_deltas", interleaved)
    with pytest.raises(RetryableError, match="another run changed the aggregate state"):
        run("B")
    monkeypatch.undo()
    assert len(calls) == 3, calls
    # A's commit, B's (the same range again) and C's on top of it
    a, b, c = (
        str(c["userMetadata"]).split(" run=")[0].split(" at=")[0]
        for c in _state_history(root, "totals")[-3:]
    )
    assert a == b != c, (a, b, c)
    assert DeltaTable(str(root / "totals")).version() == after_c[0]  # B and C wrote nothing
    # C's batch, resumed: neither B's commit nor C's on top of it is believed.
    outcomes = cycle(spark, registry, store)
    assert "payments state rebuilt" in _strategies(outcomes)["totals"], outcomes
    assert store.open_batch() is None
    check_targets(spark, root, "three runs racing on the state", names=["totals"])
    # A range whose changes cancel out (a payment added and deleted) changes no group: the
    # state gets a commit that changes no row, so its label still moves and the next batch
    # adds to it rather than rebuilding.
    write_deltalake(str(root / "payments"), _payments([(44, 3, 5)]), mode="append")
    DeltaTable(str(root / "payments")).delete(predicate="payment_id = 44")
    outcomes = cycle(spark, registry, store)
    assert "payments state added" in _strategies(outcomes)["totals"], outcomes
    assert _state_history(root, "totals")[-1]["operation"] == "SET TBLPROPERTIES"
    # The state compacted and vacuumed between batches: the rows are those it labelled.
    _compacted_and_vacuumed(spark, state_location(str(root / "totals"), "payments"))
    # Delta's auto-compaction after the state's MERGE: its OPTIMIZE commits under the
    # run's label (it runs inside the MERGE). The run still finds its own commit. New
    # groups only, so the MERGE adds a file beside the compacted one.
    write_deltalake(str(root / "payments"), _payments([(45, 7, 5), (47, 8, 60)]), mode="append")
    compaction = {
        "spark.databricks.delta.autoCompact.enabled": "true",
        "spark.databricks.delta.autoCompact.minNumFiles": "2",
    }
    for key, value in compaction.items():
        spark.conf.set(key, value)
    try:
        outcomes = cycle(spark, registry, store)
    finally:
        for key in compaction:
            spark.conf.unset(key)
    assert "payments state added" in _strategies(outcomes)["totals"], outcomes
    merge, optimize = _state_history(root, "totals")[-2:]
    assert (merge["operation"], optimize["operation"]) == ("MERGE", "OPTIMIZE")
    assert merge["userMetadata"] == optimize["userMetadata"]
    write_deltalake(str(root / "payments"), _payments([(46, 1, 3)]), mode="append")
    outcomes = cycle(spark, registry, store)
    assert "payments state added" in _strategies(outcomes)["totals"], outcomes
    check_targets(spark, root, "after a compaction and an auto-compaction", names=["totals"])


def test_sums_of_floating_point_values_are_not_maintained(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "lake"
    readings = str(root / "readings")
    write_deltalake(
        readings,
        pa.table({"sensor": pa.array([1, 1, 2], pa.int64()), "value": [0.1, 0.2, 0.3]}),
        configuration=CDF,
    )

    def registry(strategy: StrategyValue) -> Registry:
        return Registry(
            upstreams=[DeltaUpstream(name="readings", path=readings)],
            pipelines=[
                sql_pipeline(
                    name="sums",
                    sql="SELECT sensor, SUM(value) AS total FROM readings GROUP BY sensor",
                    upstreams={"readings": "sensor"},
                    keys=["sensor"],
                    target=str(root / "sums"),
                    strategy=strategy,
                )
            ],
        )

    store = WatermarkStore(root / "_control")
    cycle(spark, registry("maintain"), store)  # a first load runs the full query
    more = pa.table({"sensor": pa.array([2], pa.int64()), "value": [0.4]})
    write_deltalake(readings, more, mode="append")
    version = DeltaTable(str(root / "sums")).version()
    with pytest.raises(TerminalError, match=r"a SUM over readings adds double values"):
        cycle(spark, registry("maintain"), store)
    assert DeltaTable(str(root / "sums")).version() == version  # nothing written
    assert not Path(state_location(str(root / "sums"), "readings")).exists()
    # auto's size rule would pick the whole form for tables this small: make it pick the
    # step form, which is maintain for this declaration, then falls back at run time.
    monkeypatch.setattr(strategy_rule, "AUTO_FULL_BELOW_BYTES", 0)
    monkeypatch.setattr(strategy_rule, "AUTO_FULL_FRACTION", 2.0)
    assert registry("auto").pipelines["sums"].maintainable
    [outcome] = cycle(spark, registry("auto"), store)
    assert outcome.strategy is not None
    choice = outcome.strategy.choice
    assert choice.strategy is Strategy.INCREMENTAL, choice
    assert "not maintained: a SUM over readings adds double values" in choice.reason, choice
    assert outcome.write is not None
    assert outcome.write.committed
    spark.read.format("delta").load(readings).createOrReplaceTempView("readings")
    want = spark.sql("SELECT sensor, SUM(value) AS total FROM readings GROUP BY sensor")
    got = spark.read.format("delta").load(str(root / "sums")).select("sensor", "total")
    assert _rows(spark, got) == _rows(spark, want)


def main(argv: Sequence[str]) -> None:
    """A child process: one cycle of the registry over the lake at ``argv[0]`` (a fault
    point armed in ``WATERMARK_FAULTS`` kills it)."""
    from tests.conftest import SPARK_TEST_CONF
    from watermark_dagster.runtime.spark import build_spark_session

    root = Path(argv[0])
    spark = build_spark_session(master="local[2]", conf=SPARK_TEST_CONF)
    cycle(spark, registry_at(root, names=["totals"]), WatermarkStore(root / "_control"))


if __name__ == "__main__":
    main(sys.argv[1:])
