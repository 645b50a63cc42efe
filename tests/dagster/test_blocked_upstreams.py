"""An upstream dropped and recreated at the same path is refused loudly (I6).

The table is recreated the ways operators do it: a new table with fewer, as many or more
versions than the committed watermark (delta-rs, after removing the folder), the same
with a watermark that carries no table id, and Spark's ``CREATE OR REPLACE TABLE ... AS
SELECT``. Each time the coordinator plans nothing for it, and every surface says so and
names the one recovery command: ``watermark run`` exits 1, ``list``, ``get`` and ``plan
--dry-run`` show it BLOCKED (text and JSON), and the upstream's ``watermark_continuity``
asset check fails in a real Dagster instance, reported by the coordinator sensor itself
(ticked in-process, and by a real ``dagster-daemon``).

A next range that can no longer be read (its commits removed by log cleanup, or its change
files by VACUUM) is refused at planning the same way, BLOCKED with its own fix.
"""

import json
import os
from pathlib import Path

import pytest
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    DagsterInstance,
    materialize,
)
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable

from tests.support.blocked import RESET, blocked_lake, check_history, recreate
from tests.support.lakes import defs_from, registry_from
from tests.support.spec_lake import Lake, commit_rows
from watermark_dagster.core.planning import UpstreamPosition, plan_batch
from watermark_dagster.core.ranges import VersionRange
from watermark_dagster.dagster_defs.checks import CONTINUITY_CHECK
from watermark_dagster.dagster_defs.headless import HeadlessRunner
from watermark_dagster.dagster_defs.sensors import COORDINATOR
from watermark_dagster.errors import UpstreamRecreatedError, recreated_fix
from watermark_dagster.observe.observer import Observer, observe_registry
from watermark_dagster.read.preflight import check_identity
from watermark_dagster.read.tables import next_range_fix


@pytest.fixture
def lake(tmp_path: Path, dagster_home: Path) -> Lake:
    """The lake of :func:`blocked_lake`."""
    return blocked_lake(tmp_path, dagster_home)


# case -> (commits of the new table, whether the watermark row keeps its table id)
CASES = {
    "fewer_versions": (1, True),
    "as_many_versions": (3, True),
    "more_versions": (5, True),
    "fewer_versions_no_table_id": (2, False),
}


def _drop_table_id(lake: Lake) -> None:
    """Rewrite the watermark row of ``up`` without its table id (older releases wrote none)."""
    dt = DeltaTable(str(Path(lake.spec["control_root"]) / "committed_watermarks"))
    dt.update(predicate="upstream = 'up'", updates={"table_id": "NULL"})
    assert lake.store.committed()["up"].table_id is None


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_kind_of_recreated_upstream_is_blocked(lake: Lake, case: str) -> None:
    """Each way a table can be recreated is caught by observation (``list``) and planning
    (``plan --dry-run``, which ``run`` plans with), with the one fix; the one rule behind
    them (``core.planning.recreation_found``) is shared, so every other surface is checked
    once, below."""
    versions, keeps_id = CASES[case]
    if not keeps_id:
        _drop_table_id(lake)
    recreate(lake, versions)
    batches_before = len(lake.store.batches())
    up = {r["upstream"]: r for r in lake.json("list")}["up"]
    assert "was dropped and recreated" in up["blocked"], up
    assert up["fix"] == recreated_fix("up")
    plan = lake.json("plan", "--dry-run")
    assert plan["blocked"]["up"]["fix"] == recreated_fix("up")
    assert plan["pipelines"] == []
    assert len(lake.store.batches()) == batches_before


