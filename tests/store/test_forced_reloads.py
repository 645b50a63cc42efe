"""What a plan owes after a forced change abandoned a batch some pipelines had applied:
the reloads persist until a batch plans them, and an upstream shared with a pipeline left
out of a plan does not advance past it. The real store (delta-rs), observations built by
hand (no Spark: no target exists, so no late write is found).

Found by an adversarial review of the reloads: a reload owed by a pipeline that the next
plan could not include was forgotten once any other batch was planned, and the pipeline
then read the abandoned ranges again (an append target twice, I4); and a shared upstream
advanced past a pipeline left out of the plan (I1).
"""

from pathlib import Path

import pytest

from watermark_dagster.config.batch_context import BatchContext
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.core.observations import RegistryObservation
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.core.ranges import ReadMode
from watermark_dagster.core.records import Batch, BatchStatus, CheckpointStatus, WatermarkHow
from watermark_dagster.errors import ReloadHeldError
from watermark_dagster.operations.coordinate import (
    Look,
    finalize_batch,
    hold_unreloadable,
    plan_next,
    reloads_after_abandon,
)
from watermark_dagster.store import WatermarkStore


def _never(batch: BatchContext):  # pragma: no cover - the transforms are never run here
    raise AssertionError("not run")


def _registry(root: Path, **pipelines: tuple[str, ...]) -> Registry:
    upstreams = sorted({u for ups in pipelines.values() for u in ups})
    return Registry(
        upstreams=[
            DeltaUpstream(name=u, path=str(root / u), start_from="latest" if u == "s" else 0)
            for u in upstreams
        ],
        pipelines=[
            Pipeline(
                name=name,
                upstreams=ups,
                target=str(root / "targets" / name),
                keys=("id",),
                transform=_never,
                write="append",
            )
            for name, ups in pipelines.items()
        ],
    )


def _look(registry: Registry, store: WatermarkStore, latest: dict[str, int]) -> Look:
    """What the coordinator's look gives with these latest versions, every upstream
    observed (the observer's part), then the owed reloads and their holds applied."""
    marks = store.committed()
    abandoned, owed = reloads_after_abandon(registry, store, marks)
    inputs = registry.pipeline_inputs()
    observation = RegistryObservation(
        observed={},
        errors={},
        positions=tuple(UpstreamPosition(u, v, None) for u, v in latest.items()),
        runnable=dict(inputs),
        bootstrap=(),  # no pipeline here starts all its upstreams from the beginning
        marks=marks,
        pipeline_inputs=inputs,
    )
    return Look(hold_unreloadable(registry, observation, owed, abandoned), {}, owed)


def _succeed(store: WatermarkStore, pipeline: str, batch: Batch) -> None:
    attempt = store.begin_checkpoint(pipeline, batch.batch_id, run_id="test")
    store.finish_checkpoint(pipeline, batch.batch_id, attempt, CheckpointStatus.SUCCESS)


def _abandon_after_p_applied(tmp_path: Path, **pipelines: tuple[str, ...]):
    """b000001 reads a [5, 7] and x [4, 5]; p applies it, then `watermark set -t x
    --version 5 --force` abandons it with a not advanced (q has not applied it)."""
    registry = _registry(tmp_path, **pipelines)
    store = WatermarkStore(str(tmp_path / "control"))
    for upstream, version in {"a": 4, "s": 2, "x": 3, "y": 1}.items():
        if upstream in registry.upstreams:
            store.set_watermark(upstream, version, how=WatermarkHow.MANUAL_SET, actor="setup")
    first, _ = plan_next(store, _look(registry, store, {"a": 7, "s": 2, "x": 5, "y": 1}), actor="t")
    assert first is not None
    _succeed(store, "p", first)
    finalize_batch(store, first, registry=registry, actor="t")
    expected = store.preview_watermark("x", 5, how=WatermarkHow.MANUAL_SET)
    change = store.set_watermark(
        "x", 5, how=WatermarkHow.MANUAL_SET, actor="op", force=True, expected=expected
    )
    assert change.abandoned == (first.batch_id,)
    return registry, store


