"""A target key taken from a generator's rows is refused when the definitions load (issue
64 item 11), not by the first batch. An unqualified name that a ``LATERAL VIEW`` alias
gives (``... LATERAL VIEW explode(tags) t AS tag``, keyed by ``tag``) used to leave the
proof open without the upstreams' schemas: the registry loaded, and the batch refused
it, stuck, holding every other pipeline. Spark refuses a name that the generator and a
table both hold, so the generator's own names place it from the text alone."""

from pathlib import Path

import pytest

from tests.support.declared_sql import load
from watermark_dagster.config.yaml_file import load_registry
from watermark_dagster.definitions import build_file_definitions
from watermark_dagster.errors import ConfigurationError

GENERATED = "takes the key column 'tag' from a generator's rows"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT tag, COUNT(*) AS n FROM orders LATERAL VIEW explode(tags) t AS tag GROUP BY tag",
        "SELECT t.tag, COUNT(*) AS n FROM orders o LATERAL VIEW explode(o.tags) t AS tag\n"
        "GROUP BY t.tag",
        "SELECT tag FROM orders, LATERAL explode(tags) AS t(tag)",
        "SELECT tag, COUNT(*) AS n FROM orders o\n"
        "LATERAL VIEW OUTER posexplode(o.tags) t AS pos, tag GROUP BY tag",
    ],
    ids=["unqualified", "qualified", "lateral-join", "posexplode-outer"],
)
def test_a_key_from_a_generator_is_refused_when_the_sql_loads(sql: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        load(sql, {"orders": "tags"}, ["tag"])
    assert GENERATED in str(refused.value), refused.value
    assert "(line 1)" in str(refused.value)
    assert "Fix: " in str(refused.value)


def test_a_generator_beside_the_keys_still_loads() -> None:
    """A generator whose columns are not keys relates nothing and needs nothing placed."""
    pipeline = load(
        "SELECT o.order_id, COUNT(t.tag) AS tags FROM orders o\n"
        "LATERAL VIEW explode(o.tags) t AS tag GROUP BY o.order_id",
        {"orders": "order_id"},
        ["order_id"],
    )
    assert pipeline.declared is not None
    assert pipeline.declared.inferred is not None  # proven when it loads
    assert [str(p) for p in pipeline.declared.inferred["orders"]] == ["order_id"]


def test_a_registry_file_with_a_generator_key_does_not_load(tmp_path: Path) -> None:
    """What ``watermark plan --dry-run`` and the code location load: the file's line and
    the refusal, before any Spark session or control table exists."""
    registry = tmp_path / "watermark.yaml"
    registry.write_text(
        "control_root: control\n"
        "upstreams:\n  orders: lake/orders\n"
        "pipelines:\n"
        "  per_tag:\n"
        "    upstreams: {orders: tags}\n"
        "    target: lake/per_tag\n"
        "    keys: [tag]\n"
        "    sql: |\n"
        "      SELECT tag, COUNT(*) AS n\n"
        "      FROM orders LATERAL VIEW explode(tags) t AS tag GROUP BY tag\n"
    )
    with pytest.raises(ConfigurationError, match=r"watermark.yaml:10.*" + GENERATED):
        load_registry(registry)
    with pytest.raises(ConfigurationError, match=GENERATED):
        build_file_definitions(registry, home=tmp_path / "home")
    assert not (tmp_path / "control").exists()
