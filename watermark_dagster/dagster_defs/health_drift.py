"""The ``watermark_drift`` check: whether a declared pipeline's newest full batch found
target rows that had drifted from the full transform.

Each batch run of a declared pipeline reports it (:func:`drift_evaluation`), and it can be
run from the UI (:func:`~watermark_dagster.dagster_defs.checks.build_health_checks`).
"""

from collections.abc import Mapping
from typing import Any

from dagster import AssetCheckEvaluation, AssetCheckKey, AssetKey, MetadataValue

from watermark_dagster.dagster_defs.check_family import check_evaluation
from watermark_dagster.dagster_defs.runs import DRIFT_METADATA

DRIFT_CHECK = "watermark_drift"


def drift_result(
    pipeline: str, metadata: Mapping[str, Any] | None
) -> tuple[bool, str, dict[str, Any]]:
    """The ``watermark_drift`` check of ``pipeline`` from its newest materialization's
    ``metadata`` (None: none yet): passed, the description, the check's metadata.

    A full batch of a declared pipeline counts the keys it rewrote that its own changes did
    not touch: rows a recompute gives that the target did not hold although nothing that
    reaches them changed. A wrong incremental derivation leaves such rows, and so does a
    write to the target from outside; the batch writes the correct rows either way.
    """
    drift = _metadata_value((metadata or {}).get(DRIFT_METADATA))
    batch = _metadata_value((metadata or {}).get("batch_id"))
    if drift is None:
        return (
            True,
            f"Pipeline '{pipeline}': drift not measured by its newest batch "
            f"{batch or '(none yet)'} (a `full` batch measures it; an incremental batch "
            "or a rewrite does not compare the target).",
            {},
        )
    sample = _metadata_value((metadata or {}).get(f"{DRIFT_METADATA}_sample")) or []
    meta: dict[str, Any] = {DRIFT_METADATA: drift, "batch_id": batch}
    if not drift:
        return True, f"Pipeline '{pipeline}': no drift found by its full batch {batch}.", meta
    meta[f"{DRIFT_METADATA}_sample"] = MetadataValue.json(sample)
    return (
        False,
        f"Pipeline '{pipeline}': its full batch {batch} found {drift} key(s) whose target row "
        "differed from the full transform although the batch's changes did not touch them "
        f"(e.g. {', '.join(str(k) for k in sample)}): the target had drifted. The batch wrote "
        "the correct rows. Fix: look for writes to the target from outside the pipeline; if "
        "there are none, the incremental derivation missed these keys: report the pipeline's "
        "SQL and key paths, and set strategy: full until it is fixed.",
        meta,
    )


def _metadata_value(entry: object) -> Any:
    return entry.value if isinstance(entry, MetadataValue) else entry


def drift_evaluation(
    key: AssetKey, pipeline: str, metadata: Mapping[str, Any]
) -> AssetCheckEvaluation:
    """The ``watermark_drift`` check evaluated for the materialization a pipeline's run just
    recorded with ``metadata``, as an event of that run."""
    passed, description, meta = drift_result(pipeline, metadata)
    return check_evaluation(AssetCheckKey(key, DRIFT_CHECK), passed, description, meta)
