"""A warehouse target as the registry file, Python and the Component declare it, what its
declaration refuses (naming the pipeline, the value and the fix), and the
``watermark_warehouse_lag`` rule. No JVM, no database."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from watermark_dagster.config.pipeline import Pipeline, pipeline
from watermark_dagster.config.secrets import EnvRef
from watermark_dagster.config.warehouse import PostgresTarget
from watermark_dagster.config.yaml_file import load_registry_file
from watermark_dagster.core.observations import Observation
from watermark_dagster.core.strategy import Strategy
from watermark_dagster.dagster_defs.health import HealthSettings
from watermark_dagster.dagster_defs.health_warehouse import warehouse_lag_result
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.observe import warehouse_sql as sql
from watermark_dagster.operations.warehouse import WarehouseLoad, WarehouseStatus

URL = "jdbc:postgresql://warehouse.internal:5432/analytics"
REGISTRY = """
upstreams:
  orders: {path: /lake/orders}
pipelines:
  orders_wh:
    upstreams: {orders: order_id}
    target:
      kind: postgres
      url: %s
      table: wh.orders
      user: {env: WH_USER}
      password: %s
    keys: [order_id]
    sql: SELECT order_id, amount FROM orders
"""


def _file(tmp_path: Path, password: str = "{env: WH_PASSWORD}", url: str = URL) -> Path:
    path = tmp_path / "registry.yaml"
    path.write_text(REGISTRY % (url, password))
    return path


def test_a_registry_file_declares_a_warehouse_target(tmp_path: Path) -> None:
    loaded = load_registry_file(_file(tmp_path)).registry.pipelines["orders_wh"]
    assert loaded.warehouse == PostgresTarget(
        url=URL, table="wh.orders", user=EnvRef("WH_USER"), password=EnvRef("WH_PASSWORD")
    )
    assert loaded.target == f"{URL}#wh.orders"
    assert loaded.strategy is Strategy.INCREMENTAL  # auto never reads the target back
    assert loaded.warehouse.state_table == "watermark_state"


@pytest.mark.parametrize(
    ("password", "url", "said"),
    [
        ("secret123", URL, "password is given as text"),
        ("{env: WH_PASSWORD}", "jdbc:mariadb://host:3306/db", "is not a PostgreSQL URL"),
        ("{env: WH_PASSWORD}", "jdbc:postgresql://u:p@host:5432/db", "carries a user or password"),
    ],
)
def test_a_file_s_refusals_point_at_the_entry(
    tmp_path: Path, password: str, url: str, said: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        load_registry_file(_file(tmp_path, password, url))
    text = str(refused.value)
    assert said in text
    assert "registry.yaml:" in text
    assert "secret123" not in text


def _target(**settings: object) -> PostgresTarget:
    return PostgresTarget(url=URL, table="wh.orders", **settings)  # type: ignore[arg-type]


def test_python_declares_it_as_target_and_refuses_what_does_not_apply() -> None:
    @pipeline(upstreams=["orders"], target=_target(), keys=["order_id"])
    def orders_wh(batch):
        return batch["orders"].changes

    assert orders_wh.warehouse == _target()
    with pytest.raises(ConfigurationError, match="partition_by"):
        Pipeline(
            name="p",
            upstreams=("orders",),
            warehouse=_target(),
            keys=("id",),
            transform=lambda b: b,
            partition_by=("day",),
        )
    with pytest.raises(ConfigurationError, match="unknown key"):
        Pipeline(
            name="p",
            upstreams=("orders",),
            target={"kind": "postgres", "url": URL, "table": "t", "tabel": "x"},  # type: ignore[arg-type]
            keys=("id",),
            transform=lambda b: b,
        )
    with pytest.raises(ConfigurationError, match="not a warehouse"):
        Pipeline(
            name="p",
            upstreams=("orders",),
            target={"kind": "snowflake", "url": URL, "table": "t"},  # type: ignore[arg-type]
            keys=("id",),
            transform=lambda b: b,
        )
    for bad in ("Orders", "a.b.c", "x;drop"):
        with pytest.raises(ConfigurationError, match="lower-case identifiers"):
            PostgresTarget(url=URL, table=bad)
    with pytest.raises(ConfigurationError, match="load must be"):
        _target(load="bulk")


def test_the_dialect_quotes_every_name_and_refuses_others() -> None:
    assert sql.qualified("wh", "orders") == '"wh"."orders"'
    statement = sql.upsert_changed('"wh"."orders"', '"wh"."s"', ["id", "v", "_wm_seq"], ["id"])
    assert 'ON CONFLICT ("id") DO UPDATE SET "v" = EXCLUDED."v"' in statement
    assert 'WHERE t."_wm_seq" <= EXCLUDED."_wm_seq"' in statement
    with pytest.raises(ConfigurationError, match="not a plain identifier"):
        sql.identifier('a"; DROP TABLE x; --')


def _observed(latest: int) -> dict[str, Observation]:
    return {"orders": Observation("orders", "/lake/orders", latest, True, "id", "fp")}


def _status(**kw: object) -> WarehouseStatus:
    base: dict[str, object] = {
        "pipeline": "orders_wh",
        "table": "wh.orders",
        "url": URL,
        "state": WarehouseLoad.LOADED,
        "position": 3,
        "batch_id": "b000003",
        "loaded_versions": {"orders": 5},
    }
    return WarehouseStatus(**{**base, **kw})  # type: ignore[arg-type]


def test_the_warehouse_lag_rule() -> None:
    now = datetime(2026, 12, 3, tzinfo=UTC)
    settings = HealthSettings(lag_max_versions=2, lag_max_seconds=3600)

    def at(_u: str, _v: int) -> datetime:
        return now - timedelta(minutes=5)

    passed, said, meta = warehouse_lag_result(_status(), _observed(6), now, at, settings)
    assert passed, said
    assert (meta["orders/loaded_version"], meta["orders/lake_version"]) == (5, 6)
    passed, said, _ = warehouse_lag_result(_status(), _observed(9), now, at, settings)
    assert not passed
    assert "lags its lake input" in said
    unreachable = _status(state=WarehouseLoad.UNREACHABLE, error="timed out", position=None)
    assert not warehouse_lag_result(unreachable, _observed(5), now, at, settings)[0]
    behind = _status(state=WarehouseLoad.BEHIND, succeeded="b000004")
    passed, said, _ = warehouse_lag_result(behind, _observed(5), now, at, settings)
    assert not passed
    assert "restored or edited" in said
    empty = _status(state=WarehouseLoad.NOT_LOADED, position=None, loaded_versions={})
    assert not warehouse_lag_result(empty, _observed(0), now, at, settings)[0]