def test_a_recreated_upstream_is_blocked_on_every_surface(lake: Lake) -> None:
    recreate(lake, 1)
    batches_before = len(lake.store.batches())

    rows = {r["upstream"]: r for r in lake.json("list")}
    up = rows["up"]
    assert "was dropped and recreated" in up["blocked"], up
    assert up["fix"] == recreated_fix("up")
    assert RESET in up["fix"]
    assert up["lag"] is None
    assert up["committed"] == 2
    assert rows["other"]["blocked"] is None
    assert rows["other"]["fix"] is None

    got = lake.json("get", "-t", "up")
    assert (got["blocked"], got["fix"]) == (up["blocked"], up["fix"])

    plan = lake.json("plan", "--dry-run")
    assert plan["blocked"]["up"]["pipelines"] == ["up_copy"]
    assert plan["blocked"]["up"]["fix"] == recreated_fix("up")
    assert "up" not in plan["unavailable"]
    by_name = {u["upstream"]: u for u in plan["upstreams"]}
    assert (by_name["up"]["mode"], by_name["up"]["state"]) == ("BLOCKED", "blocked")
    assert not plan["would_plan"]
    assert plan["pipelines"] == []

    # A cron job sees a failure naming the upstream and the fix; nothing is planned or run
    # (and no JVM started: the location's Spark master cannot start).
    run = lake.cli("run")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "BLOCKED: upstream up was dropped and recreated" in run.stderr
    assert "what Spark and Dagster printed" not in run.stderr  # no Spark, no log to read
    assert "['up_copy']" in run.stderr
    assert RESET in run.stderr
    assert len(lake.store.batches()) == batches_before
    out = lake.cli("run", "--json")
    assert out.returncode == 1
    assert json.loads(out.stdout)["blocked"]["up"]["fix"] == recreated_fix("up")

    # The documented recovery unblocks it: the next plan reloads the new table.
    reset = lake.cli("reset", "-t", "up", "--force", "--yes", "--reason", "recreated")
    assert reset.returncode == 0, reset.stderr
    assert lake.json("list")[1]["blocked"] is None  # sorted: other, up
    plan = lake.json("plan", "--dry-run")
    assert plan["blocked"] == {}
    assert plan["pipelines"] == ["up_copy"]
    assert {u["upstream"]: u["mode"] for u in plan["upstreams"]}["up"] == "SNAPSHOT"


def test_blocked_upstream_in_text_output(lake: Lake) -> None:
    recreate(lake, 1)
    listed = lake.cli("list")
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if line.startswith("up ")]
    assert "BLOCKED" in row.split()
    assert "BLOCKED up: Upstream 'up' was dropped and recreated" in listed.stdout
    assert f"fix: {recreated_fix('up')}" in listed.stdout

    got = lake.cli("get", "-t", "up")
    assert got.returncode == 0, got.stderr
    fields = dict(
        line.split(None, 1) for line in got.stdout.split("\n\n")[0].splitlines() if " " in line
    )
    assert fields["state"].strip() == "BLOCKED"
    assert fields["fix"].strip() == recreated_fix("up")

    plan = lake.cli("plan", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "no upstream has new versions" not in plan.stdout
    assert "nothing can be planned for ['up_copy']" in plan.stdout
    assert "BLOCKED up: Upstream 'up' was dropped and recreated" in plan.stdout
    assert RESET in plan.stdout


def test_the_three_detectors_give_one_fix(lake: Lake) -> None:
    """Planning, observation and the read path each detect a recreated table; all of them
    suggest the same command."""
    registry = registry_from(lake.spec)
    planned_id = lake.store.committed()["up"].table_id
    recreate(lake, 1)
    with pytest.raises(UpstreamRecreatedError) as planning:
        plan_batch([UpstreamPosition("up", 0, 2)], {"up_copy": ["up"]})
    look = observe_registry(
        registry, Observer(), {"up": 2, "other": 0}, marks=lake.store.committed()
    )
    with pytest.raises(UpstreamRecreatedError) as fewer:
        check_identity(registry.upstreams["up"], VersionRange(1, 2), planned_id)
    recreate(lake, 4)
    with pytest.raises(UpstreamRecreatedError) as other_id:
        check_identity(registry.upstreams["up"], VersionRange(1, 2), planned_id)
    errors = [planning.value, look.blocked["up"], fewer.value, other_id.value]
    assert {e.fix for e in errors} == {recreated_fix("up")}
    assert all(str(e).startswith("Upstream 'up' was dropped and recreated: ") for e in errors)


def test_the_sensor_and_watermark_plan_give_one_reason_for_planning_nothing(lake: Lake) -> None:
    """The coordinator sensor's skip reason and `watermark plan --dry-run --json`'s
    ``idle_reason`` are one text (operations/idle.py), with nothing new and with an
    upstream dropped and recreated; the text output's first line says it too."""
    defs = defs_from(lake.spec)
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(lake.dagster_home)))
    try:
        runner = HeadlessRunner(defs, instance)
        reasons = []
        for change in ("nothing new", "recreated"):
            if change == "recreated":
                recreate(lake, 1)
            result = runner.tick(COORDINATOR)
            assert not result.run_requests
            assert result.skip_reason is not None
            plan = lake.json("plan", "--dry-run")
            assert plan["idle_reason"] == result.skip_reason.skip_message
            reasons.append(plan["idle_reason"])
        assert reasons[0] == "no upstream has new versions"
        assert reasons[1] == (
            "nothing can be planned; blocked, dropped and recreated: ['up'] (see their "
            "watermark_continuity check for the fix)"
        )
    finally:
        instance.dispose()


