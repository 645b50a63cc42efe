"""One builder for every family of asset checks this code location defines.

A family is one check (``retention_horizon``, ``watermark_continuity``, ``watermark_lag``,
``watermark_stuck_batch``, ``watermark_drift``) on a set of assets: each check key has a
subject (an upstream, a pipeline's name) and one rule turns the selected subjects into
verdicts. :func:`build_check_family` makes the family's ``multi_asset_check`` (one op
that can run any subset, logging each verdict); :func:`check_result` and
:func:`check_evaluation` are the one form of a verdict, run from the UI or reported by a
sensor. Every check of the location fails with severity ERROR.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    multi_asset_check,
)

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.upstream import Upstream
from watermark_dagster.dagster_defs.names import LocationNames

S = TypeVar("S")

Verdict = tuple[AssetCheckKey, bool, str, dict[str, Any]]
"""One check's outcome: its key, whether it passed, its description and metadata."""


@dataclass(frozen=True)
class CheckFamily(Generic[S]):
    """One check on a set of assets, and how to evaluate it.

    Attributes:
        op: the op's name, before the location's prefix (:class:`LocationNames`).
        description: the op's description.
        subjects: each check key's subject (an upstream, a pipeline name).
        describe: the description of one subject's check spec.
        evaluate: the verdicts of the selected ``(key, subject)`` pairs (sorted by key).
        needs_store: the op requires the location's control tables resource.
    """

    op: str
    description: str
    subjects: Mapping[AssetCheckKey, S]
    describe: Callable[[S], str]
    evaluate: Callable[
        [AssetCheckExecutionContext, Sequence[tuple[AssetCheckKey, S]]], Iterator[Verdict]
    ]
    needs_store: bool = True


def build_check_family(family: CheckFamily[S], names: LocationNames) -> list[AssetChecksDefinition]:
    """The family's checks as one ``multi_asset_check`` (none when it has no subject)."""
    if not family.subjects:
        return []

    @multi_asset_check(
        specs=[
            AssetCheckSpec(key.name, asset=key.asset_key, description=family.describe(s))
            for key, s in family.subjects.items()
        ],
        can_subset=True,
        name=names.of(family.op),
        description=family.description,
        required_resource_keys={names.store_resource} if family.needs_store else set(),
    )
    def checks(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
        selected = [(k, family.subjects[k]) for k in sorted_keys(context.selected_asset_check_keys)]
        for key, passed, description, metadata in family.evaluate(context, selected):
            (context.log.info if passed else context.log.error)(description)
            yield check_result(key, passed, description, metadata)

    return [checks]


def checks_on(
    check: str, keys: Mapping[str, AssetKey], subjects: Iterable[S], name: Callable[[S], str]
) -> dict[AssetCheckKey, S]:
    """Check key -> subject, for ``check`` on the asset of each subject (by its name)."""
    return {AssetCheckKey(keys[name(s)], check): s for s in subjects}


def versioned(upstreams: Iterable[Upstream]) -> list[Upstream]:
    """The upstreams with versions (a cursor upstream has none to lose or lag by)."""
    return [u for u in upstreams if not u.is_cursor]


def delta_logged(upstreams: Iterable[Upstream]) -> list[Upstream]:
    """The upstreams whose versions are a Delta table's own (a landing folder's are its
    file numbers: no log or change files to lose to retention)."""
    return [u for u in versioned(upstreams) if not isinstance(u, LandingUpstream)]


def sorted_keys(keys: Iterable[AssetCheckKey]) -> list[AssetCheckKey]:
    """Check keys in a stable order (by their user string)."""
    return sorted(keys, key=lambda k: k.to_user_string())


def check_result(
    key: AssetCheckKey, passed: bool, description: str, metadata: dict[str, Any]
) -> AssetCheckResult:
    """A verdict as the result of a check run."""
    return AssetCheckResult(
        asset_key=key.asset_key,
        check_name=key.name,
        passed=passed,
        severity=AssetCheckSeverity.ERROR,
        description=description,
        metadata=metadata,
    )


def check_evaluation(
    key: AssetCheckKey, passed: bool, description: str, metadata: dict[str, Any]
) -> AssetCheckEvaluation:
    """A verdict as an evaluation a sensor or an asset reports without a check run."""
    return AssetCheckEvaluation(
        asset_key=key.asset_key,
        check_name=key.name,
        passed=passed,
        severity=AssetCheckSeverity.ERROR,
        description=description,
        metadata=metadata,
    )