def test_a_reload_that_cannot_be_planned_yet_is_carried_by_the_batches_after_it(
    tmp_path: Path,
) -> None:
    """Pipeline p (reading a, and s which starts from `latest`) owes a reload it cannot have, so a
    and s are held; r's batch is planned meanwhile. The hold must outlive that batch: once
    it completed, a is still held instead of being read again from 5 by p."""
    registry, store = _abandon_after_p_applied(tmp_path, p=("a", "s"), q=("a",), r=("x",))
    look = _look(registry, store, {"a": 7, "s": 2, "x": 8})
    assert look.reloads_owed == ("p",)
    assert isinstance(look.observation.blocked["a"], ReloadHeldError)
    second, created = plan_next(store, look, actor="t")
    assert created
    assert second is not None
    assert second.pipelines == ("r",)
    assert second.reloads_owed == ("p",)
    _succeed(store, "r", second)
    finalize_batch(store, second, registry=registry, actor="t")
    assert store.get_batch(second.batch_id).status is BatchStatus.COMPLETED

    again = _look(registry, store, {"a": 7, "s": 2, "x": 8})
    assert again.reloads_owed == ("p",)
    assert set(again.observation.blocked) == {"a", "s"}
    assert "`watermark reset -t a` and `watermark reset -t s`" in str(
        again.observation.blocked["a"]
    )
    third, _ = plan_next(store, again, actor="t")
    assert third is None  # before: b000003 planned p over a [5, 7] again, not as a reload

    # The operator resets them: p reloads a as a snapshot, and owes nothing more.
    for upstream in ("a", "s"):
        expected = store.preview_watermark(upstream, None, how=WatermarkHow.RESET)
        store.set_watermark(upstream, None, how=WatermarkHow.RESET, actor="op", expected=expected)
    after_reset = _look(registry, store, {"a": 7, "s": 2, "x": 8})
    assert after_reset.observation.blocked == {}
    reload, _ = plan_next(store, after_reset, actor="t")
    assert reload is not None
    assert "p" in reload.full_load
    assert reload.reloads_owed == ()


@pytest.mark.parametrize("hold", [True, False], ids=["held", "unavailable"])
def test_an_upstream_shared_with_a_pipeline_left_out_of_a_plan_does_not_advance(
    tmp_path: Path, hold: bool
) -> None:
    """Pipeline q reads a and y; a is held (p owes a reload it cannot have) or unavailable, so q is
    left out of the next plan. y, which r also reads, is planned NOOP: it cannot advance
    past the changes q has not applied. Before, r's batch advanced y from 1 to 6 and q
    never read y's 2..6 (I1)."""
    registry, store = _abandon_after_p_applied(tmp_path, p=("a", "s"), q=("a", "y"), r=("x", "y"))
    look = _look(registry, store, {"a": 7, "s": 2, "x": 8, "y": 6})
    if not hold:
        observation = look.observation
        unavailable = {p: ups for p, ups in observation.runnable.items() if "a" not in ups}
        look = Look(
            RegistryObservation(
                observed={},
                errors={"a": "not a Delta table"},
                positions=tuple(p for p in observation.positions if p.name != "a"),
                runnable=unavailable,
                marks=observation.marks,
                pipeline_inputs=observation.pipeline_inputs,
            ),
            {},
            (),
        )
    assert "q" not in look.observation.runnable
    second, _ = plan_next(store, look, actor="t")
    assert second is not None
    assert second.pipelines == ("r",)
    assert second.inputs["y"].mode is ReadMode.NOOP
    assert second.inputs["x"].range is not None
    _succeed(store, "r", second)
    finalize_batch(store, second, registry=registry, actor="t")
    assert store.committed_versions()["y"] == 1
    assert store.committed_versions()["x"] == 8
