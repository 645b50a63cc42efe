"""The `watermark` console script against real control tables: each command path once as
a child process, the other cases in this process (tests/support/console.py).

The demo code location is pointed at upstream tables written with delta-rs (no JVM); the
commands here only read, so a rejected command must leave every control table as it was.
"""

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.support.cli import SCRIPT, control_versions, home_env, on_terminal
from tests.support.console import watermark_main
from watermark_dagster.cli import build_parser
from watermark_dagster.cli.timespec import TimestampError, parse_when, version_at
from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.core.records import BatchStatus
from watermark_dagster.demo import DemoPaths
from watermark_dagster.store import WatermarkStore

PIPELINES = {
    "orders_enriched": ["orders", "customers"],
    "customer_payments": ["customers", "payments"],
}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    paths = DemoPaths(tmp_path / "wm")
    for name, commits in (("customers", 2), ("orders", 3), ("payments", 1)):
        for i in range(commits):
            write_deltalake(
                paths.upstream(name), pa.table({"id": pa.array([i], pa.int64())}), mode="append"
            )
    store = WatermarkStore(paths.control_root)
    batch, _ = store.create_batch(
        [
            UpstreamPosition(n, v, None)
            for n, v in (("customers", 1), ("orders", 2), ("payments", 0))
        ],
        PIPELINES,
        actor="test",
    )
    assert batch is not None
    for upstream in batch.ranged_upstreams:
        store.advance(batch, upstream, actor="test")
    store.set_batch_status(batch.batch_id, BatchStatus.COMPLETED, actor="test")
    write_deltalake(
        paths.upstream("orders"), pa.table({"id": pa.array([9], pa.int64())}), mode="append"
    )
    return paths.home


def watermark(home: Path, *args: str) -> subprocess.CompletedProcess:
    """``watermark ARGS`` in this process (tests/support/console.py): what the command prints,
    returns and writes, without a child's second and a half of imports."""
    return watermark_main(args, home_env(home))