def test_the_coordinator_reports_a_failing_continuity_check(lake: Lake) -> None:
    defs = defs_from(lake.spec)
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(lake.dagster_home)))
    try:
        runner = HeadlessRunner(defs, instance)
        runner.tick(COORDINATOR)
        assert [e.passed for e in check_history(instance, "up")] == [True]
        runner.tick(COORDINATOR)  # nothing changed: nothing reported again
        assert len(check_history(instance, "up")) == 1

        recreate(lake, 1)
        result = runner.tick(COORDINATOR)
        assert not result.run_requests
        assert result.skip_reason is not None
        assert "blocked, dropped and recreated: ['up']" in (result.skip_reason.skip_message or "")
        history = check_history(instance, "up")
        assert [e.passed for e in history] == [True, False]
        failed = history[-1]
        assert failed.severity is AssetCheckSeverity.ERROR
        assert "was dropped and recreated" in failed.description
        assert RESET in failed.description
        assert failed.metadata["fix"].value == recreated_fix("up")
        runner.tick(COORDINATOR)
        assert len(check_history(instance, "up")) == 2  # reported once per change
        assert [e.passed for e in check_history(instance, "other")] == [True]

        # Run by hand from the UI (the check's own op), it says the same.
        everything = [*(defs.assets or []), *(defs.asset_checks or [])]
        key = AssetCheckKey(AssetKey(["up"]), CONTINUITY_CHECK)
        done = materialize(
            [d for d in everything if isinstance(d, AssetsDefinition)],
            selection=AssetSelection.checks(key),
            resources=defs.resources,
            instance=instance,
        )
        [evaluation] = done.get_asset_check_evaluations()
        assert not evaluation.passed
        assert evaluation.description == failed.description
    finally:
        instance.dispose()


# ------------------------------------------------------------------ next range unreadable


def _clean_log(lake: Lake, commits: int) -> None:
    """``commits`` new commits of ``up``, then what log cleanup does: a checkpoint at the
    latest version, every older commit file removed."""
    for i in range(commits):
        commit_rows(lake.up, [10 + i])
    table = DeltaTable(str(lake.up))
    table.create_checkpoint()
    for version in range(table.version()):
        (lake.up / "_delta_log" / f"{version:020d}.json").unlink()


