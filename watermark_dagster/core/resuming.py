"""Resuming an open batch: request its unfinished pipelines again, wait, or call it stuck.

Plain Python, no Dagster: the coordinator sensor turns Dagster's runs of the batch
partition into :class:`BatchRunFacts`, and the store's checkpoints into the pipelines
that succeeded (:func:`watermark_dagster.core.outcomes.succeeded_pipelines`); this module
decides, and the sensor only turns the decision into a run request or a skip reason.

A run that **failed** raised an error (a pipeline's step failed): it spends one of the
batch's ``max_attempts``. A run that **died** raised nothing: its process was killed (the
kernel's out-of-memory killer, a lost node, a restarted daemon), its run worker was lost or
its Spark engine went away. A death is a crash, not a verdict on the batch: it is retried
after a backoff and does not spend ``max_attempts``; only ``max_deaths`` deaths of one batch
(a batch that always kills its process) stop it, with a reason that names the deaths.
"""

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_MAX_DEATHS = 10
DEFAULT_DEATH_BACKOFF_SECONDS = 10.0
# The longest wait between two deaths, however many there were.
MAX_DEATH_BACKOFF_SECONDS = 300.0
# The most of an error's text a stuck reason quotes.
ERROR_CHARS = 600


@dataclass(frozen=True)
class RetryPolicy:
    """How often an open batch is run again before it is called stuck.

    Attributes:
        max_attempts: runs of the batch that may fail (raise an error) before it is stuck.
        max_deaths: runs of the batch that may die (killed, worker lost) before it is
            stuck; deaths do not count towards ``max_attempts``.
        death_backoff_seconds: the wait after the first death before the batch is
            requested again; it doubles with every further death, up to
            :data:`MAX_DEATH_BACKOFF_SECONDS` (0: no wait).
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_deaths: int = DEFAULT_MAX_DEATHS
    death_backoff_seconds: float = DEFAULT_DEATH_BACKOFF_SECONDS

    def __post_init__(self) -> None:
        backoff = self.death_backoff_seconds
        if self.max_attempts < 1 or self.max_deaths < 1 or not 0 <= backoff < math.inf:
            raise ValueError(
                f"RetryPolicy(max_attempts={self.max_attempts}, max_deaths={self.max_deaths}, "
                f"death_backoff_seconds={self.death_backoff_seconds}): the maximums must be "
                "at least 1 and the backoff 0 or more."
            )

    def backoff(self, deaths: int) -> float:
        """Seconds to wait after the newest of ``deaths`` deaths before running again."""
        if deaths < 1 or self.death_backoff_seconds <= 0:
            return 0.0
        return min(MAX_DEATH_BACKOFF_SECONDS, self.death_backoff_seconds * 2 ** (deaths - 1))


@dataclass(frozen=True)
class RunDeath:
    """One run of a batch that died: what is known of how.

    Attributes:
        run_id: the Dagster run.
        how: what ended it, as known: ``killed by SIGKILL (signal 9)`` when a supervising
            process saw the exit status, ``its worker process host:pid is gone`` when only
            its absence was seen, or the message of Dagster's run monitoring.
        at: when the death was seen (epoch seconds).
    """

    run_id: str
    how: str
    at: float

    def describe(self) -> str:
        """``run 1a2b3c4d: killed by SIGKILL (signal 9)``."""
        return f"run {self.run_id[:8]}: {self.how}"


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
    deaths: Sequence[RunDeath] = (),
    max_deaths: int = DEFAULT_MAX_DEATHS,
    last_error: str | None = None,
) -> ResumeDecision:
    """Whether to request the unfinished pipelines ``todo`` of ``batch_id`` again.

    A terminal failure (a recreated or unreadable upstream, an incompatible schema change,
    a transform that returns the wrong thing) stops the batch at the first attempt: running
    it again would fail the same way. Other failures are retried until ``max_attempts``
    runs of the batch failed. Runs that died (``deaths``, newest first) do not count as
    failures; ``max_deaths`` of them stop the batch too.
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
        if last_error and len(last_error) > ERROR_CHARS:
            last_error = last_error[: ERROR_CHARS - 3] + "..."
        error = f" The last error: {last_error}" if last_error else ""
        return ResumeDecision(
            run=False,
            stuck=(
                f"batch {batch_id} is stuck: {failed_runs} failed runs (max_attempts="
                f"{max_attempts}); pipelines {list(todo)} unfinished.{error} Fix the cause "
                f"shown by the failed runs, then {RESUME_HINT}."
            ),
        )
    if len(deaths) >= max_deaths:
        reason = died_too_often(batch_id, todo, deaths, max_deaths)
        return ResumeDecision(run=False, stuck=f"{reason} Fix: {DIED_FIX}")
    return ResumeDecision(run=True)


