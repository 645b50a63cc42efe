"""The touched keys written into a plan as an ``IN`` (watermark_dagster/read/key_values.py):
the same expression and the same rows as PySpark's own ``Column.isin`` for every key type,
built with one py4j call per value where PySpark's makes about three (the literals were most
of a declared batch's driver time; ``python -m benchmarks.jobs``)."""

import gc
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.read.key_values import one_of, where_in

pytestmark = pytest.mark.spark

CASES = {
    "bigint": (T.LongType(), [3, 1, 2], [1, 3]),
    "string": (T.StringType(), ["a", "b'c", "d"], ["b'c", "d"]),
    "decimal": (T.DecimalType(10, 2), [Decimal("1.50"), Decimal("2.00")], [Decimal("2.00")]),
    "date": (T.DateType(), [date(2026, 1, 1), date(2026, 12, 2)], [date(2026, 12, 2)]),
    "timestamp": (
        T.TimestampType(),
        [datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 3, 29, 1, 30, tzinfo=UTC)],
        [datetime(2026, 3, 29, 1, 30, tzinfo=UTC)],
    ),
    "timestamp_ntz": (
        T.TimestampNTZType(),
        [datetime(2026, 1, 1), datetime(2026, 3, 29, 2, 30)],
        [datetime(2026, 3, 29, 2, 30)],
    ),
    "double": (T.DoubleType(), [1.5, 2.25, -0.0], [2.25]),
    "boolean": (T.BooleanType(), [True, False], [False]),
    "binary": (T.BinaryType(), [bytearray(b"ab"), bytearray(b"cd")], [bytearray(b"cd")]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_in_matches_pysparks_own_rows_with_null_equal_to_null(
    spark: SparkSession, case: str
) -> None:
    dtype, stored, touched = CASES[case]
    schema = T.StructType([T.StructField("k", dtype, True), T.StructField("n", T.IntegerType())])
    frame = spark.createDataFrame([(v, i) for i, v in enumerate([*stored, None])], schema)
    values = [(v,) for v in touched]
    picked = sorted(r.n for r in where_in(frame, ["k"], values).collect())
    assert picked == sorted(stored.index(v) for v in touched), case
    # PySpark's own isin gives the same rows (for the values PySpark itself can write).
    if not isinstance(dtype, T.TimestampNTZType):
        own = sorted(r.n for r in frame.where(F.col("k").isin(touched)).collect())
        assert picked == own, case
    # A NULL among the touched keys matches the NULL key too, and nothing else more.
    with_null = sorted(r.n for r in where_in(frame, ["k"], [*values, (None,)]).collect())
    assert with_null == sorted([*picked, len(stored)]), case


def test_an_in_of_many_keys_is_the_same_expression_in_a_third_of_the_py4j_calls(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = spark.sparkContext._gateway._gateway_client  # type: ignore[union-attr]
    calls = {"n": 0}
    send = client.send_command

    def counted(command, *args, **kwargs):
        # Not Python's garbage collection of JavaObjects that earlier tests of the worker
        # made: py4j sends each deletion ("m\nd\n...") through the same client, whenever
        # the collector runs, so counting them made the figures depend on the module order.
        if not str(command).startswith("m\nd\n"):
            calls["n"] += 1
        return send(command, *args, **kwargs)

    # Once before counting: the first use of each function looks its JVM classes up.
    one_of(F.col("k"), [(0,)], T.LongType())
    F.col("k").isin([0])
    gc.collect()
    monkeypatch.setattr(client, "send_command", counted)
    values = [(i,) for i in range(2_000)]
    ours = one_of(F.col("k"), values, T.LongType())
    ours_calls, calls["n"] = calls["n"], 0
    own = F.col("k").isin([v[0] for v in values])
    own_calls = calls["n"]
    assert str(ours) == str(own)
    # One call per value to hand it over, and a few to build the expression; PySpark's own
    # makes each value a literal first (a look-up and a call more per value).
    assert ours_calls <= len(values) + 20, ours_calls
    assert own_calls >= 2 * len(values), own_calls
