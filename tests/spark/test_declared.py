"""Declared pipelines on Spark: the SQL form runs against views of the pinned snapshots,
and a declaration that only the data can refute (a key path naming a column the upstream
lacks, a full transform dropping the key) is refused before anything is written.

The derived transforms' exactness over random histories, crashes and replays is proven by
tests/model/test_declared.py; their cost against the hand-written form by
tests/bench/test_benchmark_declared.py (``-m slow``). Here, a plan-metrics check that
only the touched keys reach the join keeps the derived form incremental in the default
suite.
"""

import re
from dataclasses import replace
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from benchmarks.declared import PlanWork, measuring
from tests.support.cycles import run_cycle
from tests.support.plan_checks import HIDING, JOIN, hiding_pipeline, refused, tiers_table
from watermark_dagster.config.pipeline import Pipeline, declared_pipeline, sql_pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.core.faults import SimulatedCrash, simulate_crash_at
from watermark_dagster.demo.data import ORDERS, DemoPaths, apply_round, seed
from watermark_dagster.demo.handwritten import build_handwritten_registry
from watermark_dagster.demo.pipelines import demo_upstreams, full_orders_enriched
from watermark_dagster.errors import TerminalError
from watermark_dagster.observe.observer import Observer
from watermark_dagster.operations.coordinate import finalize_batch, look_before_planning, plan_next
from watermark_dagster.operations.run_pipeline import execute_pipeline
from watermark_dagster.store import WatermarkStore

pytestmark = pytest.mark.spark

ENRICHED_SQL = """
    SELECT o.order_id, o.customer_id, c.name AS customer_name, o.amount_cents, o.status
    FROM orders AS o LEFT JOIN customers AS c ON o.customer_id = c.customer_id
"""


def _rows(frame: DataFrame, columns: list[str]) -> list[tuple]:
    return sorted(tuple(r) for r in frame.select(*columns).collect())


@pytest.mark.e2e  # minutes; the model and the SQL shapes prove the same in the default suite
def test_sql_and_function_forms_match_a_full_recompute_batch_after_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    # More orders than a round touches, so a recompute of every order would show.
    more = [(1000 + i, 1 + i % 5, 100 + i, "new") for i in range(200)]
    spark.createDataFrame(more, ORDERS).write.format("delta").mode("append").save(
        paths.upstream("orders")
    )
    function = declared_pipeline(
        upstreams={"orders": "order_id", "customers": JOIN},
        target=paths.target("by_function"),
        keys=["order_id"],
        name="by_function",
        strategy="incremental",  # the derived form (small tables would be recomputed)
    )(full_orders_enriched)
    sql = sql_pipeline(
        name="by_sql",
        sql=ENRICHED_SQL,
        upstreams={"orders": "order_id", "customers": JOIN},
        target=paths.target("by_sql"),
        keys=["order_id"],
        strategy="incremental",
    )
    # Each batch's derived output is executed once more and its plan's metrics kept.
    work: dict[str, list[PlanWork]] = {}
    registry = measuring(Registry(upstreams=demo_upstreams(paths), pipelines=[function, sql]), work)
    store = WatermarkStore(paths.control_root)
    for round_no in range(3):
        if round_no:
            apply_round(spark, paths, round_no)  # renames, moved and deleted orders
        run_cycle(spark, registry, store)
        orders = spark.read.format("delta").load(paths.upstream("orders"))
        customers = spark.read.format("delta").load(paths.upstream("customers"))
        full = full_orders_enriched(orders, customers)
        expected = _rows(full, full.columns)
        for name in ("by_function", "by_sql"):
            target = spark.read.format("delta").load(paths.target(name))
            assert _rows(target, full.columns) == expected, (name, round_no)
            if round_no:
                # Only the touched orders reach the join: the direct upstream is cut down
                # to the touched keys before the full transform runs.
                largest = work[name][-1].largest_intermediate
                assert 0 < largest < orders.count(), (name, round_no, work[name][-1])


