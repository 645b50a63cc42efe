"""``--defs module:attribute`` finds a module in the current folder, as ``python -m`` and
``dagster -m`` do (docs/database-upstreams.md's "Try it" runs ``--defs shop_location:defs``
from the folder holding ``shop_location.py``)."""

import sys
from pathlib import Path

import pytest

from watermark_dagster.cli.context import load_location


def test_a_module_in_the_current_folder_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "here_location.py").write_text(
        "from pathlib import Path\n"
        "from watermark_dagster.definitions import build_demo_location\n"
        "defs = build_demo_location(Path(__file__).parent / 'home')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "here_location", raising=False)
    location = load_location("here_location:defs")
    assert location.registry.pipelines
