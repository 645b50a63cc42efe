"""Demo upstreams: customers, orders and payments, with change data feed on.

``seed`` creates them; each ``apply_round`` commits inserts, updates and deletes over
several versions, deterministically from the round number, so tests and the docs'
demo see the same history.
"""

import random

from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from watermark_dagster.demo.paths import DemoPaths

CUSTOMERS = T.StructType(
    [
        T.StructField("customer_id", T.LongType(), False),
        T.StructField("name", T.StringType(), True),
        T.StructField("city", T.StringType(), True),
    ]
)
ORDERS = T.StructType(
    [
        T.StructField("order_id", T.LongType(), False),
        T.StructField("customer_id", T.LongType(), True),
        T.StructField("amount_cents", T.LongType(), True),
        T.StructField("status", T.StringType(), True),
    ]
)
PAYMENTS = T.StructType(
    [
        T.StructField("payment_id", T.LongType(), False),
        T.StructField("customer_id", T.LongType(), True),
        T.StructField("amount_cents", T.LongType(), True),
    ]
)
UPSTREAMS = {"customers": CUSTOMERS, "orders": ORDERS, "payments": PAYMENTS}
_KEYS = {"customers": "customer_id", "orders": "order_id", "payments": "payment_id"}
_CITIES = ["Lisbon", "Oslo", "Quito", "Hanoi", "Perth", "Tunis"]
_NAMES = ["Ada", "Grace", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia", "Leslie"]


def _exists(spark: SparkSession, path: str) -> bool:
    return DeltaTable.is_deltatable(path)


def seed(spark: SparkSession, paths: DemoPaths) -> bool:
    """Create the three upstreams at version 0 (CDF on). Returns False if they existed."""
    if all(_exists(spark, paths.upstream(n)) for n in UPSTREAMS):
        return False
    customers = [(i, _NAMES[i % len(_NAMES)], _CITIES[i % len(_CITIES)]) for i in range(1, 6)]
    orders = [(100 + i, 1 + i % 5, 1000 + 250 * i, "new") for i in range(8)]
    payments = [(500 + i, 1 + (i * 2) % 5, 700 + 100 * i) for i in range(6)]
    for name, rows in (("customers", customers), ("orders", orders), ("payments", payments)):
        (
            spark.createDataFrame(rows, UPSTREAMS[name])
            .write.format("delta")
            .option("delta.enableChangeDataFeed", "true")
            .mode("overwrite")
            .save(paths.upstream(name))
        )
    return True


def _ids(spark: SparkSession, paths: DemoPaths, name: str) -> list[int]:
    key = _KEYS[name]
    rows = spark.read.format("delta").load(paths.upstream(name)).select(key).collect()
    return sorted(r[0] for r in rows)


def apply_round(spark: SparkSession, paths: DemoPaths, round_no: int) -> int:
    """Commit one round of changes to every upstream; returns the number of commits.

    Orders get inserts, a status update and a delete; customers a rename, sometimes a new
    customer or a deleted one; payments inserts, one moved to another customer and a delete.
    """
    rnd = random.Random(round_no)
    commits = 0

    def insert(name: str, rows: list[tuple]) -> None:
        nonlocal commits
        spark.createDataFrame(rows, UPSTREAMS[name]).write.format("delta").mode("append").save(
            paths.upstream(name)
        )
        commits += 1

    def update(name: str, key_value: int, column: str, value: object) -> None:
        _change(spark, paths.upstream(name), _KEYS[name], key_value, {column: value})

    def delete(name: str, key_value: int) -> None:
        _change(spark, paths.upstream(name), _KEYS[name], key_value, None)

    customer_ids = _ids(spark, paths, "customers")
    order_ids = _ids(spark, paths, "orders")
    payment_ids = _ids(spark, paths, "payments")

    next_order = max(order_ids) + 1
    insert(
        "orders",
        [
            (next_order + i, rnd.choice(customer_ids), rnd.randint(500, 9000), "new")
            for i in range(3)
        ],
    )
    update("orders", rnd.choice(order_ids), "status", rnd.choice(["paid", "shipped", "returned"]))
    delete("orders", rnd.choice(order_ids))
    commits += 2

    update("customers", rnd.choice(customer_ids), "name", f"{rnd.choice(_NAMES)} {round_no}")
    commits += 1
    if round_no % 2 == 0:
        new_id = max(customer_ids) + 1
        insert("customers", [(new_id, rnd.choice(_NAMES), rnd.choice(_CITIES))])
    if round_no % 3 == 2 and len(customer_ids) > 3:
        delete("customers", customer_ids[0])
        commits += 1

    next_payment = max(payment_ids) + 1
    insert(
        "payments",
        [(next_payment + i, rnd.choice(customer_ids), rnd.randint(100, 5000)) for i in range(2)],
    )
    update("payments", rnd.choice(payment_ids), "customer_id", rnd.choice(customer_ids))
    delete("payments", rnd.choice(payment_ids))
    commits += 2
    return commits


def _change(
    spark: SparkSession, path: str, key: str, key_value: int, values: dict[str, object] | None
) -> None:
    """Update (``values``) or delete (None) the row whose ``key`` is ``key_value``: a MERGE
    through ``DataFrame.mergeInto``, so the demo also runs on a Spark Connect server
    without Delta's Connect plugin (Delta's ``DeltaTable.update`` needs it)."""
    match = spark.createDataFrame([(key_value,)], "__key long")
    merge = match.mergeInto("delta.`" + path.replace("`", "``") + "`", F.col(key) == F.col("__key"))
    if values is None:
        merge.whenMatched().delete().merge()
    else:
        merge.whenMatched().update({c: F.lit(v) for c, v in values.items()}).merge()