def test_past_the_inline_keys_limit_the_derivation_joins_and_matches_a_recompute(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More touched keys than the driver holds (``INLINE_KEYS_LIMIT``, made tiny here):
    the touched keys stay a plan, joined where they are used, and the target is exact."""
    from watermark_dagster.read import derive

    monkeypatch.setattr(derive, "INLINE_KEYS_LIMIT", 2)
    joined: list[str] = []
    by_joins = derive._derived_by_joins

    def counted(pipeline, *args, **kwargs):
        joined.append(pipeline.name)
        return by_joins(pipeline, *args, **kwargs)

    monkeypatch.setattr(derive, "_derived_by_joins", counted)
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    pipeline = sql_pipeline(
        name="by_joins",
        sql=ENRICHED_SQL,
        upstreams={"orders": "order_id", "customers": JOIN},
        target=paths.target("by_joins"),
        keys=["order_id"],
        strategy="incremental",
    )
    registry = Registry(upstreams=demo_upstreams(paths), pipelines=[pipeline])
    store = WatermarkStore(paths.control_root)
    for round_no in range(3):
        if round_no:
            apply_round(spark, paths, round_no)  # renames, moved and deleted orders
        run_cycle(spark, registry, store)
        orders = spark.read.format("delta").load(paths.upstream("orders"))
        customers = spark.read.format("delta").load(paths.upstream("customers"))
        full = full_orders_enriched(orders, customers)
        target = spark.read.format("delta").load(paths.target("by_joins"))
        assert _rows(target, full.columns) == _rows(full, full.columns), round_no
    assert joined == ["by_joins", "by_joins"]  # both incremental batches took the joins


def test_a_replay_past_the_inline_keys_limit_stays_incremental_and_rolls_nothing_back(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41: the derivation switched an `auto` batch to `full` past
    ``INLINE_KEYS_LIMIT`` touched keys (made tiny here), a replay too, contrary to the rule
    that a replay is incremental: a full diff over a replay's older snapshots proposes to
    roll back every newer key, and only each key's ``_wm_seq`` guard stood in the way
    (which a `full` batch does not refresh on keys it leaves unchanged). A replay now
    stays incremental (the keys joined as a plan), and the target still equals a
    recompute at the committed versions."""
    from watermark_dagster.read import derive

    monkeypatch.setattr(derive, "INLINE_KEYS_LIMIT", 2)
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    pipeline = sql_pipeline(
        name="auto_enriched",
        sql=ENRICHED_SQL,
        upstreams={"orders": "order_id", "customers": JOIN},
        target=paths.target("auto_enriched"),
        keys=["order_id"],
        strategy="auto",
    )
    registry = Registry(upstreams=demo_upstreams(paths), pipelines=[pipeline])
    store = WatermarkStore(paths.control_root)
    run_cycle(spark, registry, store)
    apply_round(spark, paths, 1)
    replayed = store.get_batch(run_cycle(spark, registry, store))
    apply_round(spark, paths, 2)
    run_cycle(spark, registry, store)
    orders_range = replayed.inputs["orders"].range
    assert orders_range is not None
    replay = store.create_range_replay(
        "orders",
        orders_range,
        mode=replayed.inputs["orders"].mode,
        pipelines=["auto_enriched"],
        all_upstreams=["orders", "customers"],
        actor="test",
        reason="late fix",
    )
    outcome = execute_pipeline(
        spark=spark,
        store=store,
        registry=registry,
        pipeline_name="auto_enriched",
        batch_id=replay.batch_id,
        run_id="test",
    )
    orders = spark.read.format("delta").load(paths.upstream("orders"))
    customers = spark.read.format("delta").load(paths.upstream("customers"))
    full = full_orders_enriched(orders, customers)
    target = spark.read.format("delta").load(paths.target("auto_enriched"))
    assert _rows(target, full.columns) == _rows(full, full.columns)
    assert outcome.strategy is not None
    assert (outcome.strategy.choice.strategy, outcome.strategy.choice.reason) == (
        "incremental",
        "a replay",
    )


def test_a_key_path_column_the_upstream_lacks_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path
) -> None:
    pipeline = declared_pipeline(
        upstreams={
            "orders": "order_id",
            "customers": "customers.cust_id -> orders.customer_id -> orders.order_id",
        },
        target=str(tmp_path / "wm" / "never"),
        keys=["order_id"],
        name="typo",
    )(full_orders_enriched)
    refused(spark, tmp_path, pipeline, "names column 'cust_id', which upstream 'customers'")


def test_a_full_transform_without_the_key_column_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path
) -> None:
    def no_key(orders: DataFrame, customers: DataFrame) -> DataFrame:
        return orders.join(customers, "customer_id").select("customer_id", "name")

    pipeline = declared_pipeline(
        upstreams={"orders": "order_id", "customers": JOIN},
        target=str(tmp_path / "wm" / "never"),
        keys=["order_id"],
        name="no_key",
    )(no_key)
    refused(spark, tmp_path, pipeline, "output has no key column(s) ['order_id']")


