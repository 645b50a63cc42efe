"""How a declared pipeline's batch picks its strategy (no JVM): the rule of
``core/strategy.py`` over the sizes the Delta log gives, the immutable value it decides and
what a run records beside it, and the configuration's checks.
That the strategies give equal targets, and what a full recompute writes, is proven with
Spark in ``tests/spark/test_declared.py`` and ``tests/model/test_declared.py``."""

import json
from dataclasses import FrozenInstanceError, replace

import pytest

from watermark_dagster.config.pipeline import (
    ChangeFeed,
    Pipeline,
    Strategy,
    pipeline,
    sql_pipeline,
)
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.strategy import (
    AUTO_FULL_BELOW_BYTES,
    AUTO_FULL_FRACTION,
    AUTO_MEASURE_WHOLE_BELOW_BYTES,
    MEASURED_RUNS,
    MeasuredStrategy,
    StrategyChoice,
    StrategyRun,
    choose_strategy,
    decide_strategy,
    estimate_seconds,
)
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.store import codec
from watermark_dagster.write.duplicate_keys import DUPLICATE_KEY_MARKER, duplicate_key_in

BIG = 100 * AUTO_FULL_BELOW_BYTES


@pytest.mark.parametrize(
    ("changed", "total", "expected", "reason"),
    [
        (int(BIG * 0.001), BIG, Strategy.INCREMENTAL, "changed 0.1% of"),
        (int(BIG * AUTO_FULL_FRACTION), BIG, Strategy.FULL, "changed 20.0% of the snapshots"),
        (BIG, BIG, Strategy.FULL, "changed 100.0%"),
        (1, AUTO_FULL_BELOW_BYTES - 1, Strategy.FULL, "under"),
        (None, None, Strategy.INCREMENTAL, "sizes unknown"),
    ],
)
def test_auto_picks_by_the_share_changed_and_the_snapshots_size(
    changed: int | None, total: int | None, expected: Strategy, reason: str
) -> None:
    choice = decide_strategy(Strategy.AUTO, changed, total, replay=False)
    assert choice.strategy is expected
    assert reason in choice.reason
    assert choice.changed_bytes == changed
    assert choice.snapshot_bytes == total


@pytest.mark.parametrize("configured", [Strategy.INCREMENTAL, Strategy.FULL, Strategy.REWRITE])
def test_a_configured_strategy_is_kept_whatever_the_sizes(configured: Strategy) -> None:
    for changed in (0, BIG):
        choice = decide_strategy(configured, changed, BIG, replay=False)
        assert choice.strategy is configured
        assert choice.reason == f"configured strategy={configured}"


@pytest.mark.parametrize("configured", list(Strategy))
def test_a_replay_is_always_incremental(configured: Strategy) -> None:
    # Its snapshots are older than the target: a full diff would roll the target back.
    assert decide_strategy(configured, BIG, BIG, replay=True).strategy is Strategy.INCREMENTAL


def test_the_metadata_names_the_choice_its_reason_sizes_and_cost() -> None:
    choice = decide_strategy(Strategy.AUTO, 5, 10, replay=False)
    decided = {
        "strategy": "full",
        "strategy_reason": choice.reason,
        "change_feed": "minimal",
        "changed_bytes": 5,
        "snapshot_bytes": 10,
    }
    assert choice.metadata() == decided
    # What the run cost is recorded beside the decision, not written into it.
    assert MeasuredStrategy(choice, 1.5).metadata() == decided | {"strategy_seconds": 1.5}
    assert choice.metadata() == decided


