"""Registry files (YAML) and bad input: each bad input gets a clear error naming the file,
the line and the value at fault, and nothing is written.

No JVM: the command line runs in a subprocess against control tables written with delta-rs.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import AssetKey
from deltalake import write_deltalake

from tests.support.cli import SCRIPT
from watermark_dagster.config.landing import DEFAULT_LOG_FOLDER
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.config.upstream_kinds import UPSTREAM_KINDS
from watermark_dagster.config.yaml_file import load_registry, load_registry_file
from watermark_dagster.config.yaml_values import PIPELINE_KEYS, UPSTREAM_KEYS
from watermark_dagster.dagster_defs.definitions import location_of
from watermark_dagster.definitions import build_file_definitions
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.observe.observer import Observer, observe_registry
from watermark_dagster.store import WatermarkStore

CONTROL_TABLES = ("batches", "committed_watermarks", "pipeline_checkpoints", "history")
Cli = Callable[..., subprocess.CompletedProcess]
TRANSFORMS = "wm_registry_file_transforms"  # a module written by the `transforms` fixture

TRANSFORMS_SOURCE = '''
from watermark_dagster.config.pipeline import pipeline

def orders_clean(batch):
    """Orders, cleaned."""
    return batch["orders"].changes

NOT_A_FUNCTION = 42

@pipeline(upstreams=["orders"], target="/tmp/never", keys=["id"])
def decorated(batch):
    return batch["orders"].changes

def enriched(orders, customers):
    """Orders with their customer's name."""
    return orders.join(customers.select("customer_id", "name"), "customer_id", "left")
