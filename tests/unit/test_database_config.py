"""Database upstreams' declarations, checked when they load (no JVM, no server): every
refusal names the upstream, the value at fault and the fix, and never echoes a credential."""

import re
from pathlib import Path
from typing import Any

import pytest

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.secrets import EnvRef
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream
from watermark_dagster.config.upstream_kinds import UPSTREAM_KINDS, declare_upstream
from watermark_dagster.config.yaml_file import load_registry
from watermark_dagster.dagster_defs.definitions import with_s3_settings
from watermark_dagster.dagster_defs.resources import SparkSessionResource
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.runtime.jdbc import JDBC_DRIVERS_KEY, jdbc_packages, needs_jdbc_jars

GOOD: dict[str, Any] = {
    "name": "orders_db",
    "kind": "database",
    "url": "jdbc:postgresql://db.internal:5432/shop",
    "source_table": "public.orders",
    "cursor": "updated_at",
    "tie_break": ["id"],
    "user": {"env": "SHOP_USER"},
    "password": {"env": "SHOP_PASSWORD"},
}


def test_a_database_upstream_is_declared_by_kind_with_references_only() -> None:
    upstream = declare_upstream(**GOOD)
    assert isinstance(upstream, DatabaseUpstream)
    assert upstream.is_cursor
    assert upstream.password == EnvRef("SHOP_PASSWORD")
    assert upstream.quoted_table == '"public"."orders"'
    assert upstream.driver == "org.postgresql.Driver"
    maria = declare_upstream(**{**GOOD, "url": "jdbc:mariadb://db:3306/shop"})
    assert isinstance(maria, DatabaseUpstream)
    assert maria.quoted_table == "`public`.`orders`"
    # The other kinds still dispatch as before, and by kind: too.
    assert isinstance(declare_upstream(name="o", path="/x"), DeltaUpstream)
    assert type(declare_upstream(name="c", path="/x", mode="timestamp", cursor="ts")) is (
        CursorUpstream
    )
    assert type(declare_upstream(name="c", path="/x", kind="cursor", cursor="ts")) is (
        CursorUpstream
    )
    assert set(UPSTREAM_KINDS) == {"delta", "cursor", "landing", "database"}
    # The location string Dagster shows holds no credential (none may be in the URL).
    assert upstream.path == "jdbc:postgresql://db.internal:5432/shop#public.orders"


@pytest.mark.parametrize(
    ("change", "value", "fix"),
    [
        pytest.param(
            {"url": "postgresql://db/shop"},
            "postgresql://db/shop",
            "jdbc:postgresql://host",
            id="not-jdbc",
        ),
        pytest.param(
            {"url": "jdbc:oracle://db/x"}, "oracle", "jdbc:postgresql://", id="other-database"
        ),
        pytest.param(
            {"url": "jdbc:postgresql://bob:hunter2@db/shop"},
            "//***@db/shop",
            "{env: DB_PASSWORD}",
            id="user-info",
        ),
        pytest.param(
            {"url": "jdbc:mariadb://db/shop?user=bob&password=hunter2"},
            "password=***",
            "{env: DB_PASSWORD}",
            id="password-parameter",
        ),
        pytest.param(
            {"password": "hunter2"},
            "password is given as text",
            "{env: DB_PASSWORD}",
            id="password-text",
        ),
        pytest.param({"user": "bob"}, "user is given as text", "{env: DB_USER}", id="user-text"),
        pytest.param(
            {"source_table": "public.orders; drop table x"},
            "'public.orders; drop table x'",
            "source_table: public.orders",
            id="table-sql",
        ),
        pytest.param(
            {"source_table": "a.b.c"},
            "'a.b.c'",
            "source_table: public.orders",
            id="table-three-parts",
        ),
        pytest.param(
            {"fetch_size": 0},
            "fetch_size must be a whole number >= 1, got 0",
            "set fetch_size",
            id="fetch-size",
        ),
        pytest.param({"partitions": "4"}, "got '4'", "set partitions", id="partitions-text"),
        pytest.param({"reconcile_every": 0}, "got 0", "never reconcile", id="reconcile"),
        pytest.param(
            {"soft_delete": "deleted flag"}, "'deleted flag'", "rename", id="soft-delete-column"
        ),
        pytest.param({"cursor_fallback": "created"}, "cursor_fallback", "remove", id="fallback"),
    ],
)
def test_a_bad_value_is_refused_naming_the_upstream_value_and_fix(
    change: dict[str, Any], value: str, fix: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        declare_upstream(**{**GOOD, **change})
    message = str(raised.value)
    assert "orders_db" in message or raised.value.upstream == "orders_db"
    assert value in message
    assert raised.value.fix is not None
    assert fix in raised.value.fix
    assert "hunter2" not in message


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"path": "/lake/orders"}, "path does not apply"),
        ({"format": "parquet"}, "format does not apply"),
        ({"read_options": {"a": "b"}}, "read_options does not apply"),
        ({"mode": "cdf"}, "mode='cdf' does not apply"),
        ({"on_data_change": "fail"}, "on_data_change does not apply"),
        ({"fetchsize": 10}, "fetchsize does not apply"),
        ({"kind": "oracle"}, "kind 'oracle' is not one of"),
    ],
)
def test_a_key_that_does_not_apply_is_refused_naming_the_upstream(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)) as raised:
        declare_upstream(**{**GOOD, **change})
    assert "Upstream 'orders_db'" in str(raised.value)
    assert raised.value.fix


