"""One rule for every declared location: URIs as written, local paths made absolute once,
relative ones from the current folder (Python) or the registry file's folder (YAML)."""

from pathlib import Path

import pytest

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.locations import absolute_location
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.upstream import DeltaUpstream
from watermark_dagster.config.yaml_file import load_registry


@pytest.mark.parametrize(
    "written",
    ["s3a://lake/orders", "file:///lake/orders", "file:/lake/orders", "abfss://c@a/t"],
)
def test_a_uri_is_kept_as_written(written: str) -> None:
    assert absolute_location(f" {written} ") == written


def test_python_declarations_take_relative_paths_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    orders = DeltaUpstream(name="orders", path=".lake/orders/")
    files = LandingUpstream(name="files", path="landing", files_log="../logs/files")
    copy = Pipeline(
        name="copy",
        upstreams=["orders"],
        target="./.lake//copy",
        keys=["id"],
        transform=lambda batch: batch["orders"].changes,
    )
    assert orders.path == str(tmp_path / ".lake" / "orders")
    assert files.path == str(tmp_path / "landing")
    assert files.files_log == str(tmp_path.parent / "logs" / "files")
    assert copy.target == str(tmp_path / ".lake" / "copy")
    assert DeltaUpstream(name="home", path="~/t").path == str(Path.home() / "t")


def test_a_registry_file_takes_them_from_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "registry.yaml").write_text(
        "upstreams:\n  orders: {path: lake/orders}\n"
        "pipelines:\n  copy:\n    upstreams: {orders: id}\n    target: ../out/copy\n"
        "    keys: [id]\n    sql: SELECT * FROM orders\n"
    )
    monkeypatch.chdir(tmp_path)  # not the file's folder
    registry = load_registry(folder / "registry.yaml")
    assert registry.upstreams["orders"].path == str(folder / "lake" / "orders")
    assert registry.pipelines["copy"].target == str(tmp_path / "out" / "copy")