def test_sql_the_definitions_could_not_place_is_proven_by_the_batch_before_writing(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Unqualified, `status` could be a column of either table until the schemas say it is
    # the orders': then the window is per status, not per order, and the batch refuses it.
    pipeline = sql_pipeline(
        name="per_status",
        sql="SELECT order_id, name FROM orders JOIN customers USING (customer_id)\n"
        "QUALIFY ROW_NUMBER() OVER (PARTITION BY status ORDER BY order_id) = 1",
        upstreams={"orders": "order_id", "customers": JOIN},
        target=str(tmp_path / "wm" / "never"),
        keys=["order_id"],
    )
    assert pipeline.declared is not None
    assert pipeline.declared.inferred is None
    refused(
        spark,
        tmp_path,
        pipeline,
        "its SQL (line 2) uses a window not partitioned by the target keys",
    )


def _refused_on_the_second_batch(
    spark: SparkSession, paths: DemoPaths, first: Registry, second: Registry, name: str
) -> str:
    """Run a batch of ``first``, commit a round of changes, and run ``name``'s next batch
    with ``second``: it must stop with a TerminalError (its text is returned) and leave the
    target at the first batch's version."""
    store = WatermarkStore(paths.control_root)
    run_cycle(spark, first, store)
    target = DeltaTable.forPath(spark, first.pipelines[name].target)
    version = target.history(1).first()
    assert version is not None
    apply_round(spark, paths, 1)
    look = look_before_planning(second, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None
    with pytest.raises(TerminalError) as caught:
        execute_pipeline(
            spark=spark,
            store=store,
            registry=second,
            pipeline_name=name,
            batch_id=batch.batch_id,
            run_id="test",
        )
    latest = target.history(1).first()
    assert latest is not None
    assert latest["version"] == version["version"]  # nothing written
    return str(caught.value)


def _reading_another_table(tiers: str):
    """A full transform that also reads a table by path, which it was not given."""

    def enriched_with_tiers(orders: DataFrame, customers: DataFrame) -> DataFrame:
        tier = orders.sparkSession.read.format("delta").load(tiers)
        return full_orders_enriched(orders, customers).join(tier, "customer_id", "left")

    return enriched_with_tiers


def test_a_full_transform_reading_a_table_it_was_not_given_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path
) -> None:
    tiers = tiers_table(spark, tmp_path)
    pipeline = declared_pipeline(
        upstreams={"orders": "order_id", "customers": JOIN},
        target=str(tmp_path / "wm" / "never"),
        keys=["order_id"],
        name="with_tiers",
    )(_reading_another_table(tiers))
    refused(spark, tmp_path, pipeline, "outside its upstreams ['orders', 'customers']")


def test_a_changed_transform_reading_another_table_is_refused_on_an_incremental_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    tiers = tiers_table(spark, tmp_path)
    declare = declared_pipeline(
        upstreams={"orders": "order_id", "customers": JOIN},
        target=paths.target("enriched"),
        keys=["order_id"],
        name="enriched",
    )
    first = Registry(upstreams=demo_upstreams(paths), pipelines=[declare(full_orders_enriched)])
    changed = Registry(
        upstreams=demo_upstreams(paths), pipelines=[declare(_reading_another_table(tiers))]
    )
    error = _refused_on_the_second_batch(spark, paths, first, changed, "enriched")
    assert "outside its upstreams" in error
    assert str(Path(tiers)) in error


def test_a_hand_written_pipelines_full_transform_reading_another_table_isrefused(
    spark: SparkSession, tmp_path: Path
) -> None:
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    tiers = tiers_table(spark, tmp_path)
    # The demo's hand-written transform, with a full transform that reads a table it was
    # not given, forced to run it: the first batch loads (the hand-written transform), the
    # second would run the full transform and is refused before writing.
    pipeline = replace(
        build_handwritten_registry(paths).pipelines["orders_enriched"],
        full_transform=_reading_another_table(tiers),
        strategy="full",  # type: ignore[arg-type]
    )
    registry = Registry(upstreams=demo_upstreams(paths), pipelines=[pipeline])
    error = _refused_on_the_second_batch(spark, paths, registry, registry, pipeline.name)
    assert "outside its upstreams" in error
    assert str(Path(tiers)) in error
    assert "as an upstream of the pipeline." in error  # no key path to name


def _ranked(orders: DataFrame, customers: DataFrame) -> DataFrame:
    """Each order's rank among its customer's orders: a window over other keys' rows."""
    by_customer = Window.partitionBy("customer_id").orderBy(F.col("amount_cents").desc())
    return full_orders_enriched(orders, customers).withColumn("rank", F.rank().over(by_customer))


def _sampled(orders: DataFrame, customers: DataFrame) -> DataFrame:
    return full_orders_enriched(orders, customers).withColumn("draw", F.rand())


@pytest.mark.parametrize(
    ("function", "fragment"),
    [
        (_ranked, "its full transform uses Window: a window function"),
        (_sampled, "its full transform calls Rand, which is non-deterministic"),
    ],
    ids=["window", "rand"],
)
def test_a_python_full_transform_mixing_keys_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path, function, fragment: str
) -> None:
    pipeline = declared_pipeline(
        upstreams={"orders": "order_id", "customers": JOIN},
        target=str(tmp_path / "wm" / "never"),
        keys=["order_id"],
        name="mixing",
    )(function)
    refused(spark, tmp_path, pipeline, fragment)


