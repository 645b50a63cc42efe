"""How a declared pipeline's batch picks its strategy (no JVM): the rule of
``read/derive.py`` over the sizes the Delta log gives, and the configuration's checks.
That the strategies give equal targets, and what a full recompute writes, is proven with
Spark in ``tests/spark/test_declared.py`` and ``tests/model/test_declared.py``."""

from dataclasses import replace

import pytest

from watermark_dagster.config.pipeline import Strategy, pipeline, sql_pipeline
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.read.derive import (
    AUTO_FULL_BELOW_BYTES,
    AUTO_FULL_FRACTION,
    decide_strategy,
)

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


@pytest.mark.parametrize("configured", [Strategy.INCREMENTAL, Strategy.FULL])
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
    choice.seconds = 1.5
    assert choice.metadata() == {
        "strategy": "full",
        "strategy_reason": choice.reason,
        "changed_bytes": 5,
        "snapshot_bytes": 10,
        "strategy_seconds": 1.5,
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
