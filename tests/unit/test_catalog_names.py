"""Catalog table names in declarations: validated when the definitions load, never passed
to Spark unquoted, never beside a path; a registry of paths needs no catalog (no process,
no JVM), and the spelling catalog locations are given in (``s3a://`` as ``s3://``). No JVM
here: resolution itself is tested in tests/scale/test_catalog.py."""

import textwrap
from pathlib import Path

import pytest

from watermark_dagster.config.names import quote_table_name, table_name_parts
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream
from watermark_dagster.config.upstream_kinds import declare_upstream
from watermark_dagster.config.yaml_file import load_registry
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.read.catalog import catalog_spelling, normalize_location
from watermark_dagster.runtime.catalog import resolve_catalog_tables


def _copy(batch):  # a transform (never run here)
    return batch["orders"].changes


@pytest.mark.parametrize(
    ("name", "parts", "quoted"),
    [
        ("orders", ("orders",), "`orders`"),
        ("sales.orders", ("sales", "orders"), "`sales`.`orders`"),
        ("spark_catalog.sales.orders", ("spark_catalog", "sales", "orders"),
         "`spark_catalog`.`sales`.`orders`"),
        ("sales.`orders-2026`", ("sales", "orders-2026"), "`sales`.`orders-2026`"),
        ("`a.b`.c", ("a.b", "c"), "`a.b`.`c`"),
        ("  sales.orders ", ("sales", "orders"), "`sales`.`orders`"),
    ],
    ids=["one-part", "schema", "catalog", "quoted", "quoted-dot", "spaces"],
)  # fmt: skip
def test_valid_names_become_quoted_parts(name: str, parts: tuple[str, ...], quoted: str) -> None:
    assert table_name_parts(name, "Upstream 'u'") == parts
    assert quote_table_name(parts) == quoted


@pytest.mark.parametrize(
    "name",
    [
        "a.b.c.d",  # four parts
        "sales.orders; DROP TABLE x",
        "sales.`or`ders`",  # a backtick inside a quoted part
        "sales..orders",
        "sales.",
        "1sales.orders",
        "``",
        "",
        "sales.orders--",
        "sales.`x\ny`",
        42,
    ],
    ids=["four-parts", "sql", "backtick", "empty-part", "trailing-dot", "digit", "empty-quoted",
         "empty", "comment", "control-char", "number"],
)  # fmt: skip
def test_invalid_names_are_refused_with_the_declaration_and_the_fix(name: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        DeltaUpstream(name="orders", table=name)  # type: ignore[arg-type]
    error = raised.value
    assert str(error).startswith("Upstream 'orders': table ")
    assert repr(name) in str(error)
    assert error.upstream == "orders"
    assert error.fix is not None
    assert "table: sales.orders" in error.fix


def test_a_path_and_a_table_together_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="gives both a path") as raised:
        DeltaUpstream(name="orders", path="/lake/orders", table="sales.orders")
    assert raised.value.upstream == "orders"
    with pytest.raises(ConfigurationError, match="gives both a path") as raised:
        Pipeline(
            name="clean", upstreams=["orders"], target="/lake/clean", table="sales.clean",
            keys=["id"], transform=_copy,
        )  # fmt: skip
    assert raised.value.pipeline == "clean"
    with pytest.raises(ConfigurationError, match="gives both a path"):
        CursorUpstream(name="clicks", path="/x", table="raw.clicks", cursor="ts")


def test_neither_path_nor_table_is_refused_naming_both() -> None:
    with pytest.raises(ConfigurationError, match="has no path") as raised:
        declare_upstream(name="orders")
    assert raised.value.fix is not None
    assert "table=" in raised.value.fix
    with pytest.raises(ConfigurationError, match="has no target") as raised:
        Pipeline(name="clean", upstreams=["orders"], keys=["id"], transform=_copy)
    assert raised.value.fix is not None
    assert "table=" in raised.value.fix


def test_a_registry_of_paths_is_returned_as_it_is_without_a_catalog() -> None:
    registry = Registry(
        upstreams=[DeltaUpstream(name="orders", path="/lake/orders")],
        pipelines=[Pipeline(name="clean", upstreams=["orders"], target="/lake/clean",
                            keys=["id"], transform=_copy)],
    )  # fmt: skip
    assert registry.catalog_names() == ({}, {})
    # A master that cannot start: any Spark process would fail the call.
    found = resolve_catalog_tables(
        registry, master="no-such-master", remote=None, app_name="x", conf={}
    )
    assert found is registry


def test_catalog_names_and_their_resolved_locations() -> None:
    registry = Registry(
        upstreams=[DeltaUpstream(name="orders", table="sales.orders"),
                   DeltaUpstream(name="fx", path="/lake/fx")],
        pipelines=[Pipeline(name="clean", upstreams=["orders", "fx"], table="sales.clean",
                            keys=["id"], transform=_copy)],
    )  # fmt: skip
    assert registry.catalog_names() == (
        {"orders": ("sales", "orders")},
        {"clean": ("sales", "clean")},
    )
    resolved = registry.with_locations({"orders": "/wh/sales.db/orders"}, {"clean": "/wh/c"})
    orders, clean = resolved.upstreams["orders"], resolved.pipelines["clean"]
    assert (orders.path, orders.table) == ("/wh/sales.db/orders", "sales.orders")
    assert (clean.target, clean.table) == ("/wh/c", "sales.clean")
    assert resolved.catalog_names() == ({}, {})
    assert registry.upstreams["orders"].path == ""  # the declaration is left as it was


