"""A class data sharing archive of Spark's classes, so the suite's JVMs start faster.

The suite starts many Spark driver JVMs (not counted): every ``watermark`` command, run
process, engine and crash-test child is one. Each spends seconds loading and verifying the
same classes of PySpark's jars. Java 17 can map them from an archive instead
(AppCDS): measured on this project's 2-core machine, a child process starting Spark and
writing and reading a Delta table took 12-15 s against 18-22 s without it.

How it is used (``tests/conftest.py``):

* When a session will start JVMs, the archive is made once per virtual environment, in
  the background: a child process runs a small Spark and Delta workload with
  ``-XX:ArchiveClassesAtExit`` (about a minute on 2 cores). Tests go on
  meanwhile; a file lock keeps two sessions from making it at once.
* Once the archive exists, each test process adds ``-XX:SharedArchiveFile`` to
  ``SPARK_SUBMIT_OPTS``, which ``spark-submit`` gives to every driver JVM it starts
  (the test process's own Spark session, and its children, which inherit the variable).

A JVM whose class path does not match the archive runs as it would without it; its
notice about that is switched off (``-Xlog:cds*=off``) because the JVM prints it on
standard output, which some commands answer with JSON. The archive lives in the virtual
environment (``.venv/watermark-test-cds/``), named by the Java version and PySpark's jars,
so a new JDK or PySpark makes a new one and removes the old. Only classes of the JVM's own
class path are archived: Delta's jars, which Spark loads itself, are not.

Nothing here changes what the product does: it is the tests' JVM start-up alone.
"""

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FOLDER = Path(sys.prefix) / "watermark-test-cds"
OPTIONS_VARIABLE = "SPARK_SUBMIT_OPTS"
QUIET = "-Xlog:cds*=off"


def _java_version() -> str:
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if "JAVA_HOME" in os.environ else "java"
    try:
        done = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return ""
    return done.stderr


def archive_path() -> Path | None:
    """Where the archive for this Java and PySpark lives (None when there is no Java, or
    when ``WATERMARK_TEST_CDS=0`` switches the archive off, e.g. to measure without it)."""
    import pyspark

    if os.environ.get("WATERMARK_TEST_CDS") == "0":
        return None
    version = _java_version()
    if not version:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    listing = sorted(f"{p.name}:{p.stat().st_size}" for p in jars.glob("*.jar"))
    key = hashlib.sha256("\n".join([version, str(jars), *listing]).encode()).hexdigest()[:16]
    return FOLDER / f"spark-{key}.jsa"


def use_if_ready(path: Path | None) -> bool:
    """Point ``SPARK_SUBMIT_OPTS`` at the archive once it exists; True when it does."""
    if path is None or not path.is_file():
        return False
    current = os.environ.get(OPTIONS_VARIABLE, "")
    if str(path) not in current:
        option = f"-XX:SharedArchiveFile={path} {QUIET}"
        os.environ[OPTIONS_VARIABLE] = f"{current} {option}".strip()
    return True


def start_making(path: Path | None) -> subprocess.Popen[bytes] | None:
    """Make the archive in a background process unless it exists (or another session is
    making it); the process, or None."""
    if path is None or path.is_file():
        return None
    try:
        FOLDER.mkdir(exist_ok=True)
    except OSError:  # a read-only environment: the suite runs without the archive
        return None
    log = FOLDER / "make.log"
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.jvm_archive", str(path)],
            cwd=Path(__file__).resolve().parents[1],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


WORKLOAD = """
import sys
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from tests.conftest import SPARK_TEST_CONF
from watermark_dagster.runtime.spark import build_spark_session

root = sys.argv[1]
spark = build_spark_session(master="local[2]", app_name="cds", conf=SPARK_TEST_CONF)
rows = spark.range(1000).withColumn("value", F.col("id") * 2)
rows.write.format("delta").option("delta.enableChangeDataFeed", "true").save(root + "/t")
table = DeltaTable.forPath(spark, root + "/t")
changes = spark.range(990, 1010).withColumn("value", F.col("id") * 3)
(
    table.alias("t")
    .merge(F.broadcast(changes).alias("s"), "t.id = s.id")
    .whenMatchedUpdateAll()
    .whenNotMatchedInsertAll()
    .execute()
)
feed = spark.read.format("delta").option("readChangeFeed", "true").option(
    "startingVersion", 1
).load(root + "/t")
feed.groupBy("_change_type").count().join(rows.limit(3), F.lit(True)).collect()
table.history().collect()
gateway = spark.sparkContext._gateway
spark.stop()
gateway.shutdown()
gateway.proc.stdin.close()  # the JVM exits, writing the archive first
gateway.proc.wait()
"""


def make(path: Path) -> None:
    """Run the workload in a JVM that writes the archive as it exits, under a lock; the
    archive appears at ``path`` whole or not at all."""
    FOLDER.mkdir(exist_ok=True)
    with (FOLDER / "lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another session is making it
        if path.is_file():
            return
        partial = FOLDER / "partial.jsa"  # beside the archive: the rename is atomic
        partial.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory() as work:
            env = {**os.environ, OPTIONS_VARIABLE: f"-XX:ArchiveClassesAtExit={partial}"}
            subprocess.run([sys.executable, "-c", WORKLOAD, work], env=env, check=True, timeout=900)
        if not partial.is_file():
            raise RuntimeError("the JVM wrote no archive")
        for old in FOLDER.glob("spark-*.jsa"):
            old.unlink()
        os.replace(partial, path)


if __name__ == "__main__":
    make(Path(sys.argv[1]))