# Spark jobs of one incremental batch of each demo pipeline, per stage of the run (each
# stage's job group: frames/stages.py). Where they go (`python -m benchmarks.jobs`): binding
# the inputs and recording the run none (the rows read come from the log: a job counting
# the change rows first read them, 6 jobs per pipeline); the transform's first read of the
# change rows (kept for the batch) and its walk of the touched keys, one collect per step,
# 6-13; the write: Delta's MERGE alone (its source's materialization, the touched files,
# the rewrite, the commit), 17-20. The write's own summary of the output and a fetch of the
# changed keys took 4 more (orders_enriched: 21, now 17) before the driver's touched keys
# served both (write/summary.py); 40-41 per pipeline with the count.
DECLARED_STAGE_JOB_BUDGET = {"bind": 0, "transform": 14, "write": 21, "record": 0}
DECLARED_BATCH_JOB_BUDGET = 31


def _stage_sites(spark: SparkSession, group: str) -> list[str]:
    """The names (PySpark's call sites, ``action at file:line``) of the stages the jobs of
    ``group`` ran."""
    tracker = spark.sparkContext.statusTracker()
    infos = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
    stages = [tracker.getStageInfo(s) for i in infos if i is not None for s in i.stageIds]
    return [s.name for s in stages if s is not None]


def test_an_incremental_batch_of_a_declared_pipeline_stays_within_its_job_budget(
    spark: SparkSession, tmp_path: Path
) -> None:
    from watermark_dagster.demo.pipelines import build_demo_registry
    from watermark_dagster.frames.stages import STAGES, stage_group

    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    registry = build_demo_registry(paths)
    # The incremental form's budget (small tables would have `auto` recompute them).
    registry = Registry(
        upstreams=list(registry.upstreams.values()),
        pipelines=[replace(p, strategy="incremental") for p in registry.pipelines.values()],
    )
    store = WatermarkStore(paths.control_root)
    run_cycle(spark, registry, store)  # the first load
    apply_round(spark, paths, 1)
    look = look_before_planning(registry, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None
    assert set(batch.pipelines) == {"orders_enriched", "customer_payments"}
    tracker = spark.sparkContext.statusTracker()
    tables = ("batches", "committed_watermarks", "pipeline_checkpoints", "history")
    for name in batch.pipelines:
        control = {t: store.table_version(t) for t in tables}
        outcome = execute_pipeline(
            spark=spark,
            store=store,
            registry=registry,
            pipeline_name=name,
            batch_id=batch.batch_id,
            run_id="test",
        )
        assert not outcome.full_load
        assert outcome.rows_written > 0
        # Two control-table commits: the attempt's begin (the crash record, before the
        # write) and one after the write, which closes it with its history row.
        made = {t: store.table_version(t) - v for t, v in control.items()}
        assert made == {**dict.fromkeys(tables, 0), "pipeline_checkpoints": 2}, (name, made)
        jobs = {
            stage: len(tracker.getJobIdsForGroup(stage_group(name, batch.batch_id, stage)))
            for stage in STAGES
        }
        over = {s: n for s, n in jobs.items() if n > DECLARED_STAGE_JOB_BUDGET[s]}
        assert not over, (name, jobs)
        assert sum(jobs.values()) <= DECLARED_BATCH_JOB_BUDGET, (name, jobs)
        assert jobs["write"] > 0  # the groups are the run's own: the MERGE ran in one
        # No summary or count of our own: the write's jobs are Delta's, started by the
        # MERGE itself (PySpark names a stage by the call that started its job).
        sites = {
            stage: _stage_sites(spark, stage_group(name, batch.batch_id, stage)) for stage in STAGES
        }
        ours = [s for ss in sites.values() for s in ss if re.search(r"/write/\w+\.py:", s)]
        assert ours == [], (name, sites)
        counts = [s for ss in sites.values() for s in ss if s.startswith("count at")]
        assert counts == [], (name, sites)
        # The rows read came from the log, and are the change feed's.
        for report in outcome.inputs:
            assert report.start_version is not None
            assert report.end_version is not None
            feed = (
                spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", report.start_version)
                .option("endingVersion", report.end_version)
                .load(registry.upstreams[report.upstream].path)
            )
            assert report.rows_read == feed.count(), report
    # A user's job group is the thread's again once the run is done.
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None


def _effective_changes(spark: SparkSession, target: str, version: int) -> tuple[set, set]:
    """The keys whose row the commit at ``version`` really changed (inserted, deleted, or
    updated to other values), and every key its change feed holds."""
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", version)
        .option("endingVersion", version)
        .load(target)
    )
    rows = feed.drop("_commit_version", "_commit_timestamp", "_wm_seq", "_wm_batch_id").collect()
    images: dict[tuple, dict[str, tuple]] = {}
    for row in rows:
        values = row.asDict()
        kind = values.pop("_change_type")
        images.setdefault((values["order_id"],), {})[kind] = tuple(sorted(values.items()))
    changed = {
        key
        for key, kinds in images.items()
        if kinds.get("update_preimage") != kinds.get("update_postimage")
        or "insert" in kinds
        or "delete" in kinds
    }
    return changed, set(images)