def test_a_decision_is_immutable_and_a_switch_is_a_new_value() -> None:
    """The decision the batch context carries cannot be changed by the transform: past
    INLINE_KEYS_LIMIT an `auto` batch runs the whole form as a new value, which says so,
    and the one decided stays as it was."""
    decided = decide_strategy(Strategy.AUTO, 1, MID, replay=False, rewrite=True)
    assert decided.strategy is Strategy.INCREMENTAL
    with pytest.raises(FrozenInstanceError):
        decided.strategy = Strategy.REWRITE  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        decided.seconds = 1.0  # type: ignore[attr-defined]
    switched = decided.switched_to_whole(50_000)
    assert (switched.strategy, switched.switched) == (Strategy.REWRITE, True)
    assert switched.reason == (
        f"auto: the batch touched more than 50,000 keys (INLINE_KEYS_LIMIT); {decided.reason}"
    )
    assert (switched.changed_bytes, switched.snapshot_bytes) == (1, MID)
    assert (decided.strategy, decided.switched) == (Strategy.INCREMENTAL, False)
    minimal = decide_strategy(Strategy.AUTO, 1, MID, replay=False).switched_to_whole(2)
    assert minimal.strategy is Strategy.FULL
    measured = MeasuredStrategy(switched, 2.5)
    with pytest.raises(FrozenInstanceError):
        measured.seconds = 3.0  # type: ignore[misc]
    assert measured.measured() == {
        "strategy": "rewrite",
        "seconds": 2.5,
        "changed_bytes": 1,
        "snapshot_bytes": MID,
        "switched": True,
    }


def test_a_strategy_is_checked_when_the_registry_loads() -> None:
    with pytest.raises(ConfigurationError, match="strategy"):
        sql_pipeline(
            name="totals",
            sql="SELECT customer_id FROM payments GROUP BY customer_id",
            upstreams={"payments": "customer_id"},
            target="/lake/totals",
            keys=["customer_id"],
            strategy="sometimes",  # type: ignore[arg-type]
        )

    @pipeline(upstreams=["up"], target="/lake/out", keys=["id"])
    def copy(batch):
        return batch["up"].changes

    with pytest.raises(ConfigurationError, match="hand-written and sets strategy='full'"):
        replace(copy, strategy="full")


def test_a_hand_written_pipeline_chooses_once_it_gives_a_full_transform() -> None:
    def full_copy(up):
        return up

    @pipeline(upstreams=["up"], target="/lake/out", keys=["id"])
    def copy(batch):
        return batch["up"].changes

    assert choose_strategy(copy, {}, replay=False) is None  # nothing to choose between
    chooser = replace(copy, full_transform=full_copy, strategy="incremental")
    assert chooser.chooses_strategy
    choice = choose_strategy(chooser, {}, replay=False)
    assert choice is not None
    assert choice.strategy is Strategy.INCREMENTAL
    assert choice.reason == "configured strategy=incremental"
    # The full transform is checked as a declared one is: one parameter per upstream.
    with pytest.raises(ConfigurationError, match=r"parameter\(s\) \['other'\] that name no"):
        replace(copy, full_transform=lambda up, other: up)
    # A full batch merges the rows that differ: only for a merging pipeline.
    with pytest.raises(ConfigurationError, match="write='append'"):
        replace(copy, full_transform=full_copy, write="append")
    declared = sql_pipeline(
        name="totals",
        sql="SELECT customer_id FROM payments GROUP BY customer_id",
        upstreams={"payments": "customer_id"},
        target="/lake/totals",
        keys=["customer_id"],
    )
    with pytest.raises(ConfigurationError, match="declared and also gives full_transform="):
        replace(declared, full_transform=lambda payments: payments)


def _runs(*measured: tuple[Strategy, float, int, int]) -> list[StrategyRun]:
    return [
        StrategyRun(f"b{i:06d}", strategy, seconds, changed, total)
        for i, (strategy, seconds, changed, total) in enumerate(measured, 1)
    ]


def test_auto_picks_the_strategy_its_history_measured_cheaper() -> None:
    # By size alone this batch would be incremental (0.1% of a large snapshot); the
    # pipeline's own runs say full costs less.
    changed, total = int(BIG * 0.001), BIG
    history = _runs(
        (Strategy.INCREMENTAL, 8.0, changed, total),
        (Strategy.FULL, 3.0, changed, total),
        (Strategy.INCREMENTAL, 9.0, changed, total),
    )
    choice = decide_strategy(Strategy.AUTO, changed, total, replay=False, history=history)
    assert choice.strategy is Strategy.FULL
    assert choice.estimates == {"full": 3.0, "incremental": 8.5}
    assert "measured full ~3.00 s against incremental ~8.50 s" in choice.reason
    assert choice.metadata()["strategy_estimate_incremental"] == 8.5
    # The other way round it keeps incremental, even on a snapshot under the size limit.
    cheap = _runs((Strategy.INCREMENTAL, 1.0, 1, 10), (Strategy.FULL, 4.0, 1, 10))
    small = decide_strategy(Strategy.AUTO, 1, 10, replay=False, history=cheap)
    assert small.strategy is Strategy.INCREMENTAL