def test_a_registry_file_declares_one_and_never_echoes_a_text_password(tmp_path: Path) -> None:
    body = (
        "upstreams:\n"
        "  orders_db:\n"
        "    kind: database\n"
        "    url: jdbc:postgresql://db:5432/shop\n"
        "    source_table: public.orders\n"
        "    cursor: updated_at\n"
        "    tie_break: [id]\n"
        "    password: {env: SHOP_PASSWORD}\n"
        "    soft_delete: deleted\n"
        "pipelines: {}\n"
    )
    path = tmp_path / "registry.yaml"
    path.write_text(body)
    upstream = load_registry(path).upstreams["orders_db"]
    assert isinstance(upstream, DatabaseUpstream)
    assert upstream.password == EnvRef("SHOP_PASSWORD")
    assert upstream.soft_delete == "deleted"

    path.write_text(body.replace("{env: SHOP_PASSWORD}", "hunter2"))
    with pytest.raises(
        ConfigurationError, match=r"registry.yaml:8: upstream 'orders_db': password"
    ) as raised:
        load_registry(path)
    assert "hunter2" not in str(raised.value)
    assert raised.value.fix
    assert "{env: VARIABLE}" in raised.value.fix

    path.write_text(body.replace("    soft_delete: deleted\n", "    path: /lake/orders\n"))
    with pytest.raises(ConfigurationError, match="path does not apply"):
        load_registry(path)


def test_the_drivers_are_loaded_only_by_a_location_declaring_a_database() -> None:
    spark = SparkSessionResource(master="local[1]", conf={})
    orders = DeltaUpstream(name="orders", path="/lake/orders")

    def copy(batch: Any) -> Any:
        return batch

    plain = Registry(
        upstreams=[orders],
        pipelines=[
            Pipeline(name="p", upstreams=("orders",), target="/t", keys=("id",), transform=copy)
        ],
    )
    assert with_s3_settings(spark, plain) is spark
    database = declare_upstream(**GOOD)
    extended = Registry(
        upstreams=[orders, database],
        pipelines=[
            Pipeline(name="p", upstreams=("orders_db",), target="/t", keys=("id",), transform=copy)
        ],
    )
    conf = with_s3_settings(spark, extended).conf
    assert needs_jdbc_jars(conf)
    assert conf[JDBC_DRIVERS_KEY] == "true"
    assert jdbc_packages() == [
        "org.postgresql:postgresql:42.7.14",
        "org.mariadb.jdbc:mariadb-java-client:3.5.11",
    ]


@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
def test_the_look_at_a_table_asks_for_its_top_position_from_quoted_identifiers(
    database: str,
) -> None:
    """The coordinator's look (observe/database_state) is one query the (cursor, tie-break)
    index serves, made of the validated identifiers quoted for the database."""
    from watermark_dagster.observe.database_state import top_position_query

    quote = '"' if database == "postgresql" else "`"
    upstream = declare_upstream(**{**GOOD, "url": f"jdbc:{database}://db.internal/shop"})
    assert isinstance(upstream, DatabaseUpstream)
    q = quote
    assert top_position_query(upstream) == (
        f"SELECT {q}updated_at{q}, {q}id{q} FROM {q}public{q}.{q}orders{q} "
        f"WHERE {q}updated_at{q} IS NOT NULL AND {q}id{q} IS NOT NULL "
        f"ORDER BY {q}updated_at{q} DESC, {q}id{q} DESC LIMIT 1"
    )


