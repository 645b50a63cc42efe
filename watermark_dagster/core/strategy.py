"""How a batch of a pipeline with a full transform is computed: the choices
(:class:`Strategy`, and what a target's change feed allows, :class:`ChangeFeed`); the
strategy decided once, before the transform runs, as an immutable :class:`StrategyChoice`;
the rule that decides it (:func:`choose_strategy`, :func:`decide_strategy`) from the Delta
log's sizes and the pipeline's measured runs (:class:`StrategyRun`); and
:class:`MeasuredStrategy`, what a batch ran and what that cost, as the run records it.
Plain Python, no Dagster, Spark or delta-rs.

A declared batch may end up running another strategy than the one decided (the whole form
past ``INLINE_KEYS_LIMIT`` touched keys, :mod:`~watermark_dagster.read.derive`): that is a
new value (:meth:`StrategyChoice.switched_to_whole`), which the run records; the decision
itself is never changed.
"""

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol


class Strategy(StrEnum):
    """How a pipeline with a full transform brings its target up to a batch
    (``strategy=``): a declared pipeline, or a hand-written one that also gives
    ``full_transform=``.

    * ``incremental``: recompute only the keys the batch touched (derived from the full
      transform and the key paths), or run the hand-written transform.
    * ``maintain``: for declared SQL whose aggregates are sums over one upstream's rows
      (:mod:`~watermark_dagster.config.maintained`), fold the batch's change rows into a
      stored per-group state and recompute the touched keys from it, never reading the
      aggregated upstream's rows again. Where ``auto`` would run ``incremental`` it runs
      ``maintain`` first, then measures ``incremental`` once and keeps the cheaper.
    * ``full``: run the full transform over the pinned snapshots and MERGE only the rows
      that differ from the target (its change feed carries only keys that changed).
    * ``rewrite``: run the full transform over the pinned snapshots and overwrite the
      target with it in one idempotent commit: what a recompute costs, but the target's
      change feed then holds every row (deleted and inserted again), so only a target whose
      change feed may say so (``change_feed="any"``, :class:`ChangeFeed`) is rewritten.
    * ``auto`` (default): the strategy the pipeline's own recent batches measured as
      cheapest; before they have, the size rule: the whole form (``rewrite``, or ``full``
      for a ``minimal`` change feed) when the batch changed a large share of the
      upstreams' bytes or the snapshots are small, or touched more keys than the driver
      collects, else ``incremental``; each form is measured once before the measurements
      decide (:func:`decide_strategy` says how).

    A replay always runs ``incremental``: its ranges are older than the target.
    """

    AUTO = "auto"
    INCREMENTAL = "incremental"
    MAINTAIN = "maintain"
    FULL = "full"
    REWRITE = "rewrite"


class ChangeFeed(StrEnum):
    """What a pipeline's target's change data feed promises its readers (``change_feed=``).

    * ``minimal``: a batch's commits carry only the keys whose rows changed, as an
      incremental batch's do; the ``rewrite`` strategy never runs. The default for a target
      that a pipeline of the registry reads as an upstream: its batches then read only
      what changed.
    * ``any``: a batch may rewrite the whole target, so its change feed may hold every row
      (each deleted and inserted again). The default for a target no pipeline of the
      registry reads; set ``change_feed="minimal"`` when something outside it reads the
      target's change feed.
    """

    MINIMAL = "minimal"
    ANY = "any"


@dataclass(frozen=True)
class StrategyRun:
    """One past batch of a pipeline as ``auto`` weighs it: the strategy it ran,
    what that cost, and the sizes it was decided on.

    Attributes:
        batch_id: the batch.
        strategy: ``incremental``, ``maintain``, ``full`` or ``rewrite``.
        seconds: the transform and the write.
        changed_bytes: bytes the batch's ranges changed (None when the log could not say).
        snapshot_bytes: bytes of the pinned snapshots (None when unknown).
        switched: the batch began incremental and switched to ``strategy`` past
            ``INLINE_KEYS_LIMIT`` touched keys: an incremental attempt, as ``auto`` weighs it.
        rebuilt: a ``maintain`` batch that rebuilt its state from the snapshot (its first,
            or the first after batches of another strategy): a first load of the state,
            not a measure of what maintaining costs.
    """

    batch_id: str
    strategy: Strategy
    seconds: float
    changed_bytes: int | None = None
    snapshot_bytes: int | None = None
    switched: bool = False
    rebuilt: bool = False