def watermark_child(home: Path, *args: str) -> subprocess.CompletedProcess:
    """``watermark ARGS`` as the console script in a child process: one test per command
    path (list, get, batches, batch, plan, set, reset, the confirmation) goes this way."""
    env = home_env(home)
    return subprocess.run(
        [str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_list_shows_committed_latest_and_lag(home: Path) -> None:
    out = watermark_child(home, "list", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["upstream"]: r for r in json.loads(out.stdout)}
    assert (rows["orders"]["committed"], rows["orders"]["latest"], rows["orders"]["lag"]) == (
        2,
        3,
        1,
    )
    assert rows["payments"]["lag"] == 0
    # The fixture's tables are written without change data feed: read append-only.
    assert rows["orders"]["mode"] == "APPEND_ONLY"
    table = watermark(home, "list")
    assert table.stdout.splitlines()[0].split() == [
        "upstream",
        "committed",
        "latest",
        "lag",
        "mode",
        "state",
        "rows",
        "read/written",
        "open",
        "batch",
        "last",
        "change",
    ]


def test_get_with_history(home: Path) -> None:
    out = watermark_child(home, "get", "-t", "orders", "--history", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert (got["committed"], got["batch_id"], got["how"]) == (2, "b000001", "AUTO")
    assert [(h["event"], h["new_value"]) for h in got["history"]] == [("WATERMARK_ADVANCED", "2")]


def test_batches_and_batch(home: Path) -> None:
    out = watermark_child(home, "batches", "--status", "completed", "--json")
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert row["ranges"] == {"customers": "[0, 1]", "orders": "[0, 2]", "payments": "[0, 0]"}
    detail = json.loads(watermark_child(home, "batch", "b000001", "--json").stdout)
    assert all(u["advanced"] for u in detail["upstreams"])
    assert detail["status"] == "COMPLETED"


def test_plan_dry_run_writes_nothing(home: Path) -> None:
    before = control_versions(home)
    out = watermark_child(home, "plan", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    ranges = {u["upstream"]: u["range"] for u in plan["upstreams"]}
    assert ranges == {"orders": "[3, 3]", "customers": "NOOP", "payments": "NOOP"}
    # The fixture never wrote the targets, so the coordinator would also plan their first loads.
    assert "orders_enriched" in plan["pipelines"]
    assert plan["would_plan"]
    assert control_versions(home) == before


def _history(home: Path, table: str) -> list[dict]:
    out = watermark(home, "get", "-t", table, "--history", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["history"]


def _plan(home: Path) -> dict:
    out = watermark(home, "plan", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    return {u["upstream"]: u for u in json.loads(out.stdout)["upstreams"]}


def _open_batch(home: Path) -> str:
    """Plan b000002 (orders [3, 3]) and leave it open, as a coordinator would."""
    store = WatermarkStore(DemoPaths(home).control_root)
    batch, created = store.create_batch(
        [
            UpstreamPosition(n, v, c)
            for n, v, c in (("customers", 1, 1), ("orders", 3, 2), ("payments", 0, 0))
        ],
        PIPELINES,
        actor="test",
    )
    assert created
    assert batch is not None
    assert batch.inputs["orders"].range is not None
    return batch.batch_id


def _commit_times(home: Path, table: str) -> dict[int, datetime]:
    history = DeltaTable(DemoPaths(home).upstream(table)).history()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return {h["version"]: epoch + timedelta(milliseconds=h["timestamp"]) for h in history}


def test_set_version_round_trip(home: Path) -> None:
    out = watermark_child(
        home, "set", "-t", "orders", "--version", "1", "--yes", "--reason", "re-read v2",
        "--actor", "alice",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "orders: committed watermark 2 -> 1" in out.stdout
    assert "orders_enriched re-read version 2" in out.stdout
    # The next plan starts right after the new watermark.
    assert _plan(home)["orders"]["range"] == "[2, 3]"
    last = _history(home, "orders")[-1]
    assert (last["event"], last["old_value"], last["new_value"], last["actor"]) == (
        "WATERMARK_SET",
        "2",
        "1",
        "alice",
    )
    assert json.loads(last["detail"])["reason"] == "re-read v2"
    got = json.loads(watermark(home, "get", "-t", "orders", "--json").stdout)
    assert (got["committed"], got["how"], got["batch_id"]) == (1, "MANUAL_SET", None)

    # `latest` skips everything committed so far, and says which versions are never read.
    out = watermark(home, "set", "-t", "orders", "--version", "latest", "--yes", "--json")
    assert out.returncode == 0, out.stderr
    change = json.loads(out.stdout)
    assert (change["old"], change["new"], change["applied"]) == (1, 3, True)
    assert "never read versions 2..3" in change["effect"]
    assert _plan(home)["orders"]["range"] == "NOOP"


def test_reset_makes_the_next_batch_load_a_snapshot(home: Path) -> None:
    out = watermark_child(home, "reset", "-t", "orders", "--yes", "--reason", "table recreated")
    assert out.returncode == 0, out.stderr
    assert "orders: committed watermark 2 -> none" in out.stdout
    planned = _plan(home)["orders"]
    assert (planned["committed"], planned["mode"], planned["range"]) == (None, "SNAPSHOT", "[0, 3]")
    last = _history(home, "orders")[-1]
    assert (last["event"], last["old_value"], last["new_value"]) == ("WATERMARK_RESET", "2", None)
    assert last["actor"]
    assert json.loads(last["detail"])["reason"] == "table recreated"
    # Resetting again changes nothing and writes nothing.
    before = control_versions(home)
    again = watermark(home, "reset", "-t", "orders", "--yes")
    assert again.returncode == 0
    assert "already none; nothing changed" in again.stdout
    assert control_versions(home) == before


@pytest.mark.parametrize(
    "args",
    [
        ["set", "-t", "orders", "--version", "0"],
        ["set", "-t", "orders", "--timestamp", "2000-01-01T00:00:00Z", "--force"],
        ["reset", "-t", "orders", "--force"],
    ],
    ids=["set", "set-timestamp-refused", "reset"],
)
def test_dry_run_writes_nothing(home: Path, args: list[str]) -> None:
    before = control_versions(home)
    out = watermark(home, *args, "--dry-run")
    assert control_versions(home) == before
    if "--timestamp" in args:  # before the first commit: refused the same way as for real
        assert out.returncode == 2
        assert "watermark reset -t orders" in out.stderr
        return
    assert out.returncode == 0, out.stderr
    assert "dry run: nothing written" in out.stdout
    assert "orders: committed watermark 2 -> " in out.stdout


def test_open_batch_refuses_unless_forced_and_force_abandons_it(home: Path) -> None:
    batch_id = _open_batch(home)
    before = control_versions(home)
    refused = watermark(home, "set", "-t", "orders", "--version", "3", "--yes")
    assert refused.returncode == 2
    # The store's refusal (the one definition of the rule), raised before any prompt.
    assert f"Upstream 'orders': batch {batch_id} is open and reads orders" in refused.stderr
    assert "--force" in refused.stderr
    assert control_versions(home) == before
    # An upstream the open batch does not read (NOOP) can move freely.
    assert watermark(home, "set", "-t", "payments", "--version", "0", "--yes").returncode == 0

    preview = watermark(home, "set", "-t", "orders", "--version", "3", "--force", "--dry-run")
    assert preview.returncode == 0
    assert f"open batch {batch_id}" in preview.stdout
    assert WatermarkStore(DemoPaths(home).control_root).open_batch() is not None

    forced = watermark(home, "set", "-t", "orders", "--version", "3", "--yes", "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"batch {batch_id} ABANDONED" in forced.stdout
    store = WatermarkStore(DemoPaths(home).control_root)
    assert store.get_batch(batch_id).status is BatchStatus.ABANDONED
    assert store.open_batch() is None
    assert store.committed_versions()["orders"] == 3
    assert json.loads(store.history(upstream="orders")[-1]["detail"])["abandoned"] == [batch_id]


def test_confirmation_is_refused_off_a_terminal_without_yes(home: Path) -> None:
    before = control_versions(home)
    out = watermark_child(home, "set", "-t", "orders", "--version", "1")
    assert out.returncode == 2
    assert "stdin is not a terminal" in out.stderr
    assert "--yes" in out.stderr
    assert control_versions(home) == before


def test_confirmation_on_a_terminal(home: Path) -> None:
    before = control_versions(home)
    rc, _, err = on_terminal(home, "set", "-t", "orders", "--version", "1", answer=b"n\n")
    assert rc == 2
    assert "not confirmed; nothing was changed" in err
    assert "orders: committed watermark 2 -> 1" in err
    assert "Proceed? [y/N]" in err
    assert control_versions(home) == before

    rc, out, err = on_terminal(home, "set", "-t", "orders", "--version", "1", answer=b"y\n")
    assert rc == 0, err
    assert "orders: committed watermark 2 -> 1" in out
    assert WatermarkStore(DemoPaths(home).control_root).committed_versions()["orders"] == 1


def test_colours_only_on_a_terminal_and_never_with_no_color(home: Path) -> None:
    assert "\x1b[" not in watermark(home, "list").stdout
    rc, screen, _ = on_terminal(home, "list", stdout_tty=True)
    assert rc == 0
    assert "\x1b[" in screen
    rc, screen, _ = on_terminal(home, "list", stdout_tty=True, NO_COLOR="1")
    assert rc == 0
    assert "\x1b[" not in screen
    assert "upstream" in screen


def test_set_timestamp_resolves_to_the_version_committed_by_then(home: Path) -> None:
    times = _commit_times(home, "orders")
    # Exactly at version 1's commit: version 1 is kept, the next batch starts at 2.
    at = times[1].isoformat(timespec="milliseconds")
    out = watermark(home, "set", "-t", "orders", "--timestamp", at, "--yes", "--json")
    assert out.returncode == 0, out.stderr
    change = json.loads(out.stdout)
    assert (change["old"], change["new"]) == (2, 1)
    assert change["resolved"]["resolved_time"] == times[1].isoformat()
    assert _plan(home)["orders"]["range"] == "[2, 3]"
    detail = json.loads(_history(home, "orders")[-1]["detail"])
    assert detail["resolved"]["timestamp"] == at
    # Naive means UTC: the same instant without a zone resolves the same way.
    naive = times[2].replace(tzinfo=None).isoformat(timespec="milliseconds")
    out = watermark(home, "set", "-t", "orders", "--timestamp", naive, "--yes", "--json")
    assert json.loads(out.stdout)["new"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["get", "-t", "ordrs"], "unknown upstream 'ordrs'"),
        (["get", "-t", "orders; DROP TABLE x"], "unknown upstream 'orders; DROP TABLE x'"),
        (["batches", "--status", "DONE"], "unknown --status 'DONE'"),
        (["batches", "--limit", "0"], "--limit must be 1 or more"),
        (["batches", "--limit", "many"], "invalid int value: 'many'"),
        (["batch", "42"], "'42' is not a batch id"),
        (["batch", "b999999"], "No batch 'b999999'"),
        (["plan"], "add --dry-run"),
        (["set", "-t", "ordrs", "--version", "1", "--yes"], "unknown upstream 'ordrs'"),
        (["reset", "-t", "ordrs", "--yes"], "unknown upstream 'ordrs'"),
        (["set", "-t", "orders", "--version", "-1", "--yes"], "--version '-1' is negative"),
        (
            ["set", "-t", "orders", "--version", "five", "--yes"],
            "--version 'five' is not a version",
        ),
        (
            ["set", "-t", "orders", "--version", "4", "--yes"],
            "--version 4 is beyond the latest version of upstream 'orders' (3)",
        ),
        (["set", "-t", "orders", "--timestamp", "yesterday", "--yes"], "'yesterday' is not a time"),
        (
            ["set", "-t", "orders", "--timestamp", "2026-02-30", "--yes"],
            "'2026-02-30' is not a time",
        ),
        (["set", "-t", "orders", "--timestamp", "3 months", "--yes"], "unknown unit 'months'"),
        (["set", "-t", "orders", "--timestamp", "2999-01-01", "--yes"], "is in the future"),
        (
            ["set", "-t", "orders", "--timestamp", "1 day", "--yes"],
            "is before the first commit of upstream 'orders'",
        ),
        (
            ["set", "-t", "orders", "--version", "1", "--timestamp", "7d", "--yes"],
            "both given; give one of them",
        ),
        (["set", "-t", "orders", "--yes"], "give the new watermark: --version N"),
    ],
    ids=[
        "unknown-table",
        "sql-in-name",
        "bad-status",
        "zero-limit",
        "non-numeric-limit",
        "bad-batch-id",
        "missing-batch",
        "plan-without-dry-run",
        "set-unknown-table",
        "reset-unknown-table",
        "set-negative-version",
        "set-non-numeric-version",
        "set-beyond-latest",
        "set-malformed-timestamp",
        "set-impossible-date",
        "set-unknown-unit",
        "set-future-timestamp",
        "set-before-first-commit",
        "set-version-and-timestamp",
        "set-neither",
    ],
)
def test_bad_input_is_refused_clearly_and_writes_nothing(
    home: Path, args: list[str], message: str
) -> None:
    before = control_versions(home)
    out = watermark(home, *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr
    assert control_versions(home) == before


def test_the_demo_refuses_to_run_on_another_registry(home: Path) -> None:
    """The demo writes demo data and checks demo targets: pointed at a user's registry it
    would commit demo rows next to their tables. It refuses and writes nothing."""
    before = control_versions(home)
    upstreams = {p.name: p.stat().st_mtime_ns for p in (home / "demo").rglob("*")}
    out = subprocess.run(
        [str(SCRIPT), "demo"],
        env=home_env(home, WATERMARK_REGISTRY="my_lake.yaml"),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "WATERMARK_REGISTRY is set" in out.stderr
    assert "watermark run" in out.stderr
    assert control_versions(home) == before
    assert {p.name: p.stat().st_mtime_ns for p in (home / "demo").rglob("*")} == upstreams


COMMANDS = [
    "list",
    "get",
    "set",
    "reset",
    "batches",
    "batch",
    "plan",
    "verify",
    "run",
    "demo",
    "dev",
]


def test_every_command_has_help_with_an_example_and_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    top = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    assert "exit codes:" in top.stdout
    for code in ("0  success", "1  failure", "2  bad input"):
        assert code in top.stdout
    # Each command's help, from the parser the console script runs (in-process: each
    # subprocess would spend its time importing Dagster and Spark).
    for command in COMMANDS:
        assert command in top.stdout
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([command, "--help"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        assert "example" in text, command
        assert f"watermark {command}" in text, command
        assert "--json" in text, command
        if command == "set":
            assert "no zone means UTC" in text.replace("\n", " ")


def test_defs_takes_a_location_or_its_definitions(home: Path) -> None:
    """`--defs` loads the location object, or the plain Definitions built from it (the
    registry travels in the Definitions, not in a process-wide table); anything else is
    refused with the fix."""
    via_defs = watermark(home, "list", "--json")
    via_location = watermark(
        home, "list", "--json", "--defs", "watermark_dagster.definitions:location"
    )
    assert via_defs.returncode == via_location.returncode == 0, via_location.stderr
    assert json.loads(via_location.stdout) == json.loads(via_defs.stdout)
    foreign = watermark(home, "list", "--defs", "watermark_dagster.definitions:build_demo_location")
    assert foreign.returncode == 2
    assert "not built by watermark_dagster's build_location" in foreign.stderr
    assert "build_location(...)" in foreign.stderr


def test_a_location_is_recovered_from_its_definitions_and_their_merges(tmp_path: Path) -> None:
    from dagster import Definitions

    from watermark_dagster.dagster_defs.definitions import location_of
    from watermark_dagster.definitions import build_demo_location
    from watermark_dagster.errors import ConfigurationError

    location = build_demo_location(tmp_path)
    for defs in (location.definitions, Definitions.merge(location.definitions, Definitions())):
        found = location_of(defs)
        assert found.registry is location.registry
        assert found.control_root == location.control_root == DemoPaths(tmp_path).control_root
    # Two locations built from equal inputs stay apart: nothing is looked up by identity.
    other = build_demo_location(tmp_path / "other")
    assert location_of(other.definitions).registry is other.registry is not location.registry
    with pytest.raises(ConfigurationError, match="build_definitions"):
        location_of(Definitions())


def test_consumers_are_the_sorted_pipelines_reading_an_upstream(tmp_path: Path) -> None:
    from watermark_dagster.demo import build_demo_registry

    registry = build_demo_registry(DemoPaths(tmp_path))
    expected = {
        u: tuple(sorted(p for p, ups in registry.pipeline_inputs().items() if u in ups))
        for u in registry.upstreams
    }
    assert {u: registry.consumers(u) for u in registry.upstreams} == expected
    assert registry.consumers("customers") == ("customer_payments", "orders_enriched")
    assert registry.consumers("no_such_upstream") == ()


NOW = datetime(2026, 8, 9, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", NOW - timedelta(days=7)),
        ("1week", NOW - timedelta(weeks=1)),
        ("2 weeks", NOW - timedelta(weeks=2)),
        ("36h", NOW - timedelta(hours=36)),
        ("90m", NOW - timedelta(minutes=90)),
        ("1 day", NOW - timedelta(days=1)),
        ("3 days ago", NOW - timedelta(days=3)),
        ("2026-08-01", datetime(2026, 8, 1, tzinfo=UTC)),
        ("2026-08-09 20:00:01", datetime(2026, 8, 9, 20, 0, 1, tzinfo=UTC)),
        ("2026-08-09T20:00:01+02:00", datetime(2026, 8, 9, 18, 0, 1, tzinfo=UTC)),
        ("2026-08-09T18:00:01Z", datetime(2026, 8, 9, 18, 0, 1, tzinfo=UTC)),
        ("2026-08-09T18:00:01.250", datetime(2026, 8, 9, 18, 0, 1, 250000, tzinfo=UTC)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_parse_when(text: str, expected: datetime) -> None:
    got = parse_when(text, now=NOW)
    assert got == expected
    assert got.tzinfo is UTC


@pytest.mark.parametrize("text", ["", "soon", "7", "d7", "1 month", "2y", "-3d", "2026-13-01"])
def test_parse_when_refuses_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(TimestampError, match="ISO 8601") as info:
        parse_when(text, now=NOW)
    assert repr(text) in str(info.value)


def _ms(at: datetime) -> int:
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


@pytest.mark.parametrize(
    ("offset_ms", "expected"),
    [(-1, None), (0, 0), (999, 0), (1000, 1), (2000, 2), (2001, 3), (10**6, 3)],
)
def test_version_at_is_the_newest_commit_at_or_before(offset_ms: int, expected: int | None) -> None:
    t0 = _ms(NOW)
    # Version 3 was written by a writer whose clock was behind: it counts as after version 2.
    commits = [(0, t0), (1, t0 + 1000), (2, t0 + 2000), (3, t0 + 1500)]
    at = NOW + timedelta(milliseconds=offset_ms)
    assert version_at(commits, at) == expected