@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
def test_a_look_that_cannot_reach_the_database_blocks_the_upstream_naming_why(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens on the port (a real refused connection, no server): the look raises
    UpstreamUnavailableError naming the upstream and the fix, and never the password; an
    unset credential variable is reported the same way, not as a failed tick."""
    from tests.support.ports import free_port
    from watermark_dagster.errors import UpstreamUnavailableError
    from watermark_dagster.observe.observer import Observer

    port = free_port()
    upstream = declare_upstream(**{**GOOD, "url": f"jdbc:{database}://127.0.0.1:{port}/shop"})
    monkeypatch.setenv("SHOP_USER", "watermark")
    monkeypatch.setenv("SHOP_PASSWORD", "s3cret-Pa55")
    with pytest.raises(UpstreamUnavailableError) as refused:
        Observer().observe(upstream)
    text = str(refused.value)
    assert "orders_db" in text, text
    assert f"127.0.0.1:{port}" in text, text
    assert "s3cret-Pa55" not in text
    assert "nothing is planned" in (refused.value.fix or "")

    monkeypatch.delenv("SHOP_PASSWORD")
    with pytest.raises(UpstreamUnavailableError, match="SHOP_PASSWORD"):
        Observer().observe(upstream)


def test_null_cursor_is_one_setting_for_the_file_python_and_the_component(
    tmp_path: Path,
) -> None:
    """``null_cursor: fail | skip`` (default fail) is declared once: a registry file, a
    Python declaration and a component's spec take it, and refuse another value naming the
    upstream and both choices."""
    from watermark_dagster.dagster_defs.component import UpstreamSpec

    assert DatabaseUpstream(**{k: v for k, v in GOOD.items() if k != "kind"}).null_cursor == (
        "fail"
    )
    assert declare_upstream(**{**GOOD, "null_cursor": "skip"}).null_cursor == "skip"  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match="orders_db.*null_cursor") as refused:
        declare_upstream(**{**GOOD, "null_cursor": "ignore"})
    assert "null_cursor: skip" in (refused.value.fix or "")

    path = tmp_path / "registry.yaml"
    body = (
        "upstreams:\n  orders_db:\n    kind: database\n    url: jdbc:postgresql://db/shop\n"
        "    source_table: public.orders\n    cursor: updated_at\n"
        "    null_cursor: {}\npipelines: {{}}\n"
    )
    path.write_text(body.format("skip"))
    upstream = load_registry(path).upstreams["orders_db"]
    assert isinstance(upstream, DatabaseUpstream)
    assert upstream.null_cursor == "skip"
    path.write_text(body.format("ignore"))
    with pytest.raises(ConfigurationError, match="null_cursor"):
        load_registry(path)

    assert "null_cursor" in UpstreamSpec.model_fields
    named = {k: v for k, v in GOOD.items() if k != "name"}
    spec = UpstreamSpec.model_validate({**named, "null_cursor": "skip"})
    assert spec.model_dump()["null_cursor"] == "skip"


def test_columns_dropped_renamed_or_retyped_are_problems_added_ones_are_not() -> None:
    from watermark_dagster.read.database_schema import column_problems

    before = {"id": ("bigint", False), "value": ("bigint", True)}
    assert column_problems(before, {**before, "note": ("text", True)}) == []
    assert column_problems(before, {**before, "note": ("text", False)}) == []
    assert column_problems(before, {"id": ("bigint", False), "value": ("bigint", False)}) == []
    [renamed] = column_problems(before, {"id": ("bigint", False), "amount": ("bigint", True)})
    assert "'value'" in renamed
    assert "'amount'" in renamed
    [retyped] = column_problems(before, {"id": ("bigint", False), "value": ("numeric", True)})
    assert "'value'" in retyped
    assert "bigint" in retyped
    assert "numeric" in retyped
    [dropped] = column_problems(before, {"id": ("bigint", False)})
    assert "'value' was dropped" in dropped


def test_lag_seconds_on_a_cursor_of_no_time_date_or_integer_is_refused_at_the_first_look() -> None:
    """The location loads without the database, so the first look (which reads the cursor
    column's type from the catalog) refuses it, before any batch is planned. A timestamp,
    a date and an integer cursor each give the lag a meaning (read/database_pin.py)."""
    from watermark_dagster.errors import UpstreamUnavailableError
    from watermark_dagster.observe.database_state import DatabaseLook, refuse_look

    lagged = declare_upstream(**{**GOOD, "lag_seconds": 30})
    assert isinstance(lagged, DatabaseUpstream)
    for cursor_type in ("text", "numeric(12,2)", "varchar(10)", "interval"):
        look = DatabaseLook("db:empty", 0, (("updated_at", cursor_type, False),))
        with pytest.raises(
            UpstreamUnavailableError, match=f"updated_at is {re.escape(cursor_type)}"
        ):
            refuse_look(lagged, look)
    for cursor_type in (
        "timestamp(6) without time zone",
        "timestamp with time zone",
        "datetime(6)",
        "bigint",
        "integer",
        "int(11)",
        "bigint(20) unsigned",
        "date",
    ):
        refuse_look(lagged, DatabaseLook("db:empty", 0, (("updated_at", cursor_type, False),)))


def test_a_cursor_position_is_shown_as_its_cursor_type_with_its_tie_break() -> None:
    from watermark_dagster.cli.render import cursor_type_of, shown_position
    from watermark_dagster.observe.database_state import columns_fingerprint

    assert (
        shown_position([1796169233872279, 30002], "timestamp", ["id"])
        == "2026-12-01T23:53:53.872279Z, id=30002"
    )
    assert shown_position([20454, 7], "date", ["id"]) == "2026-01-01, id=7"
    assert shown_position([42, 7], "bigint", ["id"]) == "42, id=7"
    assert shown_position([42], None) == "42"
    upstream = declare_upstream(**GOOD)
    columns = (("id", "bigint", False), ("updated_at", "timestamp(6) without time zone", False))
    assert cursor_type_of(upstream, columns_fingerprint(columns)) == "timestamp"
    assert cursor_type_of(upstream, "") is None
