"""The control-plane benchmark (``benchmarks/control_plane.py``) at a tiny size: the history
it synthesizes reads back through the store as completed batches, and a run reports every
measurement with a sane structure. No timing is asserted."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.control_plane import PIPELINES, STEPS, UPSTREAMS, Bench, main
from tests.conftest import REPO
from watermark_dagster.core.records import BatchStatus, CheckpointStatus
from watermark_dagster.observe.observer import Observer


def test_synthesized_history_reads_back_as_completed_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bench points DAGSTER_HOME and WATERMARK_HOME at its folder; monkeypatch restores them.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "unused"))
    monkeypatch.setenv("WATERMARK_HOME", str(tmp_path / "unused"))
    bench = Bench(tmp_path / "bench", cycle=3, seed=1)
    try:
        bench.create_tables()
        bench.preload(12)
        store = bench.location.store()
        batches = store.batches()
        assert [b.seq for b in batches] == list(range(12, 0, -1))
        assert {b.status for b in batches} == {BatchStatus.COMPLETED}
        assert store.open_batch() is None
        # Every upstream a batch read was advanced, and the watermarks sit where the last
        # batch that read each upstream ended: at the table's latest version.
        for batch in batches:
            assert batch.advanced == frozenset(batch.ranged_upstreams)
        observer = Observer()
        latest = {
            u: observer.observe(bench.registry.upstreams[u]).latest_version for u in UPSTREAMS
        }
        assert store.committed_versions() == latest
        # Each pipeline of each batch succeeded once, and the history has a row per step.
        checkpoints = store.checkpoints()
        assert {c.status for c in checkpoints} == {CheckpointStatus.SUCCESS}
        assert sorted((c.batch_id, c.pipeline) for c in checkpoints) == sorted(
            (b.batch_id, p) for b in batches for p in b.pipelines
        )
        assert all(store.newest_success(p) is not None for p in PIPELINES)
        events = [r["event"] for r in store.history()]
        assert events.count("BATCH_PLANNED") == events.count("BATCH_COMPLETED") == 12
        assert events.count("PIPELINE_SUCCEEDED") == len(checkpoints)
        assert events.count("WATERMARK_ADVANCED") == sum(len(b.ranged_upstreams) for b in batches)
        # One append per table for the 12 batches (fewer than the 50 of a chunk).
        tables = bench.control_tables()
        assert {t: v["files"] for t, v in tables.items()} == dict.fromkeys(tables, 1)
    finally:
        bench.close()


def test_a_tiny_run_reports_every_measurement(tmp_path: Path) -> None:
    out, png = tmp_path / "control_plane.json", tmp_path / "control_plane.png"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.control_plane", "--batches", "5,12", "--cycle", "3",
         "--cli-every", "2", "--observe-tables", "4", "--out", str(out), "--plot", str(png),
         "--root", str(tmp_path / "w")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "batches_limit_20" in proc.stdout  # the printed table
    result = json.loads(out.read_text())
    assert result["cycle"] == 3
    assert len(result["loadavg_before"]) == 3
    if importlib.util.find_spec("matplotlib") is None:
        # The plot needs the bench extra; without it the run says so instead of failing.
        assert "matplotlib is missing" in result["plot"]
        assert not png.exists()
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [s["batches"] for s in result["sizes"]] == [5, 12]
    [observed] = result["observation"]
    assert observed["tables"] == 4
    for case in ("floor_listdir", "cold", "warm_nothing_new", "warm_10pct_changed"):
        assert observed[case]["cpu_s"]["min"] <= observed[case]["cpu_s"]["max"]
    for size in result["sizes"]:
        n = size["batches"]
        # The cycle's batches were planned, run and completed on top of the preload: ten
        # `batches` rows (one per upstream) per batch.
        assert size["control_tables_after_preload"]["batches"]["rows"] == 10 * n
        assert size["control_tables_after_cycle"]["batches"]["rows"] == 10 * (n + 3)
        assert size["upstream_commits"] > n
        m = size["measurements"]
        assert list(m) == list(STEPS)
        for tick in ("idle_tick", "plan_tick", "finalizer_tick"):
            assert m[tick]["samples"] == 3
        # One run-side sample per pipeline of each driven batch; the CLI at batches 0 and 2.
        assert m["run_side_per_pipeline"]["samples"] >= 3
        for cli in ("cli_list", "cli_batches_limit_20", "cli_get_history"):
            assert m[cli]["samples"] == 2
        for step in STEPS:
            assert len(m[step]["cpu_samples"]) == m[step]["samples"]
            for kind in ("cpu_seconds", "wall_seconds"):
                s = m[step][kind]
                assert 0 <= s["min"] <= s["median"] <= s["max"]
            assert (m[step]["scan"] is not None) == size["scan_stats"]
        # The store's own counters: a plan tick reads files and commits the plan.
        assert m["plan_tick"]["scan"]["files"]["max"] > 0
        assert m["plan_tick"]["scan"]["commits"]["min"] >= 1
        synth = size["synthesize_seconds"]
        assert set(synth) == {"upstream_commits", "control_rows", "total"}

    # Sizes run as separate processes combine into one result; runs of another cycle do not.
    parts = []
    for size in result["sizes"]:
        part = tmp_path / f"part{size['batches']}.json"
        part.write_text(json.dumps({**result, "sizes": [size]}))
        parts.append(part)
    combined = tmp_path / "combined.json"
    argv = ["--out", str(combined), "--plot", str(tmp_path / "combined.png"), "--combine"]
    assert main([*argv, *map(str, reversed(parts))]) == 0
    assert json.loads(combined.read_text())["sizes"] == result["sizes"]
    other = tmp_path / "other_cycle.json"
    other.write_text(json.dumps({**result, "cycle": 50}))
    with pytest.raises(SystemExit, match="differ in cycle"):
        main([*argv, str(parts[0]), str(other)])