'''


@pytest.fixture(scope="module")
def transforms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder on sys.path with a transforms module and a module that fails to import."""
    folder = tmp_path_factory.mktemp("transforms")
    (folder / f"{TRANSFORMS}.py").write_text(TRANSFORMS_SOURCE)
    (folder / "wm_registry_file_broken.py").write_text("raise RuntimeError('boom at import')\n")
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    for name in (TRANSFORMS, "wm_registry_file_broken"):
        sys.modules.pop(name, None)


def _write(folder: Path, text: str, name: str = "registry.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


# ------------------------------------------------------------------ a good file


def test_a_good_file_loads(tmp_path: Path, transforms: Path) -> None:
    path = _write(
        tmp_path,
        f"""
        control_root: control                   # relative: from the file's folder
        control_storage_options: {{timeout: 30}}
        upstreams:
          orders: &capped {{path: /lake/orders, max_versions_per_batch: 50}}
          payments: {{<<: *capped, path: /lake/payments}}   # a merge key is no duplicate
          customers: lake/customers             # shorthand for {{path: ...}}
          clicks:
            path: s3://landing/clicks
            mode: timestamp
            format: parquet
            cursor: ts
            tie_break: [id]
            lag_seconds: 300
            start_from: 2026-11-01T00:00:00Z    # kept as text, parsed with its zone
            read_options: {{header: true}}
          audit: {{path: /lake/audit, start_from: 3, description: null}}
        pipelines:
          orders_clean:
            upstreams: [orders, customers]
            target: /lake/orders_clean
            keys: [order_id]
            transform: {TRANSFORMS}:orders_clean
          clicks_log: {{upstreams: clicks, target: /lake/clicks_log, write: append,
                       partition_by: [day], transform: "{TRANSFORMS}:decorated.transform"}}
          audit_copy: {{upstreams: [audit], target: /lake/audit_copy, keys: id,
                       transform: {TRANSFORMS}:orders_clean, description: Audit rows.}}
        """,
    )
    loaded = load_registry_file(path)
    registry = loaded.registry
    assert loaded.control_root == str(tmp_path / "control")
    assert loaded.control_storage_options == {"timeout": "30"}
    assert registry.upstreams["orders"].max_versions_per_batch == 50
    payments = registry.upstreams["payments"]
    assert (payments.path, payments.max_versions_per_batch) == ("/lake/payments", 50)
    assert registry.upstreams["customers"].path == str(tmp_path / "lake" / "customers")
    clicks = registry.upstreams["clicks"]
    assert (clicks.path, clicks.is_cursor, clicks.cursor, clicks.tie_break) == (
        "s3://landing/clicks",
        True,
        "ts",
        ("id",),
    )
    assert clicks.start_from == datetime(2026, 11, 1, tzinfo=UTC)
    assert (clicks.lag_seconds, clicks.format, clicks.read_options) == (
        300,
        "parquet",
        {"header": "true"},
    )
    assert registry.upstreams["audit"].start_from == 3
    module = sys.modules[TRANSFORMS]
    clean = registry.pipelines["orders_clean"]
    assert (clean.upstreams, clean.keys, clean.transform) == (
        ("orders", "customers"),
        ("order_id",),
        module.orders_clean,
    )
    assert clean.description == "Orders, cleaned."  # the transform's docstring
    log = registry.pipelines["clicks_log"]
    assert (log.upstreams, str(log.write), log.partition_by, log.keys) == (
        ("clicks",),
        "append",
        ("day",),
        (),
    )
    assert registry.pipelines["audit_copy"].description == "Audit rows."
    assert load_registry(path).describe() == registry.describe()


def test_every_declaration_option_has_a_yaml_key() -> None:
    """The file takes exactly the settings of Upstream and Pipeline, and every field but the
    name (a file's entry key) and a pipeline's `declared` (written as full: or sql:) is one:
    a new field without its metadata fails here."""
    upstream_fields = {f.name for kind in UPSTREAM_KINDS.values() for f in dataclasses.fields(kind)}
    assert set(UPSTREAM_KEYS) == upstream_fields - {"name"} | {"kind"}
    # A hand-written pipeline's full_transform is written full: (beside transform:).
    # feed_on_create is Python only: an extraction stage sets it (read/extraction.py).
    # warehouse is Python only: a file writes a warehouse target under target:.
    python_only = {"name", "declared", "full_transform", "feed_on_create", "warehouse"}
    fields = {f.name for f in dataclasses.fields(Pipeline)} - python_only
    assert set(PIPELINE_KEYS) == fields | {"full", "sql"}


JOIN_PATH = "customers.customer_id -> orders.customer_id -> orders.order_id"


def test_declared_pipelines_load_with_key_paths_and_full_or_sql(
    tmp_path: Path, transforms: Path
) -> None:
    path = _write(
        tmp_path,
        f"""
        upstreams: {{orders: /lake/orders, customers: /lake/customers, payments: /lake/pay}}
        pipelines:
          enriched:
            upstreams:
              orders: order_id
              customers: {JOIN_PATH}
            target: /lake/enriched
            keys: [order_id]
            full: {TRANSFORMS}:enriched
          totals:
            upstreams: {{payments: customer_id, customers: [customer_id]}}
            target: /lake/totals
            keys: [customer_id]
            sql: |
              SELECT c.customer_id, SUM(p.amount) AS total
              FROM customers c LEFT JOIN payments p ON c.customer_id = p.customer_id
              GROUP BY c.customer_id
        """,
    )
    registry = load_registry(path)
    enriched = registry.pipelines["enriched"]
    assert enriched.transform is None
    assert enriched.declared is not None
    assert enriched.declared.function is sys.modules[TRANSFORMS].enriched
    assert str(enriched.declared.key_paths["customers"]) == JOIN_PATH
    assert enriched.description == "Orders with their customer's name."
    totals = registry.pipelines["totals"]
    assert totals.upstreams == ("payments", "customers")
    assert totals.declared is not None
    assert totals.declared.sql is not None
    assert totals.declared.sql.startswith("SELECT c.customer_id")
    assert totals.declared.key_paths["payments"].direct
    # The UI shows how each upstream's changes reach the target, and the query.
    defs = build_file_definitions(path, home=tmp_path / "home")
    node = defs.resolve_asset_graph().get(AssetKey("totals"))
    assert node.metadata["transform"] == "declared (sql)"
    assert node.metadata["key_paths"].value == {
        "payments": "customer_id",
        "customers": "customer_id",
    }
    assert "GROUP BY c.customer_id" in node.metadata["sql"].value
    spec = defs.resolve_asset_graph().get(AssetKey("enriched")).metadata
    assert spec["key_paths"].value["customers"] == JOIN_PATH


def test_a_hand_written_pipeline_gives_its_full_transform_beside_its_transform(
    tmp_path: Path, transforms: Path
) -> None:
    path = _write(
        tmp_path,
        f"""
        upstreams: {{orders: /lake/orders, customers: /lake/customers}}
        pipelines:
          enriched:
            upstreams: [orders, customers]
            target: /lake/enriched
            keys: [order_id]
            transform: {TRANSFORMS}:orders_clean
            full: {TRANSFORMS}:enriched
            strategy: full
        """,
    )
    enriched = load_registry(path).pipelines["enriched"]
    assert enriched.declared is None
    assert enriched.transform is sys.modules[TRANSFORMS].orders_clean
    assert enriched.full_transform is sys.modules[TRANSFORMS].enriched
    assert enriched.strategy == "full"
    assert enriched.chooses_strategy
    defs = build_file_definitions(path, home=tmp_path / "home")
    node = defs.resolve_asset_graph().get(AssetKey("enriched"))
    assert node.metadata["transform"] == "hand-written, with a full transform"
    assert node.metadata["strategy"] == "full"


def test_a_pipeline_says_what_its_target_s_change_feed_promises(
    tmp_path: Path, transforms: Path
) -> None:
    body = f"""
        upstreams: {{orders: /lake/orders, customers: /lake/customers}}
        pipelines:
          enriched:
            upstreams: [orders, customers]
            target: /lake/enriched
            keys: [order_id]
            transform: {TRANSFORMS}:orders_clean
            full: {TRANSFORMS}:enriched
            strategy: rewrite
            change_feed: %s
        """
    registry = load_registry(_write(tmp_path, body % "any"))
    assert registry.pipelines["enriched"].strategy == "rewrite"
    assert registry.change_feed("enriched") == "any"
    with pytest.raises(ConfigurationError) as refused:
        load_registry(_write(tmp_path, body % "minimal", name="minimal.yaml"))
    text = str(refused.value)
    assert "strategy='rewrite' and change_feed='minimal'" in text
    assert "minimal.yaml" in text


def test_a_file_builds_a_code_location_without_writing(tmp_path: Path, transforms: Path) -> None:
    path = _write(
        tmp_path,
        f"""
        upstreams: {{orders: /lake/orders}}
        pipelines:
          orders_clean: {{upstreams: [orders], target: /lake/clean, keys: [id],
                         transform: {TRANSFORMS}:orders_clean}}
        """,
    )
    defs = build_file_definitions(path, home=tmp_path / "home")
    assert list(location_of(defs).registry.pipelines) == ["orders_clean"]
    store = defs.resources["watermark_store"].get_store()  # type: ignore[union-attr]
    assert store.root == str(tmp_path / "home" / "control")  # WATERMARK_HOME, as the demo
    assert not (tmp_path / "home").exists()


# ------------------------------------------------------------------ bad files

T = f"transform: {TRANSFORMS}:orders_clean"
UP = "upstreams:\n  orders: /lake/orders\n"

# (id, file text, line the message points at, fragments the message must hold)
BAD_FILES = [
    (
        "unknown-upstream-key",
        "upstreams:\n  orders: {path: /l/o, max_version_per_batch: 5}\npipelines: {}\n",
        2,
        ["unknown key 'max_version_per_batch'", "did you mean 'max_versions_per_batch'"],
    ),
    (
        "unknown-pipeline-key",
        UP + f"pipelines:\n  p:\n    upstreams: [orders]\n    target: /l/t\n    key: [id]\n"
        f"    {T}\n",
        7,
        ["pipeline 'p': unknown key 'key'", "did you mean 'keys'"],
    ),
    (
        "unknown-top-level-key",
        UP + "pipelines: {}\nschedule: hourly\n",
        4,
        ["unknown key 'schedule'", "'control_root'"],
    ),
    (
        "duplicate-upstream",
        UP + "  orders: /lake/orders_v2\npipelines: {}\n",
        3,
        ["'orders' appears twice in upstreams (first at line 2)"],
    ),
    (
        "duplicate-pipeline",
        UP + f"pipelines:\n  p: {{upstreams: [orders], target: /l/a, keys: [id], {T}}}\n"
        f"  p: {{upstreams: [orders], target: /l/b, keys: [id], {T}}}\n",
        5,
        ["'p' appears twice in pipelines (first at line 4)"],
    ),
    (
        "duplicate-key-in-entry",
        "upstreams:\n  orders:\n    path: /l/o\n    path: /l/p\npipelines: {}\n",
        4,
        ["'path' appears twice in upstream 'orders' (first at line 3)"],
    ),
    (
        "duplicate-section",
        UP + "pipelines: {}\nupstreams: {}\n",
        4,
        ["'upstreams' appears twice in the file (first at line 1)"],
    ),
    (
        "name-of-upstream-and-pipeline",
        UP + f"pipelines:\n  orders: {{upstreams: [orders], target: /l/t, keys: [id], {T}}}\n",
        4,
        ["Name 'orders' is used twice"],
    ),
    (
        "same-target",
        UP + f"pipelines:\n  p: {{upstreams: [orders], target: /l/t, keys: [id], {T}}}\n"
        f"  q: {{upstreams: [orders], target: /l/t, keys: [id], {T}}}\n",
        5,
        ["'p' and 'q' write the same target '/l/t'"],
    ),
    (
        "non-numeric-window",
        "upstreams:\n  orders: {path: /l/o, max_versions_per_batch: many}\npipelines: {}\n",
        2,
        ["max_versions_per_batch must be a whole number", "got 'many' (text)"],
    ),
    (
        "zero-window",
        "upstreams:\n  orders: {path: /l/o, max_versions_per_batch: 0}\npipelines: {}\n",
        2,
        ["max_versions_per_batch must be a positive integer, got 0"],
    ),
    (
        "keys-not-a-list",
        UP + f"pipelines:\n  p: {{upstreams: [orders], target: /l/t, keys: 42, {T}}}\n",
        4,
        ["keys must be a list of names", "got 42 (a number)"],
    ),
    (
        "unquoted-boolean",
        "upstreams:\n  orders: {path: /l/o, format: yes}\npipelines: {}\n",
        2,
        ["format must be text", "got True (a boolean)", "quote it"],
    ),
    (
        "lag-as-text",
        "upstreams:\n  c: {path: /l/c, mode: timestamp, cursor: ts, lag_seconds: 5m}\n"
        "pipelines: {}\n",
        2,
        ["lag_seconds must be a number of seconds, got '5m'"],
    ),
    (
        "options-not-a-mapping",
        "upstreams:\n  orders: {path: /l/o, storage_options: [key]}\npipelines: {}\n",
        2,
        ["storage_options must be a mapping", "got ['key']"],
    ),
    (
        "entry-not-a-mapping",
        "upstreams:\n  orders: [/l/o]\npipelines: {}\n",
        2,
        ["upstream 'orders' must be a mapping", "got ['/l/o']"],
    ),
    (
        "unknown-mode",
        "upstreams:\n  orders: {path: /l/o, mode: stream}\npipelines: {}\n",
        2,
        ["mode 'stream' is not one of"],
    ),
    (
        "negative-start",
        "upstreams:\n  orders: {path: /l/o, start_from: -3}\npipelines: {}\n",
        2,
        ["start_from version -3 is negative"],
    ),
    (
        "malformed-start-timestamp",
        "upstreams:\n  orders: {path: /l/o, start_from: 2026-02-30T00:00:00Z}\npipelines: {}\n",
        2,
        ["start_from '2026-02-30T00:00:00Z' is not"],
    ),
    (
        "missing-path",
        "upstreams:\n  orders: {mode: cdf}\npipelines: {}\n",
        2,
        ["upstream 'orders' has no path", "add path:"],
    ),
    (
        "empty-path",
        "upstreams:\n  orders: {path: ''}\npipelines: {}\n",
        2,
        ["path must be text", "got ''"],
    ),
    (
        "missing-target",
        UP + f"pipelines:\n  p: {{upstreams: [orders], keys: [id], {T}}}\n",
        4,
        ["pipeline 'p' has no target", "add target:"],
    ),
    (
        "missing-transform",
        UP + "pipelines:\n  p: {upstreams: [orders], target: /l/t, keys: [id]}\n",
        4,
        ["pipeline 'p' has no transform"],
    ),
    (
        "missing-upstreams",
        UP + f"pipelines:\n  p:\n    target: /l/t\n    {T}\n",
        4,
        ["pipeline 'p' has no upstreams"],
    ),
    (
        "unknown-upstream",
        UP + f"pipelines:\n  p: {{upstreams: [ordrs], target: /l/t, keys: [id], {T}}}\n",
        4,
        ["reads unknown upstream 'ordrs' (did you mean 'orders'?)"],
    ),
    (
        "transform-module-missing",
        UP + "pipelines:\n  p: {upstreams: [orders], target: /l/t, keys: [id],\n"
        "      transform: no_such_pkg.transforms:clean}\n",
        5,
        ["cannot import module 'no_such_pkg.transforms'", "No module named 'no_such_pkg'"],
    ),
    (
        "transform-module-raises",
        UP + "pipelines:\n  p: {upstreams: [orders], target: /l/t, keys: [id],\n"
        "      transform: wm_registry_file_broken:clean}\n",
        5,
        ["cannot import module 'wm_registry_file_broken'", "RuntimeError: boom at import"],
    ),
    (
        "transform-function-missing",
        UP + "pipelines:\n  p: {upstreams: [orders], target: /l/t, keys: [id],\n"
        f"      transform: {TRANSFORMS}:orders_cleen}}\n",
        5,
        ["has no attribute 'orders_cleen' (did you mean 'orders_clean'?)"],
    ),
    (
        "transform-not-callable",
        UP + "pipelines:\n  p: {upstreams: [orders], target: /l/t, keys: [id],\n"
        f"      transform: {TRANSFORMS}:NOT_A_FUNCTION}}\n",
        5,
        [f"transform '{TRANSFORMS}:NOT_A_FUNCTION' is a number, not a function"],
    ),
    (
        "transform-is-a-pipeline",
        UP + "pipelines:\n  p: {upstreams: [orders], target: /l/t, keys: [id],\n"
        f"      transform: {TRANSFORMS}:decorated}}\n",
        5,
        ["is a pipeline declared with @pipeline", f"{TRANSFORMS}:decorated.transform"],
    ),
    (
        "transform-without-colon",
        UP + f"pipelines:\n  p: {{upstreams: [orders], target: /l/t, keys: [id],\n"
        f"      transform: {TRANSFORMS}.orders_clean}}\n",
        5,
        [f"transform '{TRANSFORMS}.orders_clean' is not module:function"],
    ),
    (
        "name-with-semicolon",
        "upstreams:\n  'orders; DROP TABLE x': /l/o\npipelines: {}\n",
        2,
        ["Invalid upstream name 'orders; DROP TABLE x'"],
    ),
    (
        "name-with-quote",
        UP + f'pipelines:\n  "o\'brien": {{upstreams: [orders], target: /l/t, keys: [id], {T}}}\n',
        4,
        ['Invalid pipeline name "o\'brien"'],
    ),
    (
        "name-with-space",
        "upstreams:\n  my orders: /l/o\npipelines: {}\n",
        2,
        ["Invalid upstream name 'my orders'"],
    ),
    (
        "name-read-as-boolean",
        "upstreams:\n  on: /l/o\npipelines: {}\n",
        2,
        ["upstream name 'on' is read by YAML as a boolean", "quote it ('on')"],
    ),
    (
        "key-column-with-quote",
        UP + f'pipelines:\n  p: {{upstreams: [orders], target: /l/t, keys: ["id`; --"], {T}}}\n',
        4,
        ["Invalid key column 'id`; --'"],
    ),
    (
        "cycle-through-itself",
        UP + f"pipelines:\n  p: {{upstreams: [orders], target: /lake/orders/, keys: [id], {T}}}\n",
        4,
        ["'p' reads its own output", "'p' writes '/lake/orders' = upstream 'orders', read by 'p'"],
    ),
    (
        "cycle-through-two-pipelines",
        "upstreams:\n  a: /lake/a\n  b: /lake/b\npipelines:\n"
        f"  p: {{upstreams: [a], target: /lake/b, keys: [id], {T}}}\n"
        f"  q: {{upstreams: [b], target: /lake/a, keys: [id], {T}}}\n",
        5,
        ["'p' writes '/lake/b' = upstream 'b', read by 'q'", "'q' writes '/lake/a'"],
    ),
    (
        "invalid-yaml",
        "upstreams:\n  orders: {path: /l/o\npipelines: {}\n",
        3,
        ["not valid YAML"],
    ),
    (
        "list-as-key",
        "upstreams:\n  [a, b]: /l/o\npipelines: {}\n",
        2,
        ["found a key that is a list or a mapping"],
    ),
    (
        "declared-with-a-list",
        UP + "pipelines:\n  p:\n    upstreams: [orders]\n    target: /l/t\n    keys: [id]\n"
        "    sql: SELECT id FROM orders\n",
        5,
        ["pipeline 'p' is declared (sql:) but its upstreams are a list", "Fix: write upstreams:"],
    ),
    (
        "key-paths-with-a-transform",
        UP + "pipelines:\n  p:\n    upstreams: {orders: id}\n    target: /l/t\n    keys: [id]\n"
        f"    {T}\n",
        5,
        ["maps its upstreams to key paths, but has a hand-written transform"],
    ),
    (
        "transform-and-sql",
        UP + "pipelines:\n  p:\n    upstreams: {orders: id}\n    target: /l/t\n    keys: [id]\n"
        f"    {T}\n    sql: SELECT id FROM orders\n",
        9,
        ["pipeline 'p' has both transform: and sql:"],
    ),
    (
        "transform-and-full-with-key-paths",
        UP + "pipelines:\n  p:\n    upstreams: {orders: id}\n    target: /l/t\n    keys: [id]\n"
        f"    {T}\n    full: {TRANSFORMS}:enriched\n",
        9,
        [
            "pipeline 'p' has both transform: and full: and maps its upstreams to key paths",
            "full: beside transform: with its upstreams listed",
        ],
    ),
    (
        "full-transform-of-other-upstreams",
        UP + "pipelines:\n  p:\n    upstreams: [orders]\n    target: /l/t\n    keys: [id]\n"
        f"    {T}\n    full: {TRANSFORMS}:enriched\n",
        9,
        [
            "Pipeline 'p': the full transform has parameter(s) ['customers'] that name no "
            "upstream it reads",
            "def enriched(orders)",
        ],
    ),
    (
        "strategy-without-a-full-transform",
        UP + "pipelines:\n  p:\n    upstreams: [orders]\n    target: /l/t\n    keys: [id]\n"
        f"    {T}\n    strategy: full\n",
        4,
        ["hand-written and sets strategy='full' without a full transform", "full: beside"],
    ),
    (
        "bad-key-path",
        UP + "pipelines:\n  p:\n    upstreams: {orders: orders.id -> x.id}\n    target: /l/t\n"
        "    keys: [id]\n    sql: SELECT id FROM orders\n",
        8,
        ["Pipeline 'p': the key path of upstream 'orders'", "has an even number of steps"],
    ),
    (
        "sql-window",
        UP + "pipelines:\n  p:\n    upstreams: {orders: id}\n    target: /l/t\n    keys: [id]\n"
        "    sql: SELECT id, rank() OVER (ORDER BY amount) AS r FROM orders\n",
        8,
        ["Pipeline 'p': its SQL (line 1) uses a window that is not partitioned by columns"],
    ),
    (
        # The issue's big_spenders: the subquery is on the SQL's line 4, the file's line 11.
        "sql-global-subquery",
        "upstreams: {customers: /l/c, orders: /l/o}\npipelines:\n  big_spenders:\n"
        "    upstreams: {customers: customer_id, orders: customer_id}\n"
        "    keys: [customer_id]\n    target: /l/t\n    sql: |\n"
        "      SELECT c.customer_id, SUM(o.amount) AS total\n"
        "      FROM customers c JOIN orders o ON o.customer_id = c.customer_id\n"
        "      GROUP BY c.customer_id\n"
        "      HAVING SUM(o.amount) > (SELECT AVG(amount) * 2 FROM orders)\n",
        11,
        [
            "Pipeline 'big_spenders': its SQL (line 4) reads upstream 'orders' (as 'orders', in "
            "a subquery) with no equality between columns that leads from its rows to the "
            "target keys",
        ],
    ),
    (
        "full-not-importable",
        UP + "pipelines:\n  p:\n    upstreams: {orders: id}\n    target: /l/t\n    keys: [id]\n"
        f"    full: {TRANSFORMS}:enriched_typo\n",
        8,
        ["full 'wm_registry_file_transforms:enriched_typo'", "did you mean 'enriched'"],
    ),
    (
        "full-wrong-parameters",
        UP + "pipelines:\n  p:\n    upstreams: {orders: id}\n    target: /l/t\n    keys: [id]\n"
        f"    full: {TRANSFORMS}:enriched\n",
        8,
        ["the full transform has parameter(s) ['customers'] that name no upstream"],
    ),
    ("not-a-mapping", "- orders\n- customers\n", 1, ["the file must be a mapping"]),
    ("empty-file", "\n", None, ["the file is empty"]),
    ("no-pipelines-section", UP, None, ["no pipelines: section"]),
]


@pytest.mark.parametrize(
    ("text", "line", "fragments"),
    [case[1:] for case in BAD_FILES],
    ids=[case[0] for case in BAD_FILES],
)
def test_a_bad_file_is_refused_naming_file_line_and_value(
    tmp_path: Path, transforms: Path, text: str, line: int | None, fragments: list[str]
) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(text)
    with pytest.raises(ConfigurationError) as caught:
        load_registry(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: " if line else f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, message
    assert "Fix: " in message
    assert list(tmp_path.iterdir()) == [path]  # nothing written next to it


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"ghost\.yaml: registry file does not exist"):
        load_registry(tmp_path / "ghost.yaml")


# ------------------------------------------------------------------ cycles in Python registries


def _t(batch: Any) -> Any:
    return None


def _p(name: str, upstreams: tuple[str, ...], target: str) -> Pipeline:
    return Pipeline(name=name, upstreams=upstreams, target=target, keys=("id",), transform=_t)


@pytest.mark.parametrize(
    "target",
    ["/lake/a", "/lake/a/", "/lake//a", "file:///lake/a", "/lake/x/../a"],
    ids=["same", "trailing-slash", "double-slash", "file-uri", "dot-dot"],
)
def test_a_pipeline_reading_its_own_target_is_a_cycle(target: str) -> None:
    with pytest.raises(ConfigurationError, match=r"Pipeline 'p' reads its own output"):
        Registry(
            upstreams=[DeltaUpstream(name="a", path="/lake/a")], pipelines=[_p("p", ("a",), target)]
        )


def test_a_cycle_through_other_pipelines_is_refused_and_a_chain_is_not() -> None:
    ups = [DeltaUpstream(name=n, path=f"s3://lake/{n}") for n in ("a", "b", "c")]
    chain = [_p("p", ("a",), "s3://lake/b"), _p("q", ("b",), "s3://lake/c/")]
    Registry(upstreams=ups, pipelines=chain)  # a -> p -> b -> q -> c: fine
    with pytest.raises(ConfigurationError) as caught:
        Registry(upstreams=ups, pipelines=[*chain, _p("r", ("c", "b"), "s3://lake/a")])
    message = str(caught.value)
    assert "reads its own output through a cycle" in message
    assert "'q' writes 's3://lake/c/' = upstream 'c', read by 'r'" in message
    assert "'r' writes 's3://lake/a' = upstream 'a', read by 'p'" in message


# ------------------------------------------------------------------ through the command line


def _versions(control: Path) -> dict[str, int]:
    store = WatermarkStore(control)
    return {t: store.table_version(t) for t in CONTROL_TABLES}


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """An `orders` upstream at version 2 and control tables with its watermark at 1."""
    for i in range(3):
        write_deltalake(
            str(tmp_path / "lake" / "orders"),
            pa.table({"id": pa.array([i], pa.int64())}),
            mode="append",
        )
    store = WatermarkStore(tmp_path / "control")
    store.ensure_tables()
    store.initialize_watermarks({"orders": (1, None, "test")}, actor="test")
    return tmp_path


@pytest.fixture
def cli(transforms: Path) -> Cli:
    """Runs `watermark` with WATERMARK_REGISTRY set, the transforms module importable."""

    def run(folder: Path, registry: Path, *args: str) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "WATERMARK_HOME": str(folder / "home"),
            "WATERMARK_REGISTRY": str(registry),
            "PYTHONPATH": str(transforms),
            "NO_COLOR": "1",
        }
        return subprocess.run(
            [str(SCRIPT), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    return run


GOOD = f"""
control_root: control
upstreams:
  orders: lake/orders
pipelines:
  orders_copy: {{upstreams: [orders], target: lake/orders_copy, keys: [id], {T}}}
"""


def test_the_code_location_loads_the_file_the_environment_names(lake: Path, cli: Cli) -> None:
    out = cli(lake, _write(lake, GOOD), "list", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert (row["upstream"], row["committed"], row["latest"]) == ("orders", 1, 2)


@pytest.mark.parametrize(
    ("args", "text", "message"),
    [
        (
            ["list", "--json"],
            "upstreams:\n  orders: {path: lake/orders, max_version_per_batch: 5}\n",
            ":3: upstream 'orders': unknown key 'max_version_per_batch'",
        ),
        (
            ["plan", "--dry-run"],
            "upstreams:\n  orders: lake/orders\n  orders: lake/orders_v2\n",
            ":4: 'orders' appears twice in upstreams",
        ),
        (
            ["get", "-t", "orders"],
            "upstreams:\n  orders: lake/orders\npipelines:\n"
            f"  p: {{upstreams: [ordrs], target: lake/t, keys: [id], {T}}}\n",
            ":5: pipeline 'p' reads unknown upstream 'ordrs'",
        ),
        (
            ["set", "-t", "orders", "--version", "2", "--yes"],
            "upstreams:\n  orders: lake/orders\npipelines:\n"
            f"  p: {{upstreams: [orders], target: lake/orders, keys: [id], {T}}}\n",
            ":5: Pipeline 'p' reads its own output through a cycle",
        ),
        (
            ["plan", "--dry-run"],
            "upstreams:\n  orders: lake/orders\npipelines:\n"
            "  p:\n    upstreams: {orders: id}\n    target: lake/t\n    keys: [id]\n"
            "    sql: SELECT id, uuid() AS tag FROM orders\n",
            ":9: Pipeline 'p': its SQL (line 1) calls uuid, which is non-deterministic",
        ),
    ],
    ids=["list-unknown-key", "plan-duplicate", "get-unknown-upstream", "set-cycle", "plan-sql"],
)
def test_a_bad_file_stops_the_command_with_exit_2_and_writes_nothing(
    lake: Path, cli: Cli, args: list[str], text: str, message: str
) -> None:
    before = _versions(lake / "control")
    if "pipelines:" not in text:
        text += "pipelines: {}\n"
    registry = _write(lake, "control_root: control\n" + text)
    out = cli(lake, registry, *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert f"{registry}{message}" in out.stderr, out.stderr
    assert out.stdout == ""
    assert _versions(lake / "control") == before


def test_a_bad_or_missing_file_creates_no_control_root(tmp_path: Path, cli: Cli) -> None:
    bad = _write(
        tmp_path, "control_root: control\nupstreams: {orders: {pth: /l/o}}\npipelines: {}\n"
    )
    out = cli(tmp_path, bad, "plan", "--dry-run")
    assert out.returncode == 2
    assert "unknown key 'pth' (did you mean 'path'?)" in out.stderr
    missing = cli(tmp_path, tmp_path / "nope.yaml", "list")
    assert missing.returncode == 2
    assert f"{tmp_path / 'nope.yaml'}: registry file does not exist" in missing.stderr
    assert not (tmp_path / "control").exists()
    assert not (tmp_path / "home" / "control").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["get", "-t", "o'brien"], 'unknown upstream "o\'brien"'),
        (["get", "-t", "my orders"], "unknown upstream 'my orders'"),
        (
            ["set", "-t", "orders; DROP TABLE x", "--version", "1", "--yes"],
            "unknown upstream 'orders; DROP TABLE x'",
        ),
        (["reset", "-t", 'x"; --', "--yes"], "unknown upstream 'x\"; --'"),
        (["batch", "b000001'; --"], '"b000001\'; --" is not a batch id'),
        (["verify", "-p", "p; DROP TABLE x"], "unknown pipeline 'p; DROP TABLE x'"),
    ],
    ids=[
        "get-quote",
        "get-space",
        "set-semicolon",
        "reset-double-quote",
        "batch-quote",
        "verify-semicolon",
    ],
)
def test_table_names_with_quotes_semicolons_or_spaces_write_nothing(
    lake: Path, cli: Cli, args: list[str], message: str
) -> None:
    before = _versions(lake / "control")
    out = cli(lake, _write(lake, GOOD), *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr
    assert _versions(lake / "control") == before


# ------------------------------------------------------------------ unavailable upstreams


def test_missing_and_non_delta_upstreams_are_reported_and_nothing_is_planned_for_them(
    lake: Path, cli: Cli
) -> None:
    """Extends test_registry_and_observe's one-upstream check to the whole registry and
    `watermark plan --dry-run`, beside a healthy upstream."""
    csvs = lake / "landing" / "csvs"
    csvs.mkdir(parents=True)
    (csvs / "part-0.csv").write_text("id\n1\n")
    registry = _write(
        lake,
        GOOD.replace("upstreams:\n", "upstreams:\n  ghost: lake/ghost\n  csvs: landing/csvs\n")
        + f"  ghost_copy: {{upstreams: [ghost], target: lake/ghost_copy, keys: [id], {T}}}\n"
        f"  mixed: {{upstreams: [orders, csvs], target: lake/mixed, keys: [id], {T}}}\n",
    )
    look = observe_registry(load_registry(registry), Observer(), {"orders": 1})
    assert set(look.errors) == {"ghost", "csvs"}
    assert str(lake / "lake" / "ghost") in look.errors["ghost"]
    assert str(csvs) in look.errors["csvs"]
    assert "not a readable Delta" in look.errors["csvs"]
    assert list(look.runnable) == ["orders_copy"]

    before = _versions(lake / "control")
    out = cli(lake, registry, "plan", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert (plan["pipelines"], set(plan["unavailable"])) == (["orders_copy"], {"ghost", "csvs"})
    assert _versions(lake / "control") == before


LANDING = f"""
control_root: control
upstreams:
  drops: {{kind: landing, path: landing/drops, format: csv, file_schema: "id BIGINT",
           settle_seconds: 0}}
pipelines:
  drops_copy: {{upstreams: [drops], target: lake/drops_copy, keys: [id], {T}}}
"""


def test_a_landing_folder_waits_for_its_first_file_and_the_showing_commands_log_nothing(
    lake: Path, cli: Cli
) -> None:
    """An empty folder is idle, not a failure: `watermark run` exits 0 (a cron job's
    success) and `list` says it waits. Then a file lands: `list`, `get` and `plan --dry-run`
    show it as file 1 of the next batch, and none of them writes the file log (only the
    coordinator's look, planning, numbers files for good)."""
    drops = lake / "landing" / "drops"
    drops.mkdir(parents=True)
    registry = _write(lake, LANDING)
    log = drops / DEFAULT_LOG_FOLDER
    ran = cli(lake, registry, "run", "--json")
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    outcome = json.loads(ran.stdout)
    assert (outcome["runs"], outcome["blocked"]) == ([], {})
    listed = cli(lake, registry, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["state"], row["unavailable"]) == ("waiting", None)
    assert "no file has landed" in row["waiting"]
    shown = cli(lake, registry, "list")
    assert "WAITING drops: " in shown.stdout, shown.stdout

    (drops / "a.csv").write_text("1\n2\n")
    log_before = sorted(p.name for p in log.rglob("*")) if log.exists() else None
    for args in (
        ["list", "--json"],
        ["get", "-t", "drops", "--json"],
        ["plan", "--dry-run", "--json"],
    ):
        out = cli(lake, registry, *args)
        assert out.returncode == 0, (args, out.stderr)
        assert (sorted(p.name for p in log.rglob("*")) if log.exists() else None) == log_before
    (row,) = json.loads(cli(lake, registry, "list", "--json").stdout)
    assert (row["state"], row["latest"]) == ("ok", 1)
    plan = json.loads(cli(lake, registry, "plan", "--dry-run", "--json").stdout)
    assert plan["pipelines"] == ["drops_copy"], plan