# `auto`'s size rule: the whole form (``rewrite``, or ``full`` for a ``minimal`` change
# feed) when the batch's ranges changed at least this share of the pinned snapshots'
# bytes, or when the snapshots are this small in all: below it, the incremental form's
# fixed cost (collecting the touched keys, Delta's MERGE) is more than reading everything
# once (benchmarks/declared.py, --strategy).
AUTO_FULL_FRACTION = 0.2
AUTO_FULL_BELOW_BYTES = 16 * 1024 * 1024
# With measured incremental runs and none of the whole form, `auto` runs the whole form
# once to measure it when the snapshots hold fewer bytes than this; past it a recompute is
# too dear to try on the off chance.
AUTO_MEASURE_WHOLE_BELOW_BYTES = 1024**3


# `auto` weighs at most this many of each strategy's newest measured runs (their median).
MEASURED_RUNS = 5


@dataclass(frozen=True)
class StrategyChoice:
    """The strategy one batch of a pipeline with a full transform runs with, and why.

    Attributes:
        strategy: ``incremental``, ``full`` or ``rewrite`` (never ``auto``: that is what
            was decided).
        reason: why, in words (shown in the log line and the materialization metadata).
        changed_bytes: bytes of the files the batch's ranges added, removed or wrote as
            change data, over every upstream (None when the log cannot say).
        snapshot_bytes: bytes of the pinned snapshots' files, over every upstream.
        estimates: ``auto``'s estimate of each strategy's seconds for this batch, from the
            pipeline's measured history (empty when it decided without one).
        fixed: the strategy may not change during the batch (a replay: its snapshots are
            older than the target, which a full diff would roll back).
        whole: the form that reads everything this pipeline may use: ``rewrite`` when its
            target's change feed may hold every row, else ``full``. ``auto`` switches an
            incremental batch to it when the batch touches more keys than the driver
            collects.
        switched: the batch began incremental and switched to the whole form past the
            touched keys the driver collects (:meth:`switched_to_whole`).
        rebuilt: a ``maintain`` batch rebuilt a state from the snapshot
            (:meth:`maintained`); ``auto`` does not take its seconds as maintaining's cost.
    """

    strategy: Strategy
    reason: str
    changed_bytes: int | None = None
    snapshot_bytes: int | None = None
    estimates: Mapping[str, float] = field(default_factory=dict[str, float])
    fixed: bool = False
    whole: Strategy = Strategy.FULL
    switched: bool = False
    rebuilt: bool = False

    def maintained(self, states: str, *, rebuilt: bool) -> "StrategyChoice":
        """This ``maintain`` choice as its batch ran it: the reason saying what became of
        each state (``states``), marked ``rebuilt`` when a state was rebuilt."""
        return replace(self, reason=f"{self.reason}; {states}", rebuilt=rebuilt)

    def fell_back(self, why: str) -> "StrategyChoice":
        """This ``auto`` choice of ``maintain`` as a batch runs it when the batch shows it
        cannot maintain (``why``): ``incremental``, the reason saying why."""
        return replace(
            self,
            strategy=Strategy.INCREMENTAL,
            reason=f"{self.reason}; not maintained: {why}",
        )

    def switched_to_whole(self, keys_limit: int) -> "StrategyChoice":
        """This choice as an ``auto`` batch that touched more than ``keys_limit`` keys
        (``INLINE_KEYS_LIMIT``) runs it: the whole form instead, marked as switched, the
        reason saying why before what was decided."""
        return replace(
            self,
            strategy=self.whole,
            switched=True,
            reason=f"auto: the batch touched more than {keys_limit:,} keys "
            f"(INLINE_KEYS_LIMIT); {self.reason}",
        )

    def metadata(self, seconds: float | None = None) -> dict[str, object]:
        """The choice as materialization metadata, with what the batch cost when given."""
        found: dict[str, object] = {
            "strategy": str(self.strategy),
            "strategy_reason": self.reason,
            # Whether the target's change feed may hold every row (its readers' promise).
            "change_feed": str(
                ChangeFeed.ANY if self.whole is Strategy.REWRITE else ChangeFeed.MINIMAL
            ),
        }
        if self.changed_bytes is not None:
            found["changed_bytes"] = self.changed_bytes
        if self.snapshot_bytes is not None:
            found["snapshot_bytes"] = self.snapshot_bytes
        if seconds is not None:
            found["strategy_seconds"] = seconds
        for strategy, estimate in sorted(self.estimates.items()):
            found[f"strategy_estimate_{strategy}"] = estimate
        return found