def test_a_next_range_whose_commits_are_gone_is_blocked_not_planned(lake: Lake) -> None:
    """Log cleanup removed commits 3 and 4 of the next range [3, 5] of ``up`` while no batch
    was open: planning it would give a batch that fails and sticks, so it is refused at
    planning like a recreated table, with a fix that talks of no open batch; nothing is
    planned or run; and the fix works (a reset without ``--force``)."""
    _clean_log(lake, 3)
    fix = next_range_fix("up", "delta.logRetentionDuration")
    assert fix.startswith("run `watermark reset -t up`: ")
    batches_before = len(lake.store.batches())

    plan = lake.json("plan", "--dry-run")
    held = plan["blocked"]["up"]
    next_range = "commits 3..4 of its next range [3, 5] (after its committed watermark 2)"
    assert next_range in held["reason"]
    assert "no longer in the Delta log" in held["reason"]
    assert (held["fix"], held["pipelines"]) == (fix, ["up_copy"])
    by_name = {u["upstream"]: u for u in plan["upstreams"]}
    assert (by_name["up"]["mode"], by_name["up"]["state"]) == ("BLOCKED", "blocked")
    assert (plan["would_plan"], plan["pipelines"]) == (False, [])

    up = {r["upstream"]: r for r in lake.json("list")}["up"]
    assert (up["state"], up["blocked_by"], up["fix"]) == ("blocked", "unreadable_range", fix)
    assert up["blocked"] == held["reason"]
    assert up["lag"] == 3  # the table was seen: the lag is real
    got = lake.json("get", "-t", "up")
    assert (got["state"], got["blocked"], got["fix"]) == ("blocked", held["reason"], fix)

    text = lake.cli("plan", "--dry-run")
    assert text.returncode == 0, text.stderr
    assert "nothing can be planned for ['up_copy']" in text.stdout
    assert "BLOCKED up: Upstream 'up': commits 3..4 of its next range [3, 5]" in text.stdout
    assert f"fix: {fix}" in text.stdout
    assert "open batch" not in text.stdout
    assert "WARNING" not in text.stdout

    # The coordinator (driven headless by `watermark run`) plans nothing and says why; the
    # location's Spark master cannot start, so no JVM was needed to know.
    run = lake.cli("run")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "BLOCKED: upstream up cannot read its next range" in run.stderr
    assert fix in run.stderr
    assert len(lake.store.batches()) == batches_before

    # The fix: no batch is open, so the reset needs no --force; the next plan reloads `up`.
    reset = lake.cli("reset", "-t", "up", "--yes", "--reason", "log cleaned up")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    plan = lake.json("plan", "--dry-run")
    assert (plan["blocked"], plan["pipelines"]) == ({}, ["up_copy"])
    assert {u["upstream"]: u["mode"] for u in plan["upstreams"]}["up"] == "SNAPSHOT"


def test_a_next_range_whose_change_files_were_vacuumed_is_blocked_not_planned(
    lake: Lake,
) -> None:
    """VACUUM removed the change file of version 3 (an update of the CDF upstream ``up``)
    while no batch was open: the next range is refused at planning, BLOCKED with its fix,
    and the coordinator plans nothing. delta-rs' VACUUM removes change files only with
    ``full=True``; Spark's always does once they are older than the retention."""
    DeltaTable(str(lake.up)).update(predicate="id = 1", updates={"value": "-1"})  # v3
    [change_file] = os.listdir(lake.up / "_change_data")
    DeltaTable(str(lake.up)).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
    )
    assert not os.listdir(lake.up / "_change_data")
    latest = DeltaTable(str(lake.up)).version()  # VACUUM's own commits come after v3
    fix = next_range_fix("up", "delta.deletedFileRetentionDuration")
    batches_before = len(lake.store.batches())

    plan = lake.json("plan", "--dry-run")
    held = plan["blocked"]["up"]
    assert f"the change files of commits 3 of its next range [3, {latest}]" in held["reason"]
    assert f"missing file: _change_data/{change_file}" in held["reason"]
    assert "VACUUM" in held["reason"]
    assert (held["fix"], plan["pipelines"]) == (fix, [])
    up = {r["upstream"]: r for r in lake.json("list")}["up"]
    assert (up["state"], up["blocked"], up["fix"]) == ("blocked", held["reason"], fix)
    got = lake.json("get", "-t", "up")
    assert (got["state"], got["blocked"], got["fix"]) == ("blocked", held["reason"], fix)

    run = lake.cli("run")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "BLOCKED: upstream up cannot read its next range" in run.stderr
    assert fix in run.stderr
    assert len(lake.store.batches()) == batches_before
