"""The home's engine: `watermark engine` runs a Spark Connect server with Delta, and the runs
of that home use it as clients, starting no JVM of their own; it restarts a server that
died, and without it runs start their own JVM again.

Real processes throughout: the engine and every `watermark run` are console-script
subprocesses, the run processes get a JAVA_HOME shim that records any JVM launch, and the
server is killed with SIGKILL. Connect clients run in subprocesses only: a process that has
used Spark Connect is in Connect mode for good, which the classic session of this test
process must not be.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef
from deltalake import DeltaTable as RsDeltaTable

from tests.conftest import REPO, SPARK_TEST_CONF
from tests.support.cli import SCRIPT
from tests.support.engine import Engine, running_engine
from tests.support.java_shim import java_shim
from tests.support.plan_checks import HIDING
from watermark_dagster.dagster_defs.assets import ENGINE_TAG
from watermark_dagster.dagster_defs.runs import DIED_TAG
from watermark_dagster.demo import DemoPaths, apply_round, seed
from watermark_dagster.demo.verify import compare_with_full_recompute
from watermark_dagster.runtime.connect import free_port, live_engine, read_record

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

START_TIMEOUT = 600


def _server_storage(ui_port: int) -> list:
    """The RDDs the server's Spark holds persisted, from its web UI's REST API."""
    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    with urllib.request.urlopen(base, timeout=30) as reply:
        [app] = json.load(reply)
    with urllib.request.urlopen(f"{base}/{app['id']}/storage/rdd", timeout=30) as reply:
        return json.load(reply)


def _env(home: Path, conf: dict[str, str] | None = None) -> dict[str, str]:
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dagster.yaml", dagster_home / "dagster.yaml")
    env = {
        **os.environ,
        "WATERMARK_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        "WATERMARK_SPARK_MASTER": "local[2]",
        "WATERMARK_SPARK_CONF": json.dumps({**SPARK_TEST_CONF, **(conf or {})}),
        "NO_COLOR": "1",
    }
    for name in ("WATERMARK_ENGINE", "WATERMARK_SPARK_REMOTE", "WATERMARK_REGISTRY"):
        env.pop(name, None)
    return env


def _run(env: dict[str, str], *, ok: bool = True) -> dict:
    proc = subprocess.run(
        [str(SCRIPT), "run", "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _run_tags(dagster_home: Path, tag: str) -> list[str | None]:
    """Tag ``tag`` of every run of the instance, oldest first."""
    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        return [r.tags.get(tag) for r in reversed(instance.get_runs())]
    finally:
        instance.dispose()


def _engine_tags(dagster_home: Path) -> list[str | None]:
    return _run_tags(dagster_home, ENGINE_TAG)


def _assert_exact(spark, paths: DemoPaths) -> None:
    for check in compare_with_full_recompute(spark, paths):
        assert check.ok, (check.target, check.missing, check.unexpected)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _wait(what: str, condition, timeout: float = START_TIMEOUT):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)
    return found


def test_runs_use_the_home_engine_start_no_jvm_and_survive_its_restart(
    spark, tmp_path: Path
) -> None:
    paths = DemoPaths(tmp_path / "wm")
    seed(spark, paths)
    ui_port = free_port()
    # The server's web UI on, for its storage page (below).
    ui = {"spark.ui.enabled": "true", "spark.ui.port": str(ui_port)}
    env = _env(paths.home, ui)
    java_home, launches = java_shim(tmp_path)
    run_env = {**env, "JAVA_HOME": str(java_home)}
    with running_engine(paths.home, env, tmp_path / "engine.out") as engine:
        record = engine.record()
        assert engine.ready == {
            "url": record.url,
            "pid": engine.process.pid,
            "server_pid": record.server_pid,
            "log": str(paths.home / "logs" / "spark-connect.log"),
        }
        assert record.url == f"sc://127.0.0.1:{record.port}"
        assert Path(record.log).is_file()

        # A second engine for the same home is refused, naming the first; nothing started.
        second = subprocess.run(
            [str(SCRIPT), "engine"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        assert second.returncode == 2, second.stderr
        assert f"An engine is already up for this home: {record.url}" in second.stderr
        assert engine.record() == record

        # WATERMARK_ENGINE unset ("auto"): the run finds the engine and starts no JVM.
        first = _run(run_env)  # the first loads
        assert len(first["completed"]) == 1
        assert not launches.exists(), launches.read_text()
        assert set(_engine_tags(paths.home / "dagster")) == {f"connect:{record.url}"}
        _assert_exact(spark, paths)

        # The server dies: the engine starts it again and rewrites the record; the next
        # run (engine "connect": the engine only) uses the new server.
        os.kill(record.server_pid, signal.SIGKILL)
        restarted = _wait(
            "the engine to restart its server",
            lambda: (r := live_engine(engine.folder)) and r.restarts == 1 and r,
        )
        assert restarted.server_pid != record.server_pid
        apply_round(spark, paths, 1)  # an incremental batch, on the new server
        third = _run({**run_env, "WATERMARK_ENGINE": "connect"})
        assert len(third["completed"]) == 1
        assert not launches.exists(), launches.read_text()
        assert _engine_tags(paths.home / "dagster")[-1] == f"connect:{restarted.url}"
        _assert_exact(spark, paths)
        # The run released every frame it persisted: the server (started again with the
        # same settings, its web UI on the same port) holds no cached data but Delta's own
        # cached log states (its storage page lists every persisted RDD).
        cached = [r["name"] for r in _server_storage(ui_port)]
        assert [n for n in cached if not n.startswith("Delta Table State")] == [], cached
        assert cached, "the storage page lists nothing: it would not show a leak either"
        assert "started again" in engine.output.read_text()

        # Stopped, it leaves no server and no record behind.
        assert engine.stop() == 0, engine.output.read_text()[-3000:]
        assert not _alive(restarted.server_pid)
        assert read_record(engine.folder) is None
    # Without a record, runs start their own session, as every run of the other test
    # modules does (tests/spark/test_cli_run.py checks their tag, "process").


ISOLATION = textwrap.dedent(
    """
    import json, sys, threading
    from watermark_dagster.runtime.spark import build_spark_session
    from watermark_dagster.write.commits import labelled_commits
    from watermark_dagster.frames.delta import USER_METADATA_CONF

    url, table = sys.argv[1], sys.argv[2]
    a = build_spark_session(remote=url, new_session=True)
    b = build_spark_session(remote=url, new_session=True)
    seen = {"sessions": len({a.client._session_id, b.client._session_id})}
    a.range(3).createOrReplaceTempView("only_in_a")
    seen["a_sees_its_view"] = a.catalog.tableExists("only_in_a")
    seen["b_sees_a_view"] = b.catalog.tableExists("only_in_a")
    a.conf.set("spark.sql.shuffle.partitions", "7")
    seen["b_partitions"] = b.conf.get("spark.sql.shuffle.partitions")
    cached = a.range(10).cache()
    cached.count()
    seen["b_cached"] = b.range(10).storageLevel.useMemory

    def write(session, who):
        # As a pipeline's write labels its commits: a session setting around the write.
        for i in range(4):
            with labelled_commits(session, who):
                session.createDataFrame([(who, i)], "who string, i int").write.format(
                    "delta"
                ).mode("append").save(table)

    threads = [threading.Thread(target=write, args=(s, w)) for s, w in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen["label_left_in_b"] = b.conf.get(USER_METADATA_CONF, None)
    # What a full transform reads, told from the client's own plan (no round trip): the
    # I6 check of declared pipelines over Connect; SQL text only the server can resolve.
    from watermark_dagster.read.transform_checks import relation_roots

    local = b.createDataFrame([("a", 1)], "who string, i int")
    joined = b.read.format("delta").load(table).join(local, "who").groupBy("who").count()
    seen["roots"] = relation_roots(joined)
    seen["roots_of_sql"] = relation_roots(b.sql("SELECT * FROM range(3)"))
    a.stop()
    c = build_spark_session(remote=url, new_session=True)
    seen["view_after_release"] = c.catalog.tableExists("only_in_a")
    seen["cached_after_release"] = c.range(10).storageLevel.useMemory
    for session in (b, c):
        session.stop()  # released, as a run's resource does (else grpc may hang at exit)
    print(json.dumps(seen), flush=True)
    """
)


@pytest.fixture(scope="class")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One engine for the tests of a class that need a server to be clients of: each
    client's sessions are its own (the isolation test checks what they share), and each
    test's runs have a Dagster home and a control root of their own, so one start serves
    them all (a start is a Spark Connect server's JVM: 15-30 s on 2 cores). The tests that
    kill the server or a client come last; the engine starts a killed server again."""
    folder = tmp_path_factory.mktemp("engine")
    env = _env(folder / "wm")
    with running_engine(folder / "wm", env, folder / "engine.out") as started:
        yield started


class TestClientsOfOneEngine:
    """Clients of one engine, started once for the class."""

    def test_runs_on_one_engine_are_isolated_sessions_and_label_their_own_commits(
        self, spark, tmp_path: Path, engine: Engine
    ) -> None:
        _isolated_sessions(spark, tmp_path, engine.record().url, engine.env)

    def test_what_a_python_full_transform_hides_is_refused_on_connect_too(
        self, tmp_path: Path, engine: Engine
    ) -> None:
        """The cases tests/spark/test_declared.py refuses on a local session (a table read
        in a subquery, collected rows, a checkpoint, reflect, a total over all rows), run by
        a client of the engine: the plan is the server's, read from its text. Each batch
        stops before writing (tests/support/plan_checks.py asserts it)."""
        _hiding_refused(tmp_path, engine.record().url, engine.env)

    def test_a_run_whose_engine_dies_under_it_fails_retryable_and_its_retry_applies_once(
        self, spark, tmp_path: Path, engine: Engine
    ) -> None:
        _engine_dies_under_a_run(spark, tmp_path, engine)

    def test_a_client_killed_after_its_target_commit_on_the_engine_applies_each_batch_once(
        self, spark, tmp_path: Path, engine: Engine
    ) -> None:
        """Issue 41, the Spark Connect path of the crash harness: `watermark run` runs as a
        client of the home's engine and is killed (SIGKILL, at the ``after_target_commit``
        fault point) right after the server committed one pipeline's write, first an
        append's, then, a batch later, a MERGE's. The next `watermark run` resumes each
        batch on the same engine, and the target's own record (the Delta transaction every
        scheduled write carries) keeps the write from landing twice: each target equals its
        upstream and holds one data commit per batch."""
        _client_killed_after_its_target_commit(spark, tmp_path, engine)


def _own_homes(engine: Engine, folder: Path) -> dict[str, str]:
    """The engine's environment with a Dagster home of the test's own (its runs' tags are
    read back): the engine's home, where the runs find its record, is shared."""
    dagster_home = folder / "dagster"
    dagster_home.mkdir()
    shutil.copy(REPO / "dagster.yaml", dagster_home / "dagster.yaml")
    return {**engine.env, "DAGSTER_HOME": str(dagster_home)}


def _isolated_sessions(spark, tmp_path: Path, url: str, env: dict[str, str]) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    table = tmp_path / "shared"
    spark.createDataFrame([], "who string, i int").write.format("delta").save(str(table))
    assert _client(ISOLATION, [url, str(table)], env) == {
        "sessions": 2,
        "a_sees_its_view": True,
        "b_sees_a_view": False,
        "b_partitions": SPARK_TEST_CONF["spark.sql.shuffle.partitions"],
        "label_left_in_b": None,
        "roots": [str(table)],
        "roots_of_sql": None,
        "view_after_release": False,
        # Spark's cache is the server's, shared by its sessions and kept past a release:
        # what a run caches it must unpersist itself (the first test checks that the
        # pipelines' runs leave nothing cached).
        "b_cached": True,
        "cached_after_release": True,
    }
    # Eight commits from two sessions at once: each is labelled by the session that made
    # it, which is also who wrote its row.
    history = DeltaTable.forPath(spark, str(table)).history().collect()
    commits = {h.version: h.userMetadata for h in history if h.version > 0}
    assert sorted(commits.values()) == ["a"] * 4 + ["b"] * 4, commits
    rows = spark.read.format("delta").option("readChangeFeed", "false").load(str(table))
    for version, label in commits.items():
        now = spark.read.format("delta").option("versionAsOf", version).load(str(table))
        before = spark.read.format("delta").option("versionAsOf", version - 1).load(str(table))
        added = {r.who for r in now.exceptAll(before).collect()}
        assert added == {label}, (version, label, added)
    assert rows.groupBy("who").agg(F.count("*").alias("n")).orderBy("who").collect() == [
        ("a", 4),
        ("b", 4),
    ]


HIDING_ON_CONNECT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from tests.support.plan_checks import HIDING, hiding_pipeline, refused, tiers_table
    from watermark_dagster.runtime.spark import build_spark_session

    url, root = sys.argv[1], Path(sys.argv[2])
    spark = build_spark_session(remote=url, new_session=True)
    said = {}
    for name, _, fragment in HIDING:
        folder = root / name
        pipeline = hiding_pipeline(name, folder, tiers_table(spark, folder))
        said[name] = refused(spark, folder, pipeline, fragment)
    spark.stop()
    print(json.dumps(said), flush=True)
    """
)


def _hiding_refused(tmp_path: Path, url: str, env: dict[str, str]) -> None:
    said = _client(HIDING_ON_CONNECT, [url, str(tmp_path)], env)
    assert sorted(said) == sorted(name for name, _, _ in HIDING)


def _client(script: str, args: list[str], env: dict[str, str]) -> dict:
    """What ``script``, run as a Connect client in a process of its own, printed last (a
    process that used Spark Connect stays in Connect mode: not this one)."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


KILLER = '''
"""A transform that kills its engine's server once, before its run writes."""

import json
import os
import signal
from pathlib import Path


def events_log(batch):
    rows = batch["events"].changes.select("id", "amount")
    marker = Path(os.environ["WM_KILLED_MARK"])
    if not marker.exists():
        marker.write_text("killed")
        record = Path(os.environ["WATERMARK_HOME"]) / "engine" / "connect.json"
        os.kill(json.loads(record.read_text())["server_pid"], signal.SIGKILL)
    return rows
'''


def _engine_dies_under_a_run(spark, tmp_path: Path, engine: Engine) -> None:
    env = _own_homes(engine, tmp_path)
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "wm_engine_killer.py").write_text(KILLER)
    events, target = tmp_path / "events", tmp_path / "events_log"
    spark.createDataFrame([(i, 10 * i) for i in range(5)], "id long, amount long").write.format(
        "delta"
    ).option("delta.enableChangeDataFeed", "true").save(str(events))
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        textwrap.dedent(
            f"""\
            control_root: {tmp_path / "control"}
            upstreams:
              events: {{path: {events}}}
            pipelines:
              events_log:
                upstreams: [events]
                target: {target}
                write: append
                transform: wm_engine_killer:events_log
            """
        )
    )
    mark = tmp_path / "killed"
    # The engine is started for the default code location; the runs load this registry
    # themselves: plans are built in the run process, the server only executes them.
    original = engine.record()
    run_env = {
        **env,
        "WATERMARK_REGISTRY": str(registry),
        "WATERMARK_ENGINE": "connect",
        "WM_KILLED_MARK": str(mark),
        "WATERMARK_DEATH_BACKOFF_SECONDS": "0",
        "PYTHONPATH": os.pathsep.join([str(modules), env.get("PYTHONPATH", "")]),
    }
    report = _run(run_env, ok=False)
    assert mark.exists(), json.dumps(report["runs"])
    failed = [r for r in report["runs"] if not r["success"]]
    assert len(failed) == 1, report["runs"]
    assert "EngineUnavailableError" in failed[0]["error"], failed[0]["error"]
    assert str(original.server_pid) in failed[0]["error"], failed[0]["error"]
    # A death, not a failure (it spends no attempt): the coordinator retried the batch
    # on the restarted server, applied once.
    assert report["completed"] == ["b000001"], report
    died = [t for t in _run_tags(Path(env["DAGSTER_HOME"]), DIED_TAG) if t]
    assert len(died) == 1, died
    assert "its Spark engine went away" in died[0], died
    assert engine.record().server_pid != original.server_pid
    appended = spark.read.format("delta").load(str(target))
    assert sorted((r.id, r.amount) for r in appended.collect()) == [(i, 10 * i) for i in range(5)]