def test_a_target_naming_an_upstreams_table_is_a_cycle_before_and_after_resolution() -> None:
    upstreams = [DeltaUpstream(name="orders", table="Sales.Orders")]
    with pytest.raises(ConfigurationError, match="reads its own output through a cycle"):
        Registry(
            upstreams=upstreams,
            pipelines=[Pipeline(name="loop", upstreams=["orders"], table="sales.orders",
                                keys=["id"], transform=_copy)],
        )  # fmt: skip
    # Under two names that turn out to be one location.
    registry = Registry(
        upstreams=upstreams,
        pipelines=[Pipeline(name="loop", upstreams=["orders"], table="sales.orders_v2",
                            keys=["id"], transform=_copy)],
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="reads its own output through a cycle"):
        registry.with_locations({"orders": "/wh/orders"}, {"loop": "/wh/orders"})


def test_two_pipelines_writing_one_catalog_table_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="'a' and 'b' write the same target 'SALES.T'"):
        Registry(
            upstreams=[DeltaUpstream(name="orders", path="/lake/orders")],
            pipelines=[
                Pipeline(name="a", upstreams=["orders"], table="sales.t", keys=["id"],
                         transform=_copy),
                Pipeline(name="b", upstreams=["orders"], table="SALES.T", keys=["id"],
                         transform=_copy),
            ],
        )  # fmt: skip


def _yaml(folder: Path, text: str) -> Path:
    path = folder / "registry.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_a_registry_file_takes_table_for_upstreams_and_targets(tmp_path: Path) -> None:
    path = _yaml(
        tmp_path,
        """
        upstreams:
          orders: {table: sales.orders, max_versions_per_batch: 5}
          fx: /lake/fx
        pipelines:
          clean:
            upstreams: [orders, fx]
            table: main.sales.`orders-clean`
            keys: [id]
            transform: tests.unit.test_catalog_names:_copy
        """,
    )
    registry = load_registry(path)
    assert registry.upstreams["orders"].table_parts == ("sales", "orders")
    assert registry.pipelines["clean"].table_parts == ("main", "sales", "orders-clean")
    assert registry.pipelines["clean"].target == ""


@pytest.mark.parametrize(
    ("entry", "line", "expected"),
    [
        ("orders: {table: 'a.b.c.d'}", 2, "Upstream 'orders': table 'a.b.c.d' is not a catalog"),
        ("orders: {table: sales.orders, path: /lake/o}", 2, "gives both a path"),
        ("orders: {table: 12}", 2, "table must be text"),
        ("orders: {mode: cdf}", 2, "has no path"),
    ],
    ids=["bad-name", "both", "number", "neither"],
)  # fmt: skip
def test_a_registry_file_names_the_line_the_value_and_the_fix(
    tmp_path: Path, entry: str, line: int, expected: str
) -> None:
    path = _yaml(
        tmp_path,
        f"""
        upstreams:
          {entry}
        pipelines: {{}}
        """,
    )
    with pytest.raises(ConfigurationError) as raised:
        load_registry(path)
    text = str(raised.value)
    assert text.startswith(f"{path}:{line}: "), text
    assert expected in text
    assert "Fix: " in text


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("file:/wh/sales.db/orders", "/wh/sales.db/orders"),
        ("file:///wh/sales.db/orders/", "/wh/sales.db/orders"),
        ("s3a://lake/wh/sales.db/orders", "s3://lake/wh/sales.db/orders"),
        ("S3A://lake/wh/orders/", "s3://lake/wh/orders"),
        ("s3://lake/wh/orders", "s3://lake/wh/orders"),
        ("abfss://c@acct.dfs.core.windows.net/orders", "abfss://c@acct.dfs.core.windows.net/orders"),
    ],
    ids=["file-one-slash", "file-three-slashes", "s3a", "s3a-upper", "s3", "other-scheme"],
)  # fmt: skip
def test_a_catalog_location_becomes_the_spelling_tables_are_declared_in(
    given: str, expected: str
) -> None:
    assert normalize_location(given) == expected


def test_an_s3a_location_is_the_same_table_as_its_s3_path() -> None:
    # The catalog stores Hadoop's s3a:// spelling; a target declared by path uses s3://.
    # Mapped, the registry sees one table: a pipeline writing what it reads is a cycle.
    registry = Registry(
        upstreams=[DeltaUpstream(name="orders", table="sales.orders")],
        pipelines=[Pipeline(name="loop", upstreams=["orders"], target="s3://lake/wh/orders",
                            keys=["id"], transform=_copy)],
    )  # fmt: skip
    location = normalize_location("s3a://lake/wh/orders/")
    with pytest.raises(ConfigurationError, match="reads its own output through a cycle"):
        registry.with_locations({"orders": location}, {})


@pytest.mark.parametrize(
    ("location", "schema_location", "expected"),
    [
        ("s3://lake/wh/sales.db/t", "s3a://lake/wh/sales.db", "s3a://lake/wh/sales.db/t"),
        ("s3://lake/wh/sales.db/t", "s3://lake/wh/sales.db", "s3://lake/wh/sales.db/t"),
        ("/wh/sales.db/t", "file:/wh/sales.db", "/wh/sales.db/t"),
    ],
    ids=["s3a-schema", "s3-schema", "local"],
)  # fmt: skip
def test_a_target_is_registered_in_its_schemas_spelling(
    location: str, schema_location: str, expected: str
) -> None:
    assert catalog_spelling(location, schema_location) == expected
