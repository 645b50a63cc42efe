"""Shared fixtures: one local Spark session per test process, temporary homes."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests import jvm_archive
from watermark_dagster.runtime.jdbc import JDBC_DRIVERS_KEY

REPO = Path(__file__).resolve().parents[1]

# Spark compiles each new query's plan to Java (whole-stage code generation, Janino). On
# the tests' small data that compiling is most of the work: 37% of a test JVM's CPU
# samples (Java Flight Recorder, `python -m benchmarks.jobs --warm 2` at 2,000 orders),
# and each batch's plans are new (their literals, a batch's sequence number among them, are
# written into the code). Each test process's own session (LONG_LIVED_SPARK_CONF)
# evaluates plans interpreted instead: the same results by Spark's contract (its own tests
# run both ways). tests/spark/test_maintain.py's main test: 145 s against 180 s alone;
# test_declared_proofs' main test with two copies at once, as under -n 2: 264 s against
# 312 s. The JVMs the tests start (runs, commands, engines, servers) keep code generation,
# as do the timing benchmarks (benchmarks/): tests/spark/test_cli_run.py, all child JVMs,
# took 82 s interpreted against 83 s, no gain. WATERMARK_TEST_CODEGEN=1 keeps it
# everywhere.
INTERPRETED_CONF = (
    {}
    if os.environ.get("WATERMARK_TEST_CODEGEN") == "1"
    else {
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    }
)
# Small-data settings: one session, two cores, few partitions.
SPARK_TEST_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.databricks.delta.snapshotPartitions": "1",
    # Short-lived JVMs (child processes, runs): quick JIT and a simple collector start and
    # run small jobs faster.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}

# The test session's own JVM lives for a whole module: there C2 pays back, but only for
# the hottest code. Spark generates and loads new classes query after query, and with
# C2's default thresholds compiling them took 71 of the JVM's 140 CPU-seconds in
# tests/spark/test_maintain.py's main test; under -n 2 both cores are busy, so that
# competes with the other worker. That test, two copies at once as under -n 2: 298 s
# with the default JIT, 263 s with C1 only, 249 s with C2's thresholds raised 8x and two
# compiler threads (alone on the machine the three are within noise, 157-172 s).
# It also loads the JDBC drivers of database upstreams (tests/spark/test_database_upstream.py):
# 2.0 MB of jars, resolved once with Delta's.
LONG_LIVED_SPARK_CONF = {
    **SPARK_TEST_CONF,
    "spark.driver.extraJavaOptions": " ".join(
        (
            "-XX:+UseSerialGC",
            "-XX:CICompilerCount=2",
            "-XX:Tier4InvocationThreshold=40000",
            "-XX:Tier4MinInvocationThreshold=20000",
            "-XX:Tier4CompileThreshold=45000",
            "-XX:Tier4BackEdgeThreshold=400000",
        )
    ),
    JDBC_DRIVERS_KEY: "true",
    **INTERPRETED_CONF,
    # Declared batches in the test process read joined upstreams only for the touched keys
    # (off by default, watermark_dagster/read/reach.py): the property tests, the model and
    # the SQL shapes prove that path; the runs the tests start read them whole, the default.
    "spark.watermark.declared.readJoinedByKeys": "true",
}

# The class archive JVMs of this run start from once it is made (tests/jvm_archive.py); set
# when the collected tests will start JVMs.
_JVM_ARCHIVE: Path | None = None


@pytest.fixture(scope="session")
def spark():  # yields a pyspark SparkSession
    """The one Spark session of this test process (local[2], Delta configured)."""
    from watermark_dagster.runtime.spark import build_spark_session

    jvm_archive.use_if_ready(_JVM_ARCHIVE)
    session = build_spark_session(
        master="local[2]", app_name="watermark-tests", conf=LONG_LIVED_SPARK_CONF
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def _dagster_home_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DAGSTER_HOME holding the repository's dagster.yaml and the SQLite storages an
    instance creates on its first open (runs, the event log's index, schedules), made once
    per test process. Creating them is most of opening a new instance: 2.2-3.3 s against
    0.15-0.18 s for a copy, measured beside a load of 10 on 2 cores."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    home = tmp_path_factory.mktemp("dagster_home_template")
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    DagsterInstance.from_ref(InstanceRef.from_dir(str(home))).dispose()
    return home


@pytest.fixture
def dagster_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _dagster_home_template: Path
) -> Path:
    """A temporary DAGSTER_HOME holding the repository's dagster.yaml, its storages as a
    new instance creates them (a copy of :func:`_dagster_home_template`'s: the same files
    the test's first open would write, empty)."""
    home = tmp_path / "dagster_home"
    shutil.copytree(_dagster_home_template, home)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture
def watermark_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary WATERMARK_HOME (demo tables and control tables)."""
    home = tmp_path / "watermark_home"
    home.mkdir()
    monkeypatch.setenv("WATERMARK_HOME", str(home))
    return home


# Markers of the tests that start a JVM (or may: slow and soak runs are Spark end to end).
JVM_MARKERS = ("spark", "live", "slow", "soak", "scale", "e2e")


def pytest_configure(config: pytest.Config) -> None:
    """Spark's Python workers use this interpreter, and runs in the test processes start
    their own session: an engine that `watermark dev` keeps up for the default home would
    otherwise turn a worker into a Spark Connect client for good (tests that use an engine
    set WATERMARK_ENGINE for their own processes)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("WATERMARK_ENGINE", "process")


# The default suite's longest modules, longest first (seconds of their tests under
# `pytest -n 2` on 2 cores, `--durations`, on e234716 with the host taking about a quarter
# of the CPU time: /proc/stat's steal). Under `pytest -n 2` (README, .ci/run) each module
# goes to one worker whole (`--dist loadfile`: module fixtures and servers are built once),
# in collection order: starting the longest first lets the two workers finish together
# instead of one of them starting a five-minute module at the end. Modules not listed keep
# their order after these. (The e2e tier's modules, out of the default suite, are not.)
LONGEST_MODULES = (
    "tests/crash/test_crashes.py",  # 1,053 s
    "tests/spark/test_declared.py",  # 777 s (about 480 s without its two e2e tests)
    "tests/spark/test_read_modes.py",  # 601 s
    "tests/spark/test_declared_proofs.py",  # 378 s
    "tests/spark/test_warehouse.py",  # 255 s alone (three killed runs)
    "tests/spark/test_maintain.py",  # 342 s
    "tests/spark/test_flow.py",  # 342 s
    "tests/spark/test_writes.py",  # 301 s
    "tests/model/test_declared.py",  # 279 s
    # Older figures (their runs had more CPU): 206, 213, 153 s.
    "tests/model/test_sql_shapes.py",
    "tests/spark/test_database_upstream.py",
    "tests/spark/test_landing.py",
    "tests/model/test_model.py",  # 242 s
    "tests/spark/test_control_root_binding.py",  # 181 s or more
)


def _module_order(items: list[pytest.Item]) -> dict[str, tuple[int, int]]:
    """Each module's place: those of :data:`LONGEST_MODULES` first, in its order; then the
    other modules with a test that starts a JVM (a marker of :data:`JVM_MARKERS`); then the
    modules with none (the tiers tests/unit, tests/store and tests/dagster: many short
    modules, so the two workers run out of work within seconds of each other instead of
    one of them starting a JVM module when the other has nothing left)."""
    rank = {module: i for i, module in enumerate(LONGEST_MODULES)}
    with_jvm = {
        item.nodeid.split("::", 1)[0]
        for item in items
        if any(item.get_closest_marker(m) for m in JVM_MARKERS)
    }
    return {
        module: (rank[module], 0) if module in rank else (len(rank), 0 if module in with_jvm else 1)
        for module in {item.nodeid.split("::", 1)[0] for item in items}
    }


@pytest.hookimpl(trylast=True)  # after `-m` has deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest modules first, modules without a JVM last (see :func:`_module_order`); a
    run of no-JVM tests only (the tiers tests/unit, tests/store and tests/dagster, or any
    selection without a JVM marker) refuses to start a JVM."""
    order = _module_order(items)
    # A stable sort: each module's tests keep their own order.
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])
    if items and not any(item.get_closest_marker(m) for item in items for m in JVM_MARKERS):
        _refuse_jvm_starts()
    elif items:
        # JVMs ahead: their classes from an archive once it is made (tests/jvm_archive.py).
        global _JVM_ARCHIVE
        _JVM_ARCHIVE = jvm_archive.archive_path()
        if not jvm_archive.use_if_ready(_JVM_ARCHIVE):
            jvm_archive.start_making(_JVM_ARCHIVE)


@pytest.fixture(autouse=True)
def _jvm_archive_when_ready() -> None:
    """Every test's JVMs start from the class archive as soon as it exists (a file check)."""
    jvm_archive.use_if_ready(_JVM_ARCHIVE)


def _refuse_jvm_starts() -> None:
    """The fast tiers promise no JVM: point ``JAVA_HOME`` (which Spark's launcher uses
    before ``PATH``) at a ``java`` that fails, naming the tier, so a test that starts Spark
    without the ``spark`` marker (or outside tests/spark) fails instead of slowing them."""
    home = Path(tempfile.mkdtemp(prefix="watermark-no-jvm-"))
    java = home / "bin" / "java"
    java.parent.mkdir()
    java.write_text(
        "#!/bin/sh\n"
        'echo "this test started a JVM in a no-JVM run: mark it @pytest.mark.spark and '
        'move it to tests/spark" >&2\n'
        "exit 97\n"
    )
    java.chmod(0o755)
    os.environ["JAVA_HOME"] = str(home)
