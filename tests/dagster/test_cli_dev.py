"""`watermark dev`'s parts that need no JVM nor `dagster dev`: the process groups it stops
as a whole, the workspace it generates, the DAGSTER_HOME configuration it keeps in step
with the shipped one; and the quiet output of the commands that start Spark.

(`watermark dev` itself, started outside the repository and stopped by a signal with a run
in flight, is tests/live/test_watermark_dev_stop.py.)
"""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake

from tests.support.cli import SCRIPT
from watermark_dagster.cli import build_parser
from watermark_dagster.cli.commands.runtime import write_workspace
from watermark_dagster.cli.context import SHIPPED_DAGSTER_YAML, SYNC_STAMP, sync_dagster_yaml
from watermark_dagster.cli.processes import ProcessGroup, stop_groups

REPO = Path(__file__).resolve().parents[2]

# A parent that ignores the interrupt and SIGTERM, with a child that does the same: only
# SIGKILL ends them. Each prints its pid once its handlers are set.
STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    if sys.argv[1] == "parent":
        child = subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", ""],
                                 stdout=subprocess.PIPE, text=True)
        print(child.stdout.readline().strip(), flush=True)
    print(__import__("os").getpid(), flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _start(code: str, *args: str) -> tuple[ProcessGroup, list[int]]:
    group = ProcessGroup([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert group.proc.stdout is not None
    pids = [int(group.proc.stdout.readline()) for _ in range(2 if "parent" in args else 1)]
    return group, pids


def test_a_group_that_ignores_signals_is_killed_whole() -> None:
    group, pids = _start(STUBBORN, "parent", STUBBORN)
    assert len(pids) == 2
    assert all(_alive(p) for p in pids)
    escalated = stop_groups([(group, signal.SIGINT)], grace=0.5, term=0.5)
    assert [s for s, _ in escalated] == [signal.SIGTERM, signal.SIGKILL]
    # The processes signalled are named, so the user sees what did not stop.
    assert all(f"({pid})" in " ".join(escalated[0][1]) for pid in pids), escalated
    assert not group.running()
    assert not any(_alive(p) for p in pids)


def test_a_group_that_stops_on_the_interrupt_is_not_escalated() -> None:
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
    group, [pid] = _start(code)
    assert stop_groups([(group, signal.SIGINT)], grace=30, term=1) == []
    assert group.proc.returncode == -signal.SIGINT
    assert not _alive(pid)


def test_the_generated_workspace_loads_the_installed_package_from_anywhere(
    tmp_path: Path,
) -> None:
    path = write_workspace(tmp_path, "watermark_dagster.definitions:defs")
    assert path == tmp_path / "workspace.yaml"
    [entry] = yaml.safe_load(path.read_text())["load_from"]
    assert entry == {
        "python_module": {
            "module_name": "watermark_dagster.definitions",
            "attribute": "defs",
            "location_name": "watermark_dagster",  # as the repository's workspace.yaml
        }
    }
    # The repository's workspace names the same location, so runs and sensor states match.
    [repo_entry] = yaml.safe_load((REPO / "workspace.yaml").read_text())["load_from"]
    assert repo_entry["python_module"]["location_name"] == "watermark_dagster"
    mine = write_workspace(tmp_path, "my_lake.defs:defs")
    assert yaml.safe_load(mine.read_text())["load_from"][0]["python_module"] == {
        "module_name": "my_lake.defs",
        "attribute": "defs",
        "location_name": "my_lake.defs",
    }


def test_dev_refuses_a_workspace_that_does_not_exist(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(SCRIPT), "dev", "--workspace", "nope.yaml", "--port", "1"],
        cwd=tmp_path,
        env={**os.environ, "WATERMARK_HOME": str(tmp_path / "wm"), "DAGSTER_HOME": ""},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"--workspace nope.yaml: no such file ({tmp_path / 'nope.yaml'})" in out.stderr
    assert "Drop --workspace" in out.stderr
    assert "dagster dev" not in out.stdout  # nothing was started


# ------------------------------------------------------------------ DAGSTER_HOME config


def test_the_shipped_dagster_yaml_is_the_repositorys() -> None:
    assert SHIPPED_DAGSTER_YAML.read_bytes() == (REPO / "dagster.yaml").read_bytes()


def test_dagster_yaml_follows_the_shipped_one_unless_edited(tmp_path: Path) -> None:
    shipped = tmp_path / "shipped.yaml"
    home = tmp_path / "dagster_home"
    home.mkdir()
    config = home / "dagster.yaml"
    shipped.write_text("telemetry:\n  enabled: false\n")

    assert sync_dagster_yaml(home, shipped) is None  # first start: copied, nothing to say
    assert config.read_text() == shipped.read_text()
    assert (home / SYNC_STAMP).is_file()

    # The shipped file changes and the copy was not edited: the copy follows, and says so.
    shipped.write_text("telemetry:\n  enabled: false\nrun_monitoring:\n  enabled: true\n")
    message = sync_dagster_yaml(home, shipped)
    assert config.read_text() == shipped.read_text()
    assert message is not None
    assert f"updated {config}" in message
    assert str(shipped) in message
    assert sync_dagster_yaml(home, shipped) is None

    # The user edits the copy: it stays theirs, and nothing is said while nothing ships.
    edited = config.read_text() + "# my Postgres\n"
    config.write_text(edited)
    assert sync_dagster_yaml(home, shipped) is None
    # A new shipped version: the edited copy is kept, the user is told once, with the fix.
    shipped.write_text("telemetry:\n  enabled: false\n# pools\n")
    message = sync_dagster_yaml(home, shipped)
    assert config.read_text() == edited
    assert message is not None
    assert f"{config} differs from the shipped {shipped}" in message
    assert f"cp {shipped} {config}" in message
    assert sync_dagster_yaml(home, shipped) is None


def test_a_dagster_yaml_of_unknown_origin_is_kept_and_the_difference_told(
    tmp_path: Path,
) -> None:
    shipped = tmp_path / "shipped.yaml"
    shipped.write_text("telemetry:\n  enabled: false\n")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("storage: {postgres: {}}\n")  # copied by hand
    message = sync_dagster_yaml(home, shipped)
    assert (home / "dagster.yaml").read_text() == "storage: {postgres: {}}\n"
    assert message is not None
    assert "differs from the shipped" in message


# ------------------------------------------------------------------ quiet by default

NOISY = '''
"""At import, writes to file descriptor 2 (as a JVM does) and warns (as pandas does)."""
import os
import warnings

os.write(2, b"26/11/26 12:00:00 WARN NativeNoise: from below Python\\n")
warnings.warn("pandas-like noise", FutureWarning, stacklevel=1)


def copy(batch):
    return batch["up"].changes
'''


@pytest.fixture
def noisy_registry(tmp_path: Path) -> dict[str, str]:
    """The environment of a registry whose transform module is noisy when it loads."""
    write_deltalake(str(tmp_path / "up"), pa.table({"id": pa.array([1], pa.int64())}))
    (tmp_path / "wm_noisy_module.py").write_text(NOISY)
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        textwrap.dedent(
            f"""\
            control_root: {tmp_path / "control"}
            upstreams:
              up: {{path: {tmp_path / "up"}}}
            pipelines:
              up_copy:
                upstreams: [up]
                target: {tmp_path / "target"}
                keys: [id]
                transform: wm_noisy_module:copy
            """
        )
    )
    env = {
        **os.environ,
        "WATERMARK_HOME": str(tmp_path / "wm"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
        "WATERMARK_REGISTRY": str(registry),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("WATERMARK_VERBOSE", None)
    return env


def _verify_unknown(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    # `verify` starts Spark, so it is quiet; an unknown pipeline is refused before Spark.
    return subprocess.run(
        [str(SCRIPT), *flags, "verify", "-p", "nope"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_verbose_is_a_global_flag_before_or_after_the_command() -> None:
    parser = build_parser()
    assert parser.parse_args(["-v", "list"]).verbose
    assert parser.parse_args(["list", "--verbose"]).verbose
    assert not parser.parse_args(["list"]).verbose
    assert parser.parse_args(["demo"]).starts_spark
    assert not parser.parse_args(["list"]).starts_spark


def test_a_spark_command_sends_what_lies_below_it_to_its_log(
    noisy_registry: dict[str, str],
) -> None:
    out = _verify_unknown(noisy_registry)
    log = Path(noisy_registry["WATERMARK_HOME"]) / "logs" / "verify.log"
    assert out.returncode == 2, (out.stdout, out.stderr)
    # The command's own message reaches the terminal; no pointer at the log, since the
    # command was refused before it started Spark...
    assert "nope" in out.stderr
    assert "what Spark and Dagster printed" not in out.stderr
    # ...while what was written below Python and the warnings went to the log.
    assert "NativeNoise" not in out.stderr + out.stdout
    assert "pandas-like noise" not in out.stderr + out.stdout
    text = log.read_text()
    assert "NativeNoise" in text
    assert "pandas-like noise" in text


@pytest.mark.parametrize("how", ["flag", "env"])
def test_verbose_shows_everything_and_writes_no_log(
    noisy_registry: dict[str, str], how: str
) -> None:
    if how == "env":
        out = _verify_unknown({**noisy_registry, "WATERMARK_VERBOSE": "1"})
    else:
        out = _verify_unknown(noisy_registry, "-v")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "NativeNoise" in out.stderr
    assert "pandas-like noise" in out.stderr
    assert "what Spark and Dagster printed" not in out.stderr
    assert not (Path(noisy_registry["WATERMARK_HOME"]) / "logs").exists()


@pytest.mark.filterwarnings("ignore:pandas-like noise")
def test_a_quiet_command_restores_stderr_when_it_returns(
    noisy_registry: dict[str, str],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Embedded (``main(argv)``), the command leaves the process's stderr as it found it."""
    from watermark_dagster.cli import main

    for key in ("WATERMARK_HOME", "DAGSTER_HOME", "WATERMARK_REGISTRY"):
        monkeypatch.setenv(key, noisy_registry[key])
    monkeypatch.syspath_prepend(noisy_registry["PYTHONPATH"].split(os.pathsep)[0])
    assert main(["verify", "-p", "nope"]) == 2
    os.write(2, b"after the command\n")
    err = capfd.readouterr().err
    assert "after the command" in err
    assert "NativeNoise" not in err


def test_a_quiet_command_that_started_spark_names_its_log_when_it_fails(
    tmp_path: Path, dagster_home: Path
) -> None:
    """``verify`` of a real target starts Spark, whose master here cannot start: the
    failure names the log where Spark's own output went (no JVM runs: the master is
    refused, or the no-JVM tiers' java refuses to start)."""
    from tests.support.blocked import blocked_lake
    from tests.support.lakes import location_defs, location_path, write_spec

    lake = blocked_lake(tmp_path, dagster_home)
    spec_file = write_spec(tmp_path / "spec.json", lake.spec)
    home = tmp_path / "wm"
    env = {
        **os.environ,
        "PYTHONPATH": location_path(spec_file),
        "DAGSTER_HOME": str(dagster_home),
        "WATERMARK_HOME": str(home),
    }
    env.pop("WATERMARK_VERBOSE", None)
    out = subprocess.run(
        [str(SCRIPT), "verify", "-p", "other_copy", "--defs", location_defs(spec_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode != 0, (out.stdout, out.stderr)
    assert f"what Spark and Dagster printed: {home / 'logs' / 'verify.log'}" in out.stderr, (
        out.stderr
    )