@pytest.mark.e2e  # minutes; the model and the SQL shapes prove the same in the default suite
def test_a_full_recompute_writes_only_the_rows_that_changed_and_strategies_can_alternate(
    spark: SparkSession, tmp_path: Path
) -> None:
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)

    def enriched(name: str, strategy: str) -> Pipeline:
        return sql_pipeline(
            name=name,
            sql=ENRICHED_SQL,
            upstreams={"orders": "order_id", "customers": JOIN},
            target=paths.target(name),
            keys=["order_id"],
            strategy=strategy,  # type: ignore[arg-type]
            # `full` against `incremental` (a rewrite is tested on its own below).
            change_feed="minimal",
        )

    # The demo's hand-written transform, with the full transform beside it: it chooses
    # per batch between the two as a declared pipeline does.
    hand_written = build_handwritten_registry(paths).pipelines["orders_enriched"]

    def chooser(strategy: str) -> Pipeline:
        return replace(
            hand_written,
            name="hand_written",
            target=paths.target("hand_written"),
            full_transform=full_orders_enriched,
            strategy=strategy,  # type: ignore[arg-type]
            change_feed="minimal",
        )

    store = WatermarkStore(paths.control_root)
    # `switching` and `hand_written` change strategy every batch; the others keep theirs.
    cycle = ["first load", "full", "incremental", "auto"]
    switching_names = ("switching", "hand_written")
    for round_no, switch_to in enumerate(cycle):
        if round_no:
            apply_round(spark, paths, round_no)
        pipelines = [
            enriched("incremental", "incremental"),
            enriched("full", "full"),
            enriched("switching", switch_to if round_no else "auto"),
            chooser(switch_to if round_no else "auto"),
        ]
        registry = Registry(upstreams=demo_upstreams(paths), pipelines=pipelines)
        look = look_before_planning(registry, Observer(), store, actor="test")
        batch, _ = plan_next(store, look, actor="test")
        assert batch is not None
        outcomes = {
            name: execute_pipeline(
                spark=spark,
                store=store,
                registry=registry,
                pipeline_name=name,
                batch_id=batch.batch_id,
                run_id="test",
            )
            for name in batch.pipelines
        }
        finalize_batch(store, store.get_batch(batch.batch_id), registry=registry, actor="test")
        orders = spark.read.format("delta").load(paths.upstream("orders"))
        customers = spark.read.format("delta").load(paths.upstream("customers"))
        full = full_orders_enriched(orders, customers)
        expected = _rows(full, full.columns)
        for name in ("incremental", "full", *switching_names):
            target = spark.read.format("delta").load(paths.target(name))
            assert _rows(target, full.columns) == expected, (name, round_no)
        if not round_no:
            assert all(o.full_load and o.strategy is None for o in outcomes.values())
            for name in ("incremental", "full", "hand_written"):  # read downstream
                DeltaTable.forPath(spark, paths.target(name))  # exists
                spark.sql(
                    f"ALTER TABLE delta.`{paths.target(name)}` "
                    "SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
                )
            continue
        # The strategy each ran with is recorded, with its reason and cost.
        chosen = {n: o.strategy for n, o in outcomes.items()}
        assert chosen["incremental"] is not None
        assert chosen["incremental"].choice.strategy == "incremental"
        assert chosen["full"] is not None
        assert chosen["full"].choice.strategy == "full"
        assert chosen["full"].choice.reason == "configured strategy=full"
        assert chosen["full"].choice.snapshot_bytes
        assert chosen["full"].seconds is not None
        for name in switching_names:
            switching = chosen[name]
            assert switching is not None, name
            meta = switching.metadata()
            # Each run's strategy and cost is in its PIPELINE_SUCCEEDED history row.
            runs = store.strategy_runs(name)
            assert [str(r.strategy) for r in runs] == [*cycle[1:round_no], meta["strategy"]]
            assert runs[-1].seconds == switching.seconds
            if switch_to != "auto":
                assert meta["strategy"] == switch_to, (name, meta)
            else:
                # It has run both: `auto` picks what they measured cheaper, scaled to this
                # batch's sizes (never below what a run took).
                assert meta["strategy_reason"].startswith("auto: measured"), (name, meta)
                estimates = switching.choice.estimates
                assert meta["strategy"] == min(estimates, key=lambda s: estimates[s])
                seconds = {str(r.strategy): r.seconds for r in runs[:-1]}
                assert estimates["full"] >= seconds["full"]
                assert estimates["incremental"] >= seconds["incremental"]
        # The full recompute rewrote only the rows that changed: its commit's change feed
        # holds exactly the keys whose rows changed, the same keys an incremental batch
        # changed, so a downstream reader of either sees the same changes.
        versions = {n: o.write.target_version for n, o in outcomes.items() if o.write}
        full_changed, full_fed = _effective_changes(spark, paths.target("full"), versions["full"])
        incremental_changed, incremental_fed = _effective_changes(
            spark, paths.target("incremental"), versions["incremental"]
        )
        assert full_changed == incremental_changed
        assert 0 < len(full_changed) < orders.count()
        assert full_fed == full_changed  # no unchanged row rewritten
        assert incremental_fed >= incremental_changed
        if switch_to == "full":  # the hand-written pipeline's full batch: the same
            hand_changed, hand_fed = _effective_changes(
                spark, paths.target("hand_written"), versions["hand_written"]
            )
            assert hand_changed == hand_fed == full_changed