@dataclass(frozen=True)
class MeasuredStrategy:
    """What one batch ran and what that cost: the strategy it was computed with (the one
    decided, or the whole form the transform switched to) beside the seconds measured.

    Attributes:
        choice: the strategy the batch ran.
        seconds: the transform and the write.
    """

    choice: StrategyChoice
    seconds: float

    def metadata(self) -> dict[str, object]:
        """The strategy and its cost as materialization metadata."""
        return self.choice.metadata(self.seconds)

    def measured(self) -> dict[str, object]:
        """What this batch measured, as recorded in the pipeline's ``PIPELINE_SUCCEEDED``
        history row for ``auto`` to read back (as a
        :class:`StrategyRun`)."""
        choice = self.choice
        return {
            "strategy": str(choice.strategy),
            "seconds": self.seconds,
            "changed_bytes": choice.changed_bytes,
            "snapshot_bytes": choice.snapshot_bytes,
            **({"switched": True} if choice.switched else {}),
            **({"rebuilt": True} if choice.rebuilt else {}),
        }


class SizedInput(Protocol):
    """An upstream's pinned input as the rule reads it: its sizes from the Delta log."""

    def bytes_estimate(self) -> tuple[int, int] | None:
        """``(bytes the pinned range changed, bytes of the pinned snapshot)``, or None
        when the log cannot say (a cursor upstream)."""
        ...


class StrategyOwner(Protocol):
    """A pipeline as the rule reads it: whether it has a full transform to choose, and
    the strategy configured."""

    @property
    def chooses_strategy(self) -> bool:
        """Declared, or hand-written with a full transform."""
        ...

    @property
    def strategy(self) -> str:
        """``auto``, ``incremental``, ``maintain``, ``full`` or ``rewrite``."""
        ...

    @property
    def maintainable(self) -> bool:
        """Declared SQL whose aggregates a batch can maintain from change rows."""
        ...


def choose_strategy(
    pipeline: StrategyOwner,
    inputs: Mapping[str, SizedInput],
    *,
    replay: bool,
    history: Sequence[StrategyRun] = (),
    change_feed: ChangeFeed = ChangeFeed.MINIMAL,
) -> StrategyChoice | None:
    """How ``pipeline`` computes an incremental batch over ``inputs``, decided from the
    Delta log and the pipeline's measured ``history`` alone (no Spark job); None for a
    hand-written pipeline without a full transform.

    ``incremental``, ``full`` and ``rewrite`` are taken as configured. ``auto`` weighs the
    strategies the target allows: ``rewrite`` only when its ``change_feed`` is ``any``
    (:func:`decide_strategy` says how). A replay is always ``incremental``: its snapshots
    are older than the target, which a full diff or a rewrite would roll back.
    """
    if not pipeline.chooses_strategy:
        return None
    changed, total = _sizes(inputs)
    return decide_strategy(
        Strategy(pipeline.strategy),
        changed,
        total,
        replay=replay,
        history=history,
        rewrite=change_feed is ChangeFeed.ANY,
        maintain=pipeline.maintainable,
    )


def _sizes(inputs: Mapping[str, SizedInput]) -> tuple[int | None, int | None]:
    """The bytes the inputs' ranges changed and the bytes of their snapshots, over every
    upstream (None when the log cannot say for one of them)."""
    estimates = [i.bytes_estimate() for i in inputs.values()]
    if any(e is None for e in estimates):
        return None, None
    known = [e for e in estimates if e is not None]
    return sum(c for c, _ in known), sum(t for _, t in known)


def estimate_seconds(
    history: Sequence[StrategyRun], strategy: Strategy, changed: int, total: int
) -> tuple[float, int] | None:
    """``strategy``'s estimated seconds for a batch that changed ``changed`` bytes of
    ``total`` snapshot bytes, and how many measured runs it rests on: the median of its
    newest ``MEASURED_RUNS`` runs, each run's seconds scaled up by how much larger this
    batch's input to it is (the snapshots' bytes for ``full`` and ``rewrite``, the changed
    bytes for ``incremental``; never scaled down, since a batch's fixed cost does not
    shrink); None when ``history`` holds no run of it.

    A batch that began incremental and switched to the whole form past
    ``INLINE_KEYS_LIMIT`` touched keys is a run of ``incremental``: what trying it cost
    (the touched keys, then the whole form), not a measure of the whole form alone. A
    ``maintain`` batch that rebuilt its state is no measure of ``maintain``: it read the
    whole upstream once, as a first load does."""
    stepwise = strategy in _STEPWISE
    if strategy is Strategy.MAINTAIN:
        mine = [r for r in history if r.strategy is strategy and not r.rebuilt]
    elif stepwise:
        mine = [r for r in history if r.strategy is strategy or r.switched]
    else:
        mine = [r for r in history if r.strategy is strategy and not r.switched]
    runs = mine[-MEASURED_RUNS:]
    if not runs:
        return None
    scaled: list[float] = []
    for run in runs:
        if stepwise:
            now, then = changed, run.changed_bytes
        else:
            now, then = total, run.snapshot_bytes
        scaled.append(run.seconds * (max(1.0, now / then) if then else 1.0))
    return statistics.median(scaled), len(runs)


