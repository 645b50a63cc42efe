"""WatermarkComponent as a user meets it: `dg scaffold defs`, `dg check yaml`, `dg list defs`
in a temporary dg project, several components in one project, the demo as a component,
and one batch run through a component location.

The `dg` commands run as subprocesses (a few seconds each), once per module: one project
is scaffolded and listed; the other tests load projects in this process.
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.conftest import REPO, SPARK_TEST_CONF

DG = Path(sys.executable).with_name("dg")
TYPE = "watermark_dagster.WatermarkComponent"

DEFINITIONS_PY = """\
from pathlib import Path

from dagster import definitions, load_from_defs_folder


@definitions
def defs():
    return load_from_defs_folder(path_within_project=Path(__file__).parent)
"""


def _project(root: Path, package: str) -> Path:
    """A minimal dg project: pyproject.toml with [tool.dg], a package whose definitions
    load its defs folder."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{package}"\nversion = "0.0.0"\n\n'
        '[tool.dg]\ndirectory_type = "project"\n\n'
        f'[tool.dg.project]\nroot_module = "{package}"\n'
    )
    (root / package / "defs").mkdir(parents=True, exist_ok=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "definitions.py").write_text(DEFINITIONS_PY)
    return root


def _env(root: Path, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WATERMARK_", "DAGSTER_"))}
    (tmp / "dagster_home").mkdir(exist_ok=True)
    (tmp / "dagster_home" / "dagster.yaml").write_text("telemetry: {enabled: false}\n")
    env.update(
        DAGSTER_HOME=str(tmp / "dagster_home"),
        WATERMARK_HOME=str(tmp / "watermark_home"),
        PYTHONPATH=os.pathsep.join([str(root), str(REPO), env.get("PYTHONPATH", "")]),
        PATH=os.pathsep.join([str(DG.parent), env.get("PATH", "")]),
        NO_COLOR="1",
    )
    return env


def _dg(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DG), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def _load(root: Path, package: str, monkeypatch: pytest.MonkeyPatch):
    from dagster import load_from_defs_folder

    monkeypatch.syspath_prepend(str(root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_from_defs_folder(path_within_project=root / package)


@pytest.fixture(scope="module")
def scaffolded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A dg project where `dg scaffold defs` wrote `sales`, and a second component,
    `marketing`, made from the same file with its own name, control root and key prefix;
    with what `dg list defs --json` lists."""
    tmp = tmp_path_factory.mktemp("component")
    root = _project(tmp / "project", "wm_scaffolded")
    env = _env(root, tmp)
    done = _dg(root, env, "scaffold", "defs", TYPE, "sales")
    assert done.returncode == 0, done.stdout + done.stderr
    sales = root / "wm_scaffolded" / "defs" / "sales" / "defs.yaml"
    text = sales.read_text()
    marketing = sales.parent.parent / "marketing" / "defs.yaml"
    marketing.parent.mkdir()
    marketing.write_text(
        text.replace("name: sales", "name: marketing\n  key_prefix: marketing").replace(
            "control_root: _watermark", "control_root: _watermark_marketing"
        )
    )
    listed = _dg(root, env, "list", "defs", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    return root, json.loads(listed.stdout)


def test_scaffold_writes_a_commented_defs_yaml_with_an_upstream_and_a_pipeline(
    scaffolded: tuple[Path, dict],
) -> None:
    root, _ = scaffolded
    text = (root / "wm_scaffolded" / "defs" / "sales" / "defs.yaml").read_text()
    assert text.startswith(f"type: {TYPE}\n")
    assert "  name: sales\n" in text
    assert "orders: {path: data/orders}" in text
    assert "customer_totals:" in text
    assert text.count("\n#") + text.count("\n  #") >= 5  # each part explained


def test_dg_list_defs_lists_both_components_under_their_prefixes(
    scaffolded: tuple[Path, dict],
) -> None:
    _, listed = scaffolded
    assets = {a["asset_key"] for a in listed["assets"]}
    assert {"orders", "customer_totals", "marketing/orders", "marketing/customer_totals"} <= assets
    sensors = {s["name"] for s in listed["sensors"]}
    assert sensors == {
        "sales_watermark_coordinator",
        "sales_watermark_finalizer",
        "marketing_watermark_coordinator",
        "marketing_watermark_finalizer",
    }
    jobs = {j["name"] for j in listed["jobs"]}
    assert {"sales_watermark_batch_job", "marketing_watermark_batch_job"} <= jobs
    resources = {r["name"] for r in listed["resources"]}
    assert {"sales_watermark_store", "marketing_watermark_store", "sales_spark"} <= resources
    checks = {c["key"] for c in listed["asset_checks"]}
    assert "marketing/customer_totals:watermark_stuck_batch" in checks


def test_two_components_keep_their_own_control_roots_and_names(
    scaffolded: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    from watermark_dagster.dagster_defs.definitions import location_of, locations_in
    from watermark_dagster.errors import ConfigurationError

    root, _ = scaffolded
    defs = _load(root, "wm_scaffolded", monkeypatch)
    found = locations_in(defs)
    assert set(found) == {"sales", "marketing"}
    folder = root / "wm_scaffolded" / "defs"
    assert found["sales"].control_root == str(folder / "sales" / "_watermark")
    assert found["marketing"].control_root == str(folder / "marketing" / "_watermark_marketing")
    assert found["sales"].registry.pipelines["customer_totals"].target == str(
        folder / "sales" / "data" / "customer_totals"
    )
    assert defs.resolve_job_def("marketing_watermark_batch_job") is not None
    with pytest.raises(ConfigurationError, match="hold 2 watermark locations"):
        location_of(defs)
    assert location_of(defs, "marketing").names.coordinator == "marketing_watermark_coordinator"


BAD = """\
type: watermark_dagster.WatermarkComponent
attributes:
  name: bad
  contrl_root: _watermark
  upstreams:
    orders: {path: data/orders}
  pipelines:
    totals:
      upstreams: {orders: customer_id}
      keys: [customer_id]
      target: data/totals
      sql: SELECT customer_id, COUNT(*) AS n FROM orders GROUP BY customer_id
"""


def test_dg_check_yaml_names_the_line_of_a_wrong_attribute(tmp_path: Path) -> None:
    root = _project(tmp_path / "project", "wm_bad_yaml")
    folder = root / "wm_bad_yaml" / "defs" / "bad"
    folder.mkdir()
    (folder / "defs.yaml").write_text(BAD)
    # dg 1.13.27 validates one defs.yaml per component type when given none: name it.
    done = _dg(root, _env(root, tmp_path), "check", "yaml", str(folder))
    assert done.returncode != 0
    assert f"{folder / 'defs.yaml'}:4" in done.stdout, done.stdout + done.stderr
    assert "contrl_root" in done.stdout


def test_a_registry_error_points_at_its_defs_yaml_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from watermark_dagster.errors import ConfigurationError

    root = _project(tmp_path / "project", "wm_bad_registry")
    folder = root / "wm_bad_registry" / "defs" / "bad"
    folder.mkdir()
    text = BAD.replace("contrl_root", "control_root").replace(
        "sql: SELECT customer_id, COUNT(*) AS n FROM orders GROUP BY customer_id",
        # A literal block: the error names the file line of the SQL line at fault.
        "sql: |\n        SELECT customer_id, COUNT(*) AS n\n"
        "        FROM ordrs GROUP BY customer_id",
    )
    (folder / "defs.yaml").write_text(text)
    with pytest.raises(Exception, match="bad") as raised:  # Dagster's, caused by ours
        _load(root, "wm_bad_registry", monkeypatch)
    causes, error = [], raised.value
    while error is not None:
        causes.append(error)
        error = error.__cause__
    messages = [str(e) for e in causes if isinstance(e, ConfigurationError)]
    assert messages, [str(e) for e in causes]
    assert messages[0].startswith(f"{folder / 'defs.yaml'}:14: "), messages[0]  # FROM ordrs
    assert "ordrs" in messages[0]
    assert "Fix: " in messages[0]


def test_the_demo_component_declares_the_python_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from watermark_dagster.dagster_defs.definitions import location_of
    from watermark_dagster.definitions import build_demo_location

    monkeypatch.setenv("WATERMARK_HOME", str(tmp_path / "home"))
    from dagster import load_from_defs_folder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        component = location_of(load_from_defs_folder(path_within_project=REPO))
    python = build_demo_location(tmp_path / "home")
    assert component.name is None
    assert component.control_root == python.control_root
    assert component.registry.upstreams == python.registry.upstreams
    for name, pipeline in python.registry.pipelines.items():
        declared = component.registry.pipelines[name]
        assert (declared.target, declared.keys, declared.upstreams, declared.description) == (
            pipeline.target,
            pipeline.keys,
            pipeline.upstreams,
            pipeline.description,
        )
        assert declared.declared == pipeline.declared
    got, want = component.definitions, python.definitions
    assert {s.key for s in got.resolve_all_asset_specs()} == {
        s.key for s in want.resolve_all_asset_specs()
    }
    assert got.resolve_asset_graph().asset_check_keys == want.resolve_asset_graph().asset_check_keys
    assert {s.name for s in got.sensors or []} == {s.name for s in want.sensors or []}
    assert set(got.resources or {}) == set(want.resources or {})


def test_the_component_model_takes_the_registry_file_keys() -> None:
    from watermark_dagster.config.yaml_values import PIPELINE_KEYS, TOP_KEYS, UPSTREAM_KEYS
    from watermark_dagster.dagster_defs.component import (
        PipelineSpec,
        UpstreamSpec,
        WatermarkComponent,
    )

    assert set(UpstreamSpec.model_fields) == set(UPSTREAM_KEYS)
    assert set(PipelineSpec.model_fields) == set(PIPELINE_KEYS)
    assert set(TOP_KEYS) <= set(WatermarkComponent.model_fields)
    # The values too: dg check yaml refuses what the declarations refuse.
    from watermark_dagster.config.file_options import PIPELINE_OPTIONS, UPSTREAM_OPTIONS

    schema = WatermarkComponent.model().model_json_schema()
    for spec, options in (("UpstreamSpec", UPSTREAM_OPTIONS), ("PipelineSpec", PIPELINE_OPTIONS)):
        properties = schema["$defs"][f"{spec}Model"]["properties"]
        for option in options:
            if option.choices:
                (allowed,) = [a for a in properties[option.key]["anyOf"] if "enum" in a]
                assert tuple(allowed["enum"]) == option.choices, option.key


@pytest.mark.spark
def test_a_batch_runs_through_a_component_location(
    spark, tmp_path: Path, watermark_home: Path, dagster_home: Path, monkeypatch
) -> None:
    from dagster import DagsterInstance, RunsFilter

    from watermark_dagster.dagster_defs.headless import HeadlessRunner
    from watermark_dagster.demo import DemoPaths, seed

    paths = DemoPaths(watermark_home)
    seed(spark, paths)
    root = _project(tmp_path / "project", "wm_spark")
    folder = root / "wm_spark" / "defs" / "demo"
    folder.mkdir()
    spark_settings = json.dumps({"master": "local[2]", "spark_config": SPARK_TEST_CONF})
    (folder / "defs.yaml").write_text(
        (REPO / "watermark_dagster" / "defs" / "demo" / "defs.yaml")
        .read_text()
        .replace("attributes:\n", f"attributes:\n  name: shop\n  spark: {spark_settings}\n")
    )
    defs = _load(root, "wm_spark", monkeypatch)
    instance = DagsterInstance.get()
    try:
        report = HeadlessRunner(defs, instance).run_until_idle()
        assert report.completed == ["b000001"], report
        assert list(instance.get_dynamic_partitions("shop_watermark_batches")) == ["b000001"]
        assert not instance.get_dynamic_partitions("watermark_batches")
        runs = instance.get_runs(RunsFilter(job_name="shop_watermark_batch_job"))
        assert runs
        assert all(r.is_success for r in runs)
    finally:
        instance.dispose()
    rows = spark.read.format("delta").load(paths.target("orders_enriched")).count()
    assert rows == 8  # the demo's eight orders
    assert (paths.home / "control").exists()
