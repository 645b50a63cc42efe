"""A batch's first attempt marks what its target held (issue 64's attack): a restored
control root runs a batch id and position its earlier life wrote, and only a commit after
the first attempt's mark is that batch's write. Real Delta targets through delta-rs."""

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.core.records import TargetMark, first_mark, running_checkpoint
from watermark_dagster.errors import TargetBoundElsewhereError
from watermark_dagster.frames.delta import existing_target
from watermark_dagster.store.codec import now
from watermark_dagster.write.commits import new_label
from watermark_dagster.write.fences import (
    applied_by_target,
    evidence_in,
    refuse_bound_elsewhere,
    target_mark,
    transaction_app_id,
)

ROOT = "root-1"


def _pipeline(tmp_path: Path) -> Pipeline:
    return Pipeline(
        name="copy",
        upstreams=("src",),
        target=str(tmp_path / "copy"),
        transform=lambda b: b,
        keys=("id",),
    )


def _write(pipeline: Pipeline, batch_id: str, seq: int) -> None:
    """One labelled write of ``batch_id`` at position ``seq``, as a run commits it."""
    write_deltalake(
        pipeline.target,
        pa.table({"id": [seq], "_wm_seq": [seq]}),
        mode="append",
        commit_properties=CommitProperties(
            custom_metadata={"userMetadata": new_label(pipeline.name, batch_id, seq, ROOT)},
            app_transactions=[Transaction(transaction_app_id(pipeline, ROOT), seq)],
        ),
    )


def _table(pipeline: Pipeline):
    table = existing_target(pipeline.target, {})
    assert table is not None
    return table


def test_a_write_of_the_batch_id_before_the_first_attempt_is_not_its_evidence(
    tmp_path: Path,
) -> None:
    """The earlier life wrote b000002 at position 2; the restored root's b000002 began
    after it: neither that label nor the transaction is this batch's write."""
    pipeline = _pipeline(tmp_path)
    _write(pipeline, "b000001", 1)
    _write(pipeline, "b000002", 2)  # the earlier life's batch 2
    mark = target_mark(pipeline, ROOT)
    assert mark == TargetMark(1, 2)
    table = _table(pipeline)
    assert evidence_in(table, pipeline, "b000002", 2, ROOT) is not None  # unmarked: taken
    assert evidence_in(table, pipeline, "b000002", 2, ROOT, since=mark) is None
    attempt = running_checkpoint(pipeline.name, "b000002", 1, run_id="r", at=now(), mark=mark)
    assert applied_by_target(pipeline, "b000002", 2, root=ROOT, attempts=[attempt]) is None
    # Never attempted: nothing of the batch can have landed, whatever the target says.
    assert applied_by_target(pipeline, "b000002", 2, root=ROOT, attempts=[]) is None


def test_a_write_after_the_first_attempt_is_its_evidence(tmp_path: Path) -> None:
    """A run killed after its commit and before its checkpoint: the retry finds it."""
    pipeline = _pipeline(tmp_path)
    _write(pipeline, "b000001", 1)
    mark = target_mark(pipeline, ROOT)
    assert mark == TargetMark(0, 1)
    _write(pipeline, "b000002", 2)  # the first attempt's write
    attempts = [
        running_checkpoint(pipeline.name, "b000002", n, run_id="r", at=now(), mark=m)
        for n, m in ((2, TargetMark(1, 2)), (1, mark))
    ]
    assert first_mark(attempts) == mark
    found = applied_by_target(pipeline, "b000002", 2, root=ROOT, attempts=attempts)
    assert found is not None
    assert "version 1" in found, found
    refuse_bound_elsewhere(
        _table(pipeline), pipeline, "b000002", 2, ROOT, first_attempt=False, first=mark
    )


@pytest.mark.parametrize("first_attempt", [True, False])
def test_a_position_held_at_the_first_attempt_is_refused_on_every_attempt(
    tmp_path: Path, first_attempt: bool
) -> None:
    """Refused on the first attempt, and on a retry too: the retry of a batch whose first
    attempt found the transaction at its position (and may have died before the check)."""
    pipeline = _pipeline(tmp_path)
    _write(pipeline, "b000001", 1)
    _write(pipeline, "b000002", 2)
    mark = target_mark(pipeline, ROOT)
    with pytest.raises(TargetBoundElsewhereError, match="earlier life"):
        refuse_bound_elsewhere(
            _table(pipeline),
            pipeline,
            "b000002",
            2,
            ROOT,
            first_attempt=first_attempt,
            first=mark,
        )
