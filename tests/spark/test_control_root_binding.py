"""A target belongs to one control root (DESIGN.md): its Delta transaction and commit labels
name the root, and a target holding a position this root did not schedule (a new root over
another root's targets, a root restored from an older copy, an older release's transaction
ahead of the batch) is refused by `watermark run` before anything is skipped or written;
the fix it prints converges the target to a recompute."""

import json
import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable as RsDeltaTable

from tests.support.spec_lake import Lake, commit_rows, up_copy_lake

REFUSED = "TargetBoundElsewhereError"


def _runner(lake: Lake, dagster_home: Path):
    """Run batches in this process until idle (the tests' own session), as `watermark run`
    would in a child."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    from tests.support.lakes import defs_from
    from watermark_dagster.dagster_defs.headless import HeadlessRunner

    def run_until_idle() -> int:
        instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
        try:
            return len(HeadlessRunner(defs_from(lake.spec), instance).run_until_idle().completed)
        finally:
            instance.dispose()

    return run_until_idle


def _ids(spark, lake: Lake) -> list[int]:
    target = str(lake.root / "up_copy")
    return sorted(r["id"] for r in spark.read.format("delta").load(target).collect())


def _three_batches(spark, tmp_path: Path, dagster_home: Path) -> tuple[Lake, Path]:
    """Upstream ``up`` and its copy after three batches: a first load of ids 0..2, then
    ids 3 and 4 one version per batch. Returns the lake and a copy of its control root
    taken after the first batch."""
    lake = up_copy_lake(tmp_path, dagster_home, spark_master="local[1]")
    lake.spec["upstreams"][0]["max_versions_per_batch"] = 1
    run_until_idle = _runner(lake, dagster_home)
    assert run_until_idle() == 1
    copy = tmp_path / "control_after_batch_1"
    shutil.copytree(tmp_path / "control", copy)
    commit_rows(tmp_path / "up", [3])
    commit_rows(tmp_path / "up", [4])
    assert run_until_idle() == 2
    assert _ids(spark, lake) == [0, 1, 2, 3, 4]
    return lake, copy


def _refused_run(spark, lake: Lake, *, names: tuple[str, ...], positions: tuple[str, ...]) -> None:
    """`watermark run` refuses the batch loudly: exit non-zero, the error names the
    target, both positions and the fix; the target is unchanged and no watermark moved."""
    target = str(lake.root / "up_copy")
    before_version = RsDeltaTable(target).version()
    before_ids = _ids(spark, lake)
    before_marks = lake.store.committed_versions()
    refused = lake.cli("run", "--json")
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0, out
    assert REFUSED in out, out
    for text in (target, "up_copy", *positions, "move", *names):
        assert text in out, (text, out)
    assert "skipped by Delta" not in out, out
    assert "watermark reset -t up --force --yes" in out, out
    assert RsDeltaTable(target).version() == before_version
    assert _ids(spark, lake) == before_ids
    assert lake.store.committed_versions() == before_marks
    # Nothing was taken as applied: no pipeline succeeded for the refused batch.
    store = lake.store
    newest = store.newest_scheduled()
    assert newest is not None
    done = [c for c in store.checkpoints(batch_id=newest.batch_id) if c.status == "SUCCESS"]
    assert done == [], done


def _fix_and_converge(spark, lake: Lake, tmp_path: Path) -> None:
    """The printed fix really works: the target moved aside, `watermark reset -t up --force`
    abandons the refused batch (a new root's first batch, a full load, is left open), and
    `watermark run --retry` loads the target in full from the upstream, which now holds
    every id."""
    shutil.move(str(lake.root / "up_copy"), str(tmp_path / "up_copy.aside"))
    reset = lake.cli("reset", "-t", "up", "--force", "--yes", "--reason", "adopt the target")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    fixed = lake.cli("run", "--retry", "--json")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert json.loads(fixed.stdout)["completed"], fixed.stdout
    assert _ids(spark, lake) == [0, 1, 2, 3, 4, 5, 6]
    assert lake.store.committed_versions()["up"] == 6


@pytest.mark.spark
def test_a_new_control_root_over_written_targets_is_refused(
    spark, tmp_path: Path, dagster_home: Path
) -> None:
    lake, _ = _three_batches(spark, tmp_path, dagster_home)
    old_root = lake.store.root_id()
    shutil.rmtree(tmp_path / "control")  # a fresh control root; the target stays
    commit_rows(tmp_path / "up", [5])
    commit_rows(tmp_path / "up", [6])
    new_root = lake.store.root_id()
    assert new_root != old_root
    # The old root's transaction is at 3; the new root's first batch at 1.
    _refused_run(
        spark, lake, names=(old_root, new_root), positions=("at position 3", "is at position 1")
    )
    _fix_and_converge(spark, lake, tmp_path)


@pytest.mark.spark
def test_a_control_root_restored_from_an_older_copy_is_refused(
    spark, tmp_path: Path, dagster_home: Path
) -> None:
    lake, copy = _three_batches(spark, tmp_path, dagster_home)
    root = lake.store.root_id()
    shutil.rmtree(tmp_path / "control")
    shutil.copytree(copy, tmp_path / "control")  # the copy taken after batch 1 put back
    assert lake.store.root_id() == root  # a copy keeps the root's identity
    commit_rows(tmp_path / "up", [5])
    commit_rows(tmp_path / "up", [6])
    # The root's own transaction is at 3; the restored root's next batch at 2.
    _refused_run(
        spark, lake, names=(root, "restored"), positions=("at position 3", "is at position 2")
    )
    _fix_and_converge(spark, lake, tmp_path)


def _older_release_target(spark, path: str, name: str, ids: list[int], seq: int) -> None:
    """A target as an older release wrote it: its transaction ``watermark:<pipeline>`` at
    ``seq``, its label naming no control root."""
    from watermark_dagster.write.commits import labelled_commits

    rows = spark.createDataFrame([(i, i * 10) for i in ids], "id long, value long")
    label = f"watermark pipeline={name} batch=b{seq:06d} seq={seq} 0123456789ab"
    with labelled_commits(spark, label):
        (
            rows.write.format("delta")
            .mode("append")
            .option("txnAppId", f"watermark:{name}")
            .option("txnVersion", seq)
            .save(path)
        )


@pytest.mark.spark
def test_an_older_release_transaction_is_this_roots_only_below_the_batch(
    spark, tmp_path: Path
) -> None:
    from watermark_dagster.config.pipeline import Pipeline
    from watermark_dagster.errors import TargetBoundElsewhereError
    from watermark_dagster.write.fences import check_target_bound, transaction_app_id
    from watermark_dagster.write.targets import write_target

    path = str(tmp_path / "appended")
    pipeline = Pipeline(
        name="appended",
        upstreams=("src",),
        target=path,
        transform=lambda batch: batch,
        write="append",
    )
    _older_release_target(spark, path, "appended", [1, 2, 3], seq=3)
    root = "0f0f0f0f-root"
    # Ahead of the batch (a new root's batch 2 over an older release's position 3), or at
    # it on a first attempt: refused, naming the older release and both positions.
    for seq, first in ((2, True), (2, False), (3, True)):
        with pytest.raises(TargetBoundElsewhereError) as refused:
            check_target_bound(pipeline, f"b{seq:06d}", seq, root, first_attempt=first)
        text = str(refused.value)
        for part in (path, "older release", "at position 3", f"is at position {seq}", root):
            assert part in text, (part, text)
        assert refused.value.versions == (
            f"target position=3, batch position={seq}, target root=none, this root={root}"
        )
    version = RsDeltaTable(path).version()
    # A retry at its position is the older release's write of this root's batch: applied,
    # and nothing appended twice.
    check_target_bound(pipeline, "b000003", 3, root, first_attempt=False)
    again = write_target(
        spark,
        spark.createDataFrame([(3, 30)], "id long, value long"),
        pipeline,
        batch_id="b000003",
        write_seq=3,
        full_load=False,
        retried=True,
        root=root,
    )
    assert again.already_applied
    assert RsDeltaTable(path).version() == version
    # Below the batch: adopted; the next write carries this root's transaction.
    check_target_bound(pipeline, "b000004", 4, root, first_attempt=True)
    fourth = write_target(
        spark,
        spark.createDataFrame([(4, 40)], "id long, value long"),
        pipeline,
        batch_id="b000004",
        write_seq=4,
        full_load=False,
        root=root,
    )
    assert fourth.committed
    assert not fourth.already_applied
    log = RsDeltaTable(path)
    assert log.transaction_version(transaction_app_id(pipeline, root)) == 4
    newest = log.history(1)[0]
    assert str(newest["userMetadata"]).startswith(
        f"watermark pipeline=appended batch=b000004 root={root} "
    )
    # This root's own retry of batch 4 is still already applied (I4); another root's
    # batch 4 is refused (its newest labelled write is this root's).
    retried = write_target(
        spark,
        spark.createDataFrame([(4, 40)], "id long, value long"),
        pipeline,
        batch_id="b000004",
        write_seq=4,
        full_load=False,
        retried=True,
        root=root,
    )
    assert retried.already_applied
    assert RsDeltaTable(path).version() == log.version()
    with pytest.raises(TargetBoundElsewhereError, match="by control root 0f0f0f0f-root"):
        check_target_bound(pipeline, "b000005", 5, "another-root", first_attempt=True)
    ids = sorted(r["id"] for r in spark.read.format("delta").load(path).collect())
    assert ids == [1, 2, 3, 4]


@pytest.mark.spark
def test_a_new_control_root_is_refused_after_a_hundred_unlabelled_target_commits(
    spark, tmp_path: Path, dagster_home: Path
) -> None:
    from watermark_dagster.write.commits import RECENT_COMMITS

    lake, _ = _three_batches(spark, tmp_path, dagster_home)
    old_root = lake.store.root_id()
    target = str(lake.root / "up_copy")
    for i in range(RECENT_COMMITS + 1):  # commits no pipeline labels (a property, OPTIMIZE)
        spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('owner.note' = '{i}')")
    shutil.rmtree(tmp_path / "control")  # a fresh control root; the target stays
    commit_rows(tmp_path / "up", [5])
    commit_rows(tmp_path / "up", [6])
    new_root = lake.store.root_id()
    assert new_root != old_root
    _refused_run(
        spark, lake, names=(old_root, new_root), positions=("at position 3", "is at position 1")
    )


@pytest.mark.spark
def test_a_target_another_roots_pipeline_of_another_name_wrote_is_refused(
    spark, tmp_path: Path
) -> None:
    from watermark_dagster.config.pipeline import Pipeline
    from watermark_dagster.errors import TargetBoundElsewhereError
    from watermark_dagster.write.fences import check_target_bound
    from watermark_dagster.write.targets import write_target

    path = str(tmp_path / "shared")

    def pipeline(name: str) -> Pipeline:
        return Pipeline(
            name=name, upstreams=("src",), target=path, transform=lambda b: b, keys=("id",)
        )

    rows = spark.createDataFrame([(1, 10, "insert", 1)], "id long, value long, "
                                 "_change_type string, _commit_version long")  # fmt: skip
    write_target(
        spark, rows, pipeline("theirs"), batch_id="b000007", write_seq=7, full_load=True,
        root="root-a",
    )  # fmt: skip
    # Issue 64's attack: the binding looked at labels of this pipeline's name only, and the
    # merge guard then compared positions of two roots.
    with pytest.raises(TargetBoundElsewhereError) as refused:
        check_target_bound(pipeline("ours"), "b000001", 1, "root-b", first_attempt=True)
    text = str(refused.value)
    for part in (path, "control root root-a", "theirs's batch b000007", "watermark:root-a:theirs"):
        assert part in text, (part, text)


@pytest.mark.spark
def test_a_restored_root_refused_once_is_not_taken_as_applied_by_a_retry(
    spark, tmp_path: Path, dagster_home: Path
) -> None:
    lake = up_copy_lake(tmp_path, dagster_home, spark_master="local[1]")
    run_until_idle = _runner(lake, dagster_home)
    assert run_until_idle() == 1  # batch 1: ids 0..2
    copy = tmp_path / "control_after_batch_1"
    shutil.copytree(tmp_path / "control", copy)
    commit_rows(tmp_path / "up", [3])
    assert run_until_idle() == 1  # batch 2 (position 2): id 3
    shutil.rmtree(tmp_path / "control")
    shutil.copytree(copy, tmp_path / "control")  # restored: batch 2 never happened
    commit_rows(tmp_path / "up", [4])
    first = lake.cli("run", "--json")  # a new batch 2, of ids 3 and 4: refused
    assert first.returncode != 0, first.stdout + first.stderr
    assert REFUSED in first.stdout + first.stderr
    retried = lake.cli("run", "--retry", "--json")
    if retried.returncode == 0:
        assert _ids(spark, lake) == [0, 1, 2, 3, 4]
    else:
        assert REFUSED in retried.stdout + retried.stderr