DIED_FIX = (
    "a run that always dies is most often out of memory: give the driver more "
    "(spark.driver.memory in WATERMARK_SPARK_CONF, or the run's container limit), or make "
    "the batch smaller (max_versions_per_batch on its upstreams; an open batch keeps its "
    "ranges, so abandon it with `watermark reset --force` first). Otherwise look for what "
    "killed the process (the host's kernel log, the run launcher, a deploy). Then "
    f"{RESUME_HINT}."
)


def died_too_often(
    batch_id: str, todo: Sequence[str], deaths: Sequence[RunDeath], max_deaths: int
) -> str:
    """The stuck reason of a batch whose runs died ``max_deaths`` times (newest first),
    without its fix (:data:`DIED_FIX`)."""
    shown = "; ".join(d.describe() for d in deaths[:3])
    more = f"; and {len(deaths) - 3} more" if len(deaths) > 3 else ""
    return (
        f"batch {batch_id} is stuck: its runs died {len(deaths)} times (max_deaths="
        f"{max_deaths}) without raising an error, pipelines {list(todo)} unfinished: "
        f"{shown}{more}."
    )


@dataclass(frozen=True)
class BatchRunFacts:
    """The runs of one batch partition, as the coordinator needs them.

    Attributes:
        in_flight: ids of runs not finished yet (queued and submitted ones included: a run
            the daemon just submitted must not be submitted again).
        failed: runs of the batch that failed (raised an error) or were canceled.
        last_attempt: the highest attempt number among the runs (0 before the first).
        terminal: set when the newest finished run failed with a terminal error.
        deaths: the runs of the batch that died, newest first (not counted in ``failed``).
        last_died: whether the newest finished run is a death (a backoff applies).
        last_error: the newest failed run's error, when known.
    """

    in_flight: tuple[str, ...] = ()
    failed: int = 0
    last_attempt: int = 0
    terminal: TerminalFailure | None = None
    deaths: tuple[RunDeath, ...] = ()
    last_died: bool = False
    last_error: str | None = None


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
    """A run of the batch is in flight, or a backoff after a death runs: request nothing."""
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
        retry_at: WAIT after a death: when the backoff ends (epoch seconds).
    """

    action: ResumeAction
    batch_id: str
    pipelines: tuple[str, ...] = ()
    attempt: int | None = None
    reason: str | None = None
    stuck_key: str | None = None
    facts: BatchRunFacts = BatchRunFacts()
    retry_at: float | None = None

    @property
    def is_stuck(self) -> bool:
        """True when the batch is stuck (the headless runner stops its cycle on it)."""
        return self.action is ResumeAction.STUCK


def resume_step(
    batch_id: str,
    todo: Sequence[str],
    runs: BatchRunFacts,
    *,
    policy: RetryPolicy,
    now: float | None = None,
    retry: bool = False,
) -> ResumeStep:
    """Decide what the coordinator does with open batch ``batch_id``.

    Args:
        batch_id: the open batch.
        todo: its unfinished pipelines (:func:`unfinished_pipelines`).
        runs: its runs.
        policy: the failed runs and deaths after which the batch is stuck, and the backoff
            after a death.
        now: the time (epoch seconds) the backoff after a death is measured against; None
            waits for no backoff (the headless runner: the operator's command is the retry).
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
            max_attempts=policy.max_attempts,
            terminal=runs.terminal,
            deaths=runs.deaths,
            max_deaths=policy.max_deaths,
            last_error=runs.last_error,
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
        if runs.last_died and now is not None:
            newest = runs.deaths[0]
            retry_at = newest.at + policy.backoff(len(runs.deaths))
            if now < retry_at:
                return ResumeStep(
                    ResumeAction.WAIT,
                    batch_id,
                    pipelines=tuple(todo),
                    reason=(
                        f"batch {batch_id}: {newest.describe()} (death {len(runs.deaths)} of "
                        f"at most {policy.max_deaths}); requested again in "
                        f"{retry_at - now:.0f} s (backoff)"
                    ),
                    facts=runs,
                    retry_at=retry_at,
                )
    return ResumeStep(
        ResumeAction.RUN,
        batch_id,
        pipelines=tuple(todo),
        attempt=runs.last_attempt + 1,
        facts=runs,
    )