# The forms whose cost follows the bytes a batch changed, not the snapshots' bytes.
_STEPWISE = (Strategy.INCREMENTAL, Strategy.MAINTAIN)


def decide_strategy(
    configured: Strategy,
    changed: int | None,
    total: int | None,
    *,
    replay: bool,
    history: Sequence[StrategyRun] = (),
    rewrite: bool = False,
    maintain: bool = False,
) -> StrategyChoice:
    """:func:`choose_strategy`'s rule, from the bytes the ranges changed, the snapshots'
    bytes (None when unknown), the pipeline's measured runs (oldest first) and whether its
    target may be rewritten.

    ``auto`` compares the step forms (``incremental``, and first ``maintain`` when the
    pipeline is ``maintain``-able) with the whole one (``rewrite`` when allowed, else
    ``full``):

    * once a step form and the whole one have measured runs, the cheapest of the
      estimates (:func:`estimate_seconds`) of every allowed strategy with runs; but while
      a step form wins and the other has no measured run, that one, once (a ``maintain``
      batch that rebuilt its state is not yet a measure, so it runs once more);
    * with neither measured, the size rule: the whole form when the ranges changed at least
      ``AUTO_FULL_FRACTION`` of the snapshots' bytes or the snapshots hold less than
      ``AUTO_FULL_BELOW_BYTES``, else ``incremental``;
    * with one measured, the other once: the step form whenever the ranges changed less
      than ``AUTO_FULL_FRACTION`` of the snapshots' bytes (small snapshots too), the whole
      form where the size rule would pick it, and anyway under
      ``AUTO_MEASURE_WHOLE_BELOW_BYTES`` (a first load is not a measure of ``rewrite``: it
      also creates and lays out the target, on a cold session).
    """
    whole = Strategy.REWRITE if rewrite else Strategy.FULL
    if replay:
        return StrategyChoice(
            Strategy.INCREMENTAL, "a replay", changed, total, fixed=True, whole=whole
        )
    if configured is not Strategy.AUTO:
        return StrategyChoice(
            configured, f"configured strategy={configured}", changed, total, whole=whole
        )
    if changed is None or total is None:
        return StrategyChoice(
            Strategy.INCREMENTAL,
            "auto: sizes unknown (a cursor upstream)",
            changed,
            total,
            whole=whole,
        )
    steps = [Strategy.MAINTAIN, Strategy.INCREMENTAL] if maintain else [Strategy.INCREMENTAL]
    allowed = [*steps, Strategy.FULL, *([Strategy.REWRITE] if rewrite else [])]
    measured = {s: cost for s in allowed if (cost := estimate_seconds(history, s, changed, total))}
    share = changed / total if total else 1.0
    if total < AUTO_FULL_BELOW_BYTES:
        sized = f"the snapshots hold {total:,} bytes, under {AUTO_FULL_BELOW_BYTES:,}"
        by_size = whole
    elif share >= AUTO_FULL_FRACTION:
        sized, by_size = f"the ranges changed {share:.1%} of the snapshots' bytes", whole
    else:
        sized = f"the ranges changed {share:.1%} of {total:,} snapshot bytes"
        by_size = steps[0]
    step = next((s for s in steps if s in measured), steps[0])

    def choice(strategy: Strategy, reason: str) -> StrategyChoice:
        estimates = {str(s): round(cost[0], 3) for s, cost in measured.items()}
        return StrategyChoice(
            strategy, f"auto: {reason}", changed, total, estimates=estimates, whole=whole
        )

    if step in measured and whole in measured:
        ranked = sorted(measured, key=lambda s: measured[s][0])
        weighed = " against ".join(f"{s} ~{measured[s][0]:.2f} s" for s in ranked)
        runs = " and ".join(str(measured[s][1]) for s in ranked)
        reason = f"measured {weighed} for this batch's sizes (medians of the newest {runs} runs)"
        untried = [s for s in steps if s not in measured]
        if ranked[0] in steps and untried:
            return choice(untried[0], f"{reason}; measuring {untried[0]} once")
        return choice(ranked[0], reason)
    if whole in measured and share < AUTO_FULL_FRACTION:
        # Also where small snapshots have the size rule pick the whole form: on a target
        # another pipeline reads that form is a full diff, which can cost more than the
        # step form on small targets too (`benchmarks.declared --learn 3` at 200k orders:
        # `declared_minimal` settled on `incremental` for orders_enriched, where the size
        # rule had it run `full` every batch).
        return choice(step, f"{sized}; measuring {step} once")
    if step in measured and by_size in steps and total < AUTO_MEASURE_WHOLE_BELOW_BYTES:
        return choice(whole, f"{sized}; measuring {whole} once")
    return choice(by_size, sized)