def test_a_rewrite_overwrites_once_stamps_every_row_and_spares_a_minimal_change_feed(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``rewrite``: the full transform overwrites the target in one commit carrying the
    batch's Delta transaction, every row stamped with the batch's position; a retry after
    that commit (a crash before the checkpoint) writes nothing; a target whose change feed
    is ``minimal`` is never rewritten (auto picks ``full`` where it would rewrite); and a
    hand-written pipeline with a full transform rewrites as a declared one does."""
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)

    def enriched(name: str, **options: object) -> Pipeline:
        return sql_pipeline(
            name=name,
            sql=ENRICHED_SQL,
            upstreams={"orders": "order_id", "customers": JOIN},
            target=paths.target(name),
            keys=["order_id"],
            **options,  # type: ignore[arg-type]
        )

    hand_written = replace(
        build_handwritten_registry(paths).pipelines["orders_enriched"],
        name="hand_written",
        target=paths.target("hand_written"),
        full_transform=full_orders_enriched,
        strategy="rewrite",
    )
    registry = Registry(
        upstreams=demo_upstreams(paths),
        pipelines=[
            enriched("rewriting"),  # auto; no pipeline reads it: change feed `any`
            enriched("guarded", change_feed="minimal"),
            hand_written,
        ],
    )
    store = WatermarkStore(paths.control_root)

    def run(name: str, batch_id: str):
        return execute_pipeline(
            spark=spark,
            store=store,
            registry=registry,
            pipeline_name=name,
            batch_id=batch_id,
            run_id="test",
        )

    rewritten = ("rewriting", "hand_written")
    for round_no in range(3):
        if round_no:
            apply_round(spark, paths, round_no)
        look = look_before_planning(registry, Observer(), store, actor="test")
        batch, _ = plan_next(store, look, actor="test")
        assert batch is not None
        outcomes = {}
        for name in batch.pipelines:
            if round_no == 2 and name in rewritten:
                # Killed after the overwrite committed, before the checkpoint: the retry
                # finds the batch's transaction in the target and writes nothing.
                before = RsDeltaTable(paths.target(name)).version()
                with pytest.raises(SimulatedCrash), simulate_crash_at("after_target_commit"):
                    run(name, batch.batch_id)
                assert RsDeltaTable(paths.target(name)).version() == before + 1
                outcomes[name] = run(name, batch.batch_id)
                assert outcomes[name].write is not None
                assert outcomes[name].write.already_applied
                assert RsDeltaTable(paths.target(name)).version() == before + 1
                # Nothing measured by the retry: auto weighs only writes that ran.
                assert store.strategy_runs(name)[-1].batch_id != batch.batch_id
            else:
                outcomes[name] = run(name, batch.batch_id)
        finalize_batch(store, store.get_batch(batch.batch_id), registry=registry, actor="test")
        orders = spark.read.format("delta").load(paths.upstream("orders"))
        customers = spark.read.format("delta").load(paths.upstream("customers"))
        full = full_orders_enriched(orders, customers)
        expected = _rows(full, full.columns)
        for name in registry.pipelines:
            target = spark.read.format("delta").load(paths.target(name))
            assert _rows(target, full.columns) == expected, (name, round_no)
        if not round_no:
            continue
        chosen = {n: o.strategy for n, o in outcomes.items()}
        assert all(c is not None for c in chosen.values())
        # These small tables are read whole: rewritten where the change feed allows it.
        assert chosen["rewriting"].choice.strategy == "rewrite", chosen["rewriting"]
        assert chosen["rewriting"].metadata()["change_feed"] == "any"
        assert chosen["hand_written"].choice.strategy == "rewrite"
        assert chosen["guarded"].choice.strategy == "full", chosen["guarded"]
        assert chosen["guarded"].metadata()["change_feed"] == "minimal"
        for name in rewritten:
            table = DeltaTable.forPath(spark, paths.target(name))
            last = table.history(1).collect()[0]
            assert last["operation"] == "WRITE", (name, last)
            assert last["operationParameters"]["mode"] == "Overwrite"
            log = RsDeltaTable(paths.target(name))
            app_id = f"watermark:{store.root_id()}:{name}"
            assert log.transaction_version(app_id) == batch.write_seq
            stamps = table.toDF().groupBy("_wm_seq", "_wm_batch_id").count().collect()
            assert [(r[0], r[1]) for r in stamps] == [(batch.write_seq, batch.batch_id)]
        guarded = DeltaTable.forPath(spark, paths.target("guarded")).history(1).collect()[0]
        assert guarded["operation"] == "MERGE"
        # A rewrite reads each snapshot whole and never the range: the rows read are the
        # snapshots' (from the log), not the range's change rows; the range it covers stays.
        for report in outcomes["rewriting"].inputs:
            assert report.mode == "SNAPSHOT", report
            planned = batch.inputs[report.upstream]
            assert planned.range is not None
            assert report.start_version == planned.range.start, report
            snapshot = spark.read.format("delta").load(paths.upstream(report.upstream))
            assert report.rows_read == snapshot.count(), report


def test_a_rewrite_of_several_rows_for_one_key_fails_its_write_and_commits_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The rewrite's duplicate check runs inside the write's own job (no persisted copy, no
    summary job): a customer id held twice upstream gives its orders two rows each, the
    write job fails naming one of those keys, and the target keeps its version."""
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    registry = Registry(
        upstreams=demo_upstreams(paths),
        pipelines=[
            sql_pipeline(
                name="enriched",
                sql=ENRICHED_SQL,
                upstreams={"orders": "order_id", "customers": JOIN},
                target=paths.target("enriched"),
                keys=["order_id"],
                strategy="rewrite",
            )
        ],
    )
    store = WatermarkStore(paths.control_root)
    run_cycle(spark, registry, store)  # the first load
    target = paths.target("enriched")
    version = RsDeltaTable(target).version()
    orders = spark.read.format("delta").load(paths.upstream("orders"))
    twice = orders.where("customer_id IS NOT NULL").first()
    assert twice is not None
    duplicate = spark.createDataFrame(
        [(twice["customer_id"], "Twin", "Oslo")], "customer_id long, name string, city string"
    )
    duplicate.write.format("delta").mode("append").save(paths.upstream("customers"))
    look = look_before_planning(registry, Observer(), store, actor="test")
    batch, _ = plan_next(store, look, actor="test")
    assert batch is not None
    with pytest.raises(TerminalError, match=r"several rows for key \{'order_id': \d+\}") as refused:
        execute_pipeline(
            spark=spark,
            store=store,
            registry=registry,
            pipeline_name="enriched",
            batch_id=batch.batch_id,
            run_id="test",
        )
    key = int(str(refused.value).split("'order_id': ")[1].split("}")[0])
    doubled = orders.where(f"customer_id = {twice['customer_id']}").select("order_id")
    assert key in {r[0] for r in doubled.collect()}
    assert RsDeltaTable(target).version() == version  # nothing committed


def test_a_replay_ending_inside_a_batch_the_full_strategy_wrote_isrefused(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Issue 41, sequence 4: batch 2 reads versions 1..3, where key 1 changes (v1) and
    changes back (v2); the `full` strategy writes only the rows whose value differs, so
    key 1 keeps batch 1's position. A replay of versions 1..1 ends inside batch 2 and is
    placed just below it, which that old position does not stop: it wrote key 1's value
    from inside the range (99) over the right one (10), with every command succeeding. It
    is now refused before anything is recorded, naming the batch's end; a replay up to
    that end (placed at batch 2's own position) runs and keeps the target exact."""
    from watermark_dagster.config.upstream import DeltaUpstream
    from watermark_dagster.core.ranges import VersionRange
    from watermark_dagster.errors import ReplayRefusedError
    from watermark_dagster.operations import replay

    up = str(tmp_path / "up")
    spark.createDataFrame([(1, 10), (2, 20), (3, 30)], "id long, value long").write.format(
        "delta"
    ).option("delta.enableChangeDataFeed", "true").save(up)
    pipeline = sql_pipeline(
        name="copied",
        sql="SELECT id, value FROM up",
        upstreams={"up": "id"},
        target=str(tmp_path / "copied"),
        keys=["id"],
        strategy="full",
    )
    registry = Registry(upstreams=[DeltaUpstream(name="up", path=up)], pipelines=[pipeline])
    store = WatermarkStore(str(tmp_path / "control"))
    run_cycle(spark, registry, store)
    table = DeltaTable.forPath(spark, up)
    table.update("id = 1", {"value": "99"})
    table.update("id = 1", {"value": "10"})
    table.update("id = 2", {"value": "21"})
    batch = store.get_batch(run_cycle(spark, registry, store))
    assert str(batch.inputs["up"].range) == str(VersionRange(1, 3))

    with pytest.raises(ReplayRefusedError, match=f"ends inside batch {batch.batch_id}") as e:
        replay.plan_replay(store, registry, "up", VersionRange(1, 1))
    assert "--from-version 1 --to-version 3" in (e.value.fix or "")
    assert [b.batch_id for b in store.batches()] == ["b000002", "b000001"]  # none recorded

    def execute(batch_id: str, pipelines: object) -> list[str | None]:
        execute_pipeline(
            spark=spark,
            store=store,
            registry=registry,
            pipeline_name="copied",
            batch_id=batch_id,
            run_id="test",
        )
        return []

    plan = replay.plan_replay(store, registry, "up", VersionRange(1, 3))
    assert replay.run_replay(store, registry, plan, execute=execute).status.value == "COMPLETED"
    target = spark.read.format("delta").load(str(tmp_path / "copied"))
    assert _rows(target, ["id", "value"]) == [(1, 10), (2, 21), (3, 30)]


def test_a_replay_ending_inside_a_batch_a_rewrite_wrote_runs_and_rolls_nothing_back(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The sequence above with `rewrite`: a rewrite stamps every row with its batch's
    position, so the replay of versions 1..1, placed just below batch 2, is not refused
    (I5) and changes no row: key 1 keeps the right value (10), not the one from inside the
    range (99)."""
    from watermark_dagster.config.upstream import DeltaUpstream
    from watermark_dagster.core.ranges import VersionRange
    from watermark_dagster.operations import replay

    up = str(tmp_path / "up")
    spark.createDataFrame([(1, 10), (2, 20), (3, 30)], "id long, value long").write.format(
        "delta"
    ).option("delta.enableChangeDataFeed", "true").save(up)
    pipeline = sql_pipeline(
        name="copied",
        sql="SELECT id, value FROM up",
        upstreams={"up": "id"},
        target=str(tmp_path / "copied"),
        keys=["id"],
        strategy="rewrite",
    )
    registry = Registry(upstreams=[DeltaUpstream(name="up", path=up)], pipelines=[pipeline])
    store = WatermarkStore(str(tmp_path / "control"))
    run_cycle(spark, registry, store)
    table = DeltaTable.forPath(spark, up)
    table.update("id = 1", {"value": "99"})
    table.update("id = 1", {"value": "10"})
    table.update("id = 2", {"value": "21"})
    batch = store.get_batch(run_cycle(spark, registry, store))
    assert str(batch.inputs["up"].range) == str(VersionRange(1, 3))
    assert [str(r.strategy) for r in store.strategy_runs("copied")] == ["rewrite"]

    def execute(batch_id: str, pipelines: object) -> list[str | None]:
        execute_pipeline(
            spark=spark,
            store=store,
            registry=registry,
            pipeline_name="copied",
            batch_id=batch_id,
            run_id="test",
        )
        return []

    plan = replay.plan_replay(store, registry, "up", VersionRange(1, 1))
    assert replay.run_replay(store, registry, plan, execute=execute).status.value == "COMPLETED"
    target = spark.read.format("delta").load(str(tmp_path / "copied"))
    assert _rows(target, ["id", "value"]) == [(1, 10), (2, 21), (3, 30)]


@pytest.mark.parametrize(
    ("case", "fragment"), [(n, f) for n, _, f in HIDING], ids=[n for n, _, _ in HIDING]
)
def test_what_a_python_full_transform_hides_in_its_plan_is_refused_before_writing(
    spark: SparkSession, tmp_path: Path, case: str, fragment: str
) -> None:
    """The same cases run over Spark Connect in tests/spark/test_engine.py."""
    tiers = tiers_table(spark, tmp_path)
    refused(spark, tmp_path, hiding_pipeline(case, tmp_path, tiers), fragment)