def test_a_run_is_scaled_up_to_a_larger_batch_and_never_down() -> None:
    # full was measured on a snapshot a quarter of today's: 2 s becomes 8 s, above
    # incremental's 5 s. A run measured on more changed bytes than today's is not scaled
    # down (a batch's fixed cost does not shrink).
    history = _runs(
        (Strategy.FULL, 2.0, 10, BIG // 4),
        (Strategy.INCREMENTAL, 5.0, 1_000, BIG),
    )
    choice = decide_strategy(Strategy.AUTO, 10, BIG, replay=False, history=history)
    assert choice.estimates == {"full": 8.0, "incremental": 5.0}
    assert choice.strategy is Strategy.INCREMENTAL
    assert estimate_seconds(history, Strategy.FULL, 10, BIG // 8) == (2.0, 1)


def test_only_the_newest_runs_count() -> None:
    old_and_slow = [(Strategy.FULL, 100.0, 1, BIG)] * 3
    recent = [(Strategy.FULL, 1.0, 1, BIG)] * MEASURED_RUNS
    history = _runs(*old_and_slow, *recent, (Strategy.INCREMENTAL, 2.0, 1, BIG))
    assert estimate_seconds(history, Strategy.FULL, 1, BIG) == (1.0, MEASURED_RUNS)


# Large enough for the size rule to pick incremental at 0.1%, small enough to try the whole
# form once.
MID = 10 * AUTO_FULL_BELOW_BYTES


@pytest.mark.parametrize("rewrite", [False, True])
def test_one_form_measured_alone_has_the_other_measured_once(rewrite: bool) -> None:
    whole = Strategy.REWRITE if rewrite else Strategy.FULL
    changed = int(MID * 0.001)
    # The whole form measured alone: the size rule's incremental batch is run, and
    # measured.
    measured_whole = _runs((whole, 1.0, changed, MID))
    first = decide_strategy(
        Strategy.AUTO, changed, MID, replay=False, history=measured_whole, rewrite=rewrite
    )
    assert first.strategy is Strategy.INCREMENTAL
    assert "measuring incremental once" in first.reason
    assert first.estimates == {str(whole): 1.0}
    # Incremental measured alone: the whole form is run once to measure it...
    measured_incremental = _runs((Strategy.INCREMENTAL, 9.0, changed, MID))
    second = decide_strategy(
        Strategy.AUTO, changed, MID, replay=False, history=measured_incremental, rewrite=rewrite
    )
    assert second.strategy is whole
    assert f"measuring {whole} once" in second.reason
    # ... but not over snapshots too large to recompute on the off chance.
    huge = AUTO_MEASURE_WHOLE_BELOW_BYTES
    kept = decide_strategy(
        Strategy.AUTO,
        int(huge * 0.001),
        huge,
        replay=False,
        history=_runs((Strategy.INCREMENTAL, 9.0, changed, MID)),
        rewrite=rewrite,
    )
    assert kept.strategy is Strategy.INCREMENTAL
    # With both measured, the cheaper runs.
    both = decide_strategy(
        Strategy.AUTO,
        changed,
        MID,
        replay=False,
        history=[*measured_incremental, *measured_whole],
        rewrite=rewrite,
    )
    assert both.strategy is whole
    assert both.estimates == {str(whole): 1.0, "incremental": 9.0}


@pytest.mark.parametrize("rewrite", [False, True])
def test_small_snapshots_measure_the_step_form_once_after_the_whole_one(rewrite: bool) -> None:
    """The size rule runs small snapshots whole; once that is measured, incremental runs
    once too, and the cheaper of the two is kept (a full diff of a small target read by
    other pipelines can cost more than incremental: `benchmarks.declared --learn 3`)."""
    whole = Strategy.REWRITE if rewrite else Strategy.FULL
    small = AUTO_FULL_BELOW_BYTES // 2
    changed = small // 100
    assert decide_strategy(
        Strategy.AUTO, changed, small, replay=False, rewrite=rewrite
    ).strategy is (whole)
    measured_whole = _runs((whole, 17.0, changed, small))
    once = decide_strategy(
        Strategy.AUTO, changed, small, replay=False, history=measured_whole, rewrite=rewrite
    )
    assert once.strategy is Strategy.INCREMENTAL
    assert once.reason.endswith("measuring incremental once"), once.reason
    # Then the measures decide, either way.
    for incremental, kept in ((10.0, Strategy.INCREMENTAL), (30.0, whole)):
        history = [*measured_whole, *_runs((Strategy.INCREMENTAL, incremental, changed, small))]
        decided = decide_strategy(
            Strategy.AUTO, changed, small, replay=False, history=history, rewrite=rewrite
        )
        assert decided.strategy is kept
    # A batch that changed a large share of the snapshots stays whole.
    large = decide_strategy(
        Strategy.AUTO, small // 2, small, replay=False, history=measured_whole, rewrite=rewrite
    )
    assert large.strategy is whole


def test_rewrite_takes_full_s_place_only_where_the_change_feed_may_hold_every_row() -> None:
    # The size rule's whole form.
    for changed, total in ((BIG, BIG), (1, AUTO_FULL_BELOW_BYTES - 1)):
        assert decide_strategy(Strategy.AUTO, changed, total, replay=False).strategy is (
            Strategy.FULL
        )
        allowed = decide_strategy(Strategy.AUTO, changed, total, replay=False, rewrite=True)
        assert allowed.strategy is Strategy.REWRITE
        assert allowed.whole is Strategy.REWRITE
    # Measured runs of a rewrite (an earlier change_feed: any) are not weighed for a
    # minimal target: full is, against incremental.
    changed = int(MID * 0.001)
    history = _runs(
        (Strategy.REWRITE, 0.5, changed, MID),
        (Strategy.FULL, 6.0, changed, MID),
        (Strategy.INCREMENTAL, 4.0, changed, MID),
    )
    minimal = decide_strategy(Strategy.AUTO, changed, MID, replay=False, history=history)
    assert minimal.strategy is Strategy.INCREMENTAL
    assert "rewrite" not in minimal.estimates
    anything = decide_strategy(
        Strategy.AUTO, changed, MID, replay=False, history=history, rewrite=True
    )
    assert anything.strategy is Strategy.REWRITE
    assert anything.estimates == {"rewrite": 0.5, "full": 6.0, "incremental": 4.0}
    assert anything.reason.startswith("auto: measured rewrite ~0.50 s against incremental")
    # A replay never rewrites: its snapshots are older than the target.
    replayed = decide_strategy(Strategy.REWRITE, BIG, BIG, replay=True, rewrite=True)
    assert replayed.strategy is Strategy.INCREMENTAL


@pytest.mark.parametrize("configured", [Strategy.INCREMENTAL, Strategy.FULL])
def test_history_moves_neither_a_configured_strategy_nor_a_replay(configured: Strategy) -> None:
    history = _runs((Strategy.INCREMENTAL, 1.0, 1, BIG), (Strategy.FULL, 50.0, 1, BIG))
    assert decide_strategy(configured, 1, BIG, replay=False, history=history).strategy is (
        configured
    )
    flipped = _runs((Strategy.INCREMENTAL, 50.0, 1, BIG), (Strategy.FULL, 1.0, 1, BIG))
    replayed = decide_strategy(Strategy.AUTO, 1, BIG, replay=True, history=flipped)
    assert replayed.strategy is Strategy.INCREMENTAL


def _totals(**options: object) -> Pipeline:
    return sql_pipeline(
        name="totals",
        sql="SELECT customer_id, SUM(amount) AS total FROM payments GROUP BY customer_id",
        upstreams={"payments": "customer_id"},
        target="/lake/totals",
        keys=["customer_id"],
        **options,  # type: ignore[arg-type]
    )


def test_a_change_feed_is_minimal_where_a_pipeline_of_the_registry_reads_the_target() -> None:
    payments = DeltaUpstream(name="payments", path="/lake/payments")
    totals_upstream = DeltaUpstream(name="totals_up", path="/lake/totals")

    @pipeline(upstreams=["totals_up"], target="/lake/ranked", keys=["customer_id"])
    def ranked(batch):
        return batch["totals_up"].changes

    alone = Registry(upstreams=[payments], pipelines=[_totals()])
    assert alone.change_feed("totals") is ChangeFeed.ANY
    read = Registry(upstreams=[payments, totals_upstream], pipelines=[_totals(), ranked])
    assert read.change_feed("totals") is ChangeFeed.MINIMAL
    assert read.change_feed("ranked") is ChangeFeed.ANY
    # Declared on the pipeline, it is kept either way: something outside the registry may
    # read an unread target's change feed, and a reader may accept every row changing.
    kept = Registry(upstreams=[payments], pipelines=[_totals(change_feed="minimal")])
    assert kept.change_feed("totals") is ChangeFeed.MINIMAL
    accepted = Registry(
        upstreams=[payments, totals_upstream],
        pipelines=[_totals(strategy="rewrite", change_feed="any"), ranked],
    )
    assert accepted.change_feed("totals") is ChangeFeed.ANY
    # strategy=rewrite on a target a pipeline reads, without saying so, is refused.
    with pytest.raises(ConfigurationError, match="upstream 'totals_up' of pipeline 'ranked'"):
        Registry(
            upstreams=[payments, totals_upstream], pipelines=[_totals(strategy="rewrite"), ranked]
        )


def test_a_change_feed_is_checked_with_the_strategy() -> None:
    with pytest.raises(ConfigurationError, match=r"change_feed 'all' is not one of"):
        _totals(change_feed="all")
    with pytest.raises(ConfigurationError, match="strategy='rewrite' and change_feed='minimal'"):
        _totals(strategy="rewrite", change_feed="minimal")
    assert _totals(change_feed="ANY").change_feed is ChangeFeed.ANY


def test_the_key_a_rewrite_s_write_job_failed_at_is_read_from_spark_s_error() -> None:
    """Spark's error text for the rewrite's duplicate check, as PySpark raises it locally
    and over Spark Connect (the marker and the key as JSON inside a longer message)."""
    local = Exception(
        "An error occurred while calling o123.save.\n: org.apache.spark.SparkRuntimeException: "
        f'[USER_RAISED_EXCEPTION] {DUPLICATE_KEY_MARKER}{{"order_id":42,"region":null}} '
        "SQLSTATE: P0001\n\tat org.apache.spark..."
    )
    assert duplicate_key_in(local) == {"order_id": 42, "region": None}
    connect = Exception(f'[USER_RAISED_EXCEPTION] {DUPLICATE_KEY_MARKER}{{"id":"a}}b"}}')
    assert duplicate_key_in(connect) == {"id": "a}b"}
    assert duplicate_key_in(Exception("[DELTA_CONCURRENT_APPEND] another writer")) is None
    # Cut short (a message Spark truncated): still named, as text.
    cut = duplicate_key_in(Exception(f'{DUPLICATE_KEY_MARKER}{{"id": 4'))
    assert cut == {"key": '{"id": 4'}


def test_a_batch_that_switched_past_the_inline_keys_limit_counts_as_an_incremental_try() -> None:
    """An incremental batch that touched more keys than the driver holds switched to the
    whole form; it priced incremental (the touched keys, then the whole form), so it is
    weighed as an incremental run, and the size rule does not send every batch down the
    same road to switch again."""
    changed = int(MID * 0.05)  # under AUTO_FULL_FRACTION: the size rule says incremental
    tried = StrategyRun("b000001", Strategy.REWRITE, 5.0, changed, MID, switched=True)
    plain = StrategyRun("b000002", Strategy.REWRITE, 2.0, changed, MID)
    choice = decide_strategy(
        Strategy.AUTO, changed, MID, replay=False, history=[tried, plain], rewrite=True
    )
    assert choice.strategy is Strategy.REWRITE
    assert choice.estimates == {"incremental": 5.0, "rewrite": 2.0}
    # Without it, the rewrite alone measured would have the next batch try incremental.
    alone = decide_strategy(
        Strategy.AUTO, changed, MID, replay=False, history=[plain], rewrite=True
    )
    assert alone.strategy is Strategy.INCREMENTAL
    # The switch is recorded with the run and read back from its history row.
    switched = StrategyChoice(Strategy.REWRITE, "auto: ...", changed, MID, switched=True)
    measured = MeasuredStrategy(switched, 5.0).measured()
    row = {"batch_id": "b000001", "detail": json.dumps({"strategy": measured})}
    assert codec.strategy_run(row) == tried