COPIES = '''
"""The transforms of the client-kill test: an append and a merge of one upstream."""


def events_log(batch):
    return batch["events"].changes.select("id", "amount")


def events_copy(batch):
    return batch["events"].net_changes(["id"]).drop("_commit_timestamp")
'''


def _client_killed_after_its_target_commit(spark, tmp_path: Path, engine: Engine) -> None:
    env = _own_homes(engine, tmp_path)
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "wm_engine_copies.py").write_text(COPIES)
    events = tmp_path / "events"
    log_target, copy_target = tmp_path / "events_log", tmp_path / "events_copy"
    spark.createDataFrame([(i, 10 * i) for i in range(5)], "id long, amount long").write.format(
        "delta"
    ).option("delta.enableChangeDataFeed", "true").save(str(events))
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        textwrap.dedent(
            f"""\
            control_root: {tmp_path / "control"}
            upstreams:
              events: {{path: {events}}}
            pipelines:
              events_log:
                upstreams: [events]
                target: {log_target}
                write: append
                transform: wm_engine_copies:events_log
              events_copy:
                upstreams: [events]
                target: {copy_target}
                keys: [id]
                transform: wm_engine_copies:events_copy
            """
        )
    )
    run_env = {
        **env,
        "WATERMARK_REGISTRY": str(registry),
        "WATERMARK_ENGINE": "connect",
        "WATERMARK_DEATH_BACKOFF_SECONDS": "0",
        "PYTHONPATH": os.pathsep.join([str(modules), env.get("PYTHONPATH", "")]),
    }
    for round_, pipeline in enumerate(("events_log", "events_copy")):
        if round_:
            spark.createDataFrame([(5, 50), (6, 60)], "id long, amount long").write.format(
                "delta"
            ).mode("append").save(str(events))
        killed = subprocess.run(
            [str(SCRIPT), "run", "--json"],
            env={**run_env, "WATERMARK_FAULTS": f"after_target_commit@{pipeline}"},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
        )
        assert killed.returncode == 128 + signal.SIGKILL, killed.stderr[-3000:]
        report = _run(run_env)
        assert report["completed"] == [f"b00000{round_ + 1}"], report
    upstream = spark.read.format("delta").load(str(events)).collect()
    source = sorted((r.id, r.amount) for r in upstream)
    for target in (log_target, copy_target):
        rows = spark.read.format("delta").load(str(target)).select("id", "amount").collect()
        assert sorted((r.id, r.amount) for r in rows) == source, target
        written = [
            str(c.get("userMetadata") or "").split(" seq=")[0]
            for c in RsDeltaTable(str(target)).history()
            if str(c.get("userMetadata") or "").startswith("watermark pipeline=")
        ]
        assert sorted(written) == sorted(set(written)), (target, written)
        assert len(written) == 2, (target, written)
