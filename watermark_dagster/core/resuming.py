"""Resuming an open batch: request its unfinished pipelines again, wait, or call it stuck.

Plain Python, no Dagster: the coordinator sensor turns Dagster's runs of the batch
partition into :class:`BatchRunFacts`, and the store's checkpoints into the pipelines
that succeeded (:func:`watermark_dagster.core.outcomes.succeeded_pipelines`); this module
decides, and the sensor only turns the decision into a run request or a skip reason.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class TerminalFailure:
    """A pipeline run of a batch that failed with an error retrying cannot fix.

    Attributes:
        pipeline: the pipeline that raised it (None when unknown).
        error: the error's class name, e.g. ``UpstreamSchemaChangedError``.
        message: the error's message, ending with its own fix.
    """

    pipeline: str | None
    error: str
    message: str


@dataclass(frozen=True)
class ResumeDecision:
    """What the coordinator does with an open batch that still has unfinished pipelines:
    request them again (``run``), or stop and report the batch stuck (``stuck``, the
    reason an operator reads, naming what to do)."""

    run: bool
    stuck: str | None = None


RESUME_HINT = "resume it with `watermark run --retry` or re-execute the batch partition from the UI"


def decide_resume(
    batch_id: str,
    todo: Sequence[str],
    *,
    failed_runs: int,
    max_attempts: int,
    terminal: TerminalFailure | None,
) -> ResumeDecision:
    """Whether to request the unfinished pipelines ``todo`` of ``batch_id`` again.

    A terminal failure (a recreated or unreadable upstream, an incompatible schema change,
    a transform that returns the wrong thing) stops the batch at the first attempt: running
    it again would fail the same way. Other failures are retried until ``max_attempts``
    runs of the batch failed.
    """
    if terminal is not None:
        who = f"pipeline '{terminal.pipeline}'" if terminal.pipeline else "a pipeline"
        return ResumeDecision(
            run=False,
            stuck=(
                f"batch {batch_id} is stuck: {who} failed with {terminal.error}, which "
                f"retrying cannot fix; it was not retried. {terminal.message} "
                f"(If the fix leaves the batch open, {RESUME_HINT}.)"
            ),
        )
    if failed_runs >= max_attempts:
        return ResumeDecision(
            run=False,
            stuck=(
                f"batch {batch_id} is stuck: {failed_runs} failed runs (max_attempts="
                f"{max_attempts}); pipelines {list(todo)} unfinished. Fix the cause shown by "
                f"the failed runs, then {RESUME_HINT}."
            ),
        )
    return ResumeDecision(run=True)


@dataclass(frozen=True)
class BatchRunFacts:
    """The runs of one batch partition, as the coordinator needs them.

    Attributes:
        in_flight: ids of runs not finished yet (queued and submitted ones included: a run
            the daemon just submitted must not be submitted again).
        failed: runs of the batch that failed or were canceled (a run whose worker died
            counts as failed).
        last_attempt: the highest attempt number among the runs (0 before the first).
        terminal: set when the newest finished run failed with a terminal error.
    """

    in_flight: tuple[str, ...] = ()
    failed: int = 0
    last_attempt: int = 0
    terminal: TerminalFailure | None = None


def unfinished_pipelines(
    planned: Sequence[str], succeeded: Collection[str], known: Collection[str]
) -> list[str]:
    """The pipelines of a batch still to run: planned, not succeeded, and still declared
    (``known``; a pipeline removed from the code location since cannot be requested).

    What the coordinator requests again and ``watermark run --retry`` runs once more.
    """
    return [p for p in planned if p not in succeeded and p in known]


class ResumeAction(StrEnum):
    """What one coordinator tick does with the open batch."""

    WAIT = "wait"
    """A run of the batch is in flight: request nothing."""
    DONE = "done"
    """Every pipeline succeeded: nothing to request, the finalizer's turn."""
    RUN = "run"
    """Request the unfinished pipelines (attempt ``last_attempt + 1``)."""
    STUCK = "stuck"
    """Retrying cannot help or the attempts are used up: request nothing, report it."""


@dataclass(frozen=True)
class ResumeStep:
    """The coordinator's decision for the open batch on one tick.

    Attributes:
        action: what to do.
        batch_id: the open batch.
        pipelines: RUN: the pipelines to request; STUCK: those left unfinished.
        attempt: RUN: the attempt number of the run to request.
        reason: why nothing is requested (WAIT, DONE, STUCK): the tick's skip reason.
        stuck_key: STUCK: ``batch:last_attempt``, the same on every tick until a new
            attempt runs, so the stuck state is recorded once.
        facts: the runs the decision was made from.
    """

    action: ResumeAction
    batch_id: str
    pipelines: tuple[str, ...] = ()
    attempt: int | None = None
    reason: str | None = None
    stuck_key: str | None = None
    facts: BatchRunFacts = BatchRunFacts()

    @property
    def is_stuck(self) -> bool:
        """True when the batch is stuck (the headless runner stops its cycle on it)."""
        return self.action is ResumeAction.STUCK


def resume_step(
    batch_id: str,
    todo: Sequence[str],
    runs: BatchRunFacts,
    *,
    max_attempts: int,
    retry: bool = False,
) -> ResumeStep:
    """Decide what the coordinator does with open batch ``batch_id``.

    Args:
        batch_id: the open batch.
        todo: its unfinished pipelines (:func:`unfinished_pipelines`).
        runs: its runs.
        max_attempts: failed runs after which the batch is stuck.
        retry: request the unfinished pipelines whatever the failed runs
            (``watermark run --retry``: the operator fixed the cause).
    """
    if runs.in_flight and not retry:
        return ResumeStep(
            ResumeAction.WAIT,
            batch_id,
            reason=f"batch {batch_id}: run(s) {list(runs.in_flight)} in flight",
            facts=runs,
        )
    if not todo:
        return ResumeStep(
            ResumeAction.DONE,
            batch_id,
            reason=f"batch {batch_id}: all pipelines succeeded; finalizer's turn",
            facts=runs,
        )
    if not retry:
        decision = decide_resume(
            batch_id,
            todo,
            failed_runs=runs.failed,
            max_attempts=max_attempts,
            terminal=runs.terminal,
        )
        if not decision.run:
            return ResumeStep(
                ResumeAction.STUCK,
                batch_id,
                pipelines=tuple(todo),
                reason=decision.stuck,
                stuck_key=f"{batch_id}:{runs.last_attempt}",
                facts=runs,
            )
    return ResumeStep(
        ResumeAction.RUN,
        batch_id,
        pipelines=tuple(todo),
        attempt=runs.last_attempt + 1,
        facts=runs,
    )
