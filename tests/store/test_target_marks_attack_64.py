"""Issue 64's independent attack on target marks (real Delta targets through delta-rs, no
JVM): a restored control root, upgraded, whose target an older release wrote under its
legacy transaction id (naming no root)."""

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.errors import TargetBoundElsewhereError
from watermark_dagster.frames.delta import existing_target
from watermark_dagster.write.fences import legacy_app_id, refuse_bound_elsewhere, target_mark

ROOT = "root-1"


def test_a_retry_of_a_batch_refused_at_a_legacy_position_is_refused_again(
    tmp_path: Path,
) -> None:
    """An older release wrote the target up to position 2 under its legacy transaction id.
    The control root, put back from a copy holding position 1 and upgraded, plans b000002
    at position 2: its first attempt is refused. Its retry (``run --retry``) was let
    through ("this root's own history from before the upgrade"), and the append path then
    skipped it as applied (the legacy transaction is at 2): the batch's rows never loaded,
    exit 0. The first attempt's mark shows it ran on this release, which writes under the
    root's own id: a legacy transaction at the batch's position was there before it."""
    pipeline = Pipeline(
        name="copy",
        upstreams=("src",),
        target=str(tmp_path / "copy"),
        transform=lambda b: b,
        keys=("id",),
    )
    for seq in (1, 2):  # the older release's writes
        write_deltalake(
            pipeline.target,
            pa.table({"id": [seq], "_wm_seq": [seq]}),
            mode="append",
            commit_properties=CommitProperties(
                app_transactions=[Transaction(legacy_app_id(pipeline), seq)]
            ),
        )
    first = target_mark(pipeline, ROOT)  # the restored root's first attempt at b000002
    table = existing_target(pipeline.target, {})
    assert table is not None
    with pytest.raises(TargetBoundElsewhereError):
        refuse_bound_elsewhere(table, pipeline, "b000002", 2, ROOT, first_attempt=True)
    with pytest.raises(TargetBoundElsewhereError):
        refuse_bound_elsewhere(
            table, pipeline, "b000002", 2, ROOT, first_attempt=False, first=first
        )
    # A retry whose first attempt an older release made (no mark) keeps the older rule:
    # its own history from before the upgrade.
    refuse_bound_elsewhere(table, pipeline, "b000002", 2, ROOT, first_attempt=False)
