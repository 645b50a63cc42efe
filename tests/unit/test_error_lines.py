"""Errors in tables and control-table rows are one line: type, message and fix, never the
JVM or Python stack Spark's errors carry in their text (`watermark batch` once printed a
whole JVM stack inside one table cell)."""

from watermark_dagster.errors import TerminalError, error_line, one_line

# What str() of Spark 4's captured errors and of Py4J's errors look like (shortened).
CAPTURED = (
    "[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] Transaction conflict detected. A concurrent "
    "MERGE added data to table delta.`/lake/orders_enriched`. Please retry the operation.\n"
    "\nJVM stacktrace:\nio.delta.exceptions.ConcurrentAppendException: [DELTA_CONCURRENT...\n"
    "\tat org.apache.spark.sql.delta.ConflictChecker.checkForAddedFilesThatShouldHave"
    "BeenReadByCurrentTxn(ConflictChecker.scala:402)\n\tat scala.Option.foreach(Option.scala:437)"
)
PY4J = (
    "An error occurred while calling o412.save.\n: org.apache.spark.SparkException: Job "
    "aborted due to stage failure: Task 0 in stage 3.0 failed\n\tat org.apache.spark.scheduler."
    "DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2856)\n\tat scala.collection."
)
TRACEBACK = (
    "injected failure in clicks_copy\nTraceback (most recent call last):\n  File "
    '"/x/transform.py", line 3, in run\n    raise RuntimeError'
)


def test_a_spark_error_becomes_one_line_without_its_stack() -> None:
    line = one_line(CAPTURED)
    assert "\n" not in line
    assert line.startswith("[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] Transaction conflict")
    assert line.endswith("Please retry the operation.")
    assert "ConflictChecker" not in line
    py4j = one_line(PY4J)
    assert py4j == (
        "An error occurred while calling o412.save. : org.apache.spark.SparkException: Job "
        "aborted due to stage failure: Task 0 in stage 3.0 failed"
    )
    assert one_line(TRACEBACK) == "injected failure in clicks_copy"


def test_an_error_line_names_the_type_and_keeps_our_fix() -> None:
    assert error_line(RuntimeError(CAPTURED)).startswith("RuntimeError: [DELTA_CONCURRENT_APPEND")
    ours = TerminalError(
        "Upstream 'orders' was recreated.\n", fix="run `watermark reset -t orders`."
    )
    assert error_line(ours) == (
        "TerminalError: Upstream 'orders' was recreated. Fix: run `watermark reset -t orders`."
    )
    assert error_line(RuntimeError("")) == "RuntimeError"
    assert len(error_line(RuntimeError("x" * 5000), limit=100)) == 100
