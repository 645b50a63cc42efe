"""A landing-folder upstream's settings are checked when it is declared (no JVM, no I/O)."""

import re
from pathlib import Path

import pytest

from watermark_dagster.config.landing import LandingFormat, LandingUpstream
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream
from watermark_dagster.config.upstream_kinds import declare_upstream
from watermark_dagster.config.yaml_file import load_registry
from watermark_dagster.errors import ConfigurationError
from watermark_dagster.observe.landing import settled
from watermark_dagster.observe.landing_files import FileStat, matches, spark_path


def test_the_kind_key_picks_the_upstream_type() -> None:
    landing = declare_upstream(
        name="drops", path="/in/drops", kind="LANDING", format="csv", file_schema="id INT"
    )
    assert isinstance(landing, LandingUpstream)
    assert landing.format is LandingFormat.CSV
    assert (landing.mode, landing.is_cursor) == ("append_only", False)
    assert landing.log_location == "/in/drops/_watermark_files"
    capped = LandingUpstream(name="d", path="/in/d/", max_files_per_batch=5, files_log="/logs/d")
    assert (capped.max_versions_per_batch, capped.log_location) == (5, "/logs/d")
    assert isinstance(declare_upstream(name="o", path="/o", kind="delta"), DeltaUpstream)
    assert isinstance(
        declare_upstream(name="c", path="/c", kind="cursor", cursor="ts"), CursorUpstream
    )
    assert isinstance(
        declare_upstream(name="c", path="/c", mode="timestamp", cursor="ts"), CursorUpstream
    )


@pytest.mark.parametrize(
    ("kwargs", "message", "fix"),
    [
        ({"pattern": "*.csv"}, "pattern only apply to a landing folder (kind: landing)", "kind"),
        (
            {"kind": "cursor", "cursor": "ts", "mode": "cdf"},
            "mode='cdf' does not apply (it reads by version)",
            "kind",
        ),
        (
            {"kind": "folder"},
            "kind 'folder' is not one of ['cursor', 'database', 'delta', 'landing']",
            "kind",
        ),
        (
            {"kind": "landing", "cursor": "ts"},
            "landing folder (kind: landing); cursor does not apply",
            "remove them",
        ),
        ({"kind": "landing", "mode": "cdf"}, "mode does not apply", "remove them"),
        ({"kind": "landing", "format": "avro"}, "format 'avro' is not one of", "format"),
        (
            {"kind": "landing", "file_schema": "id INT"},
            "file_schema is for csv and json",
            "remove file_schema",
        ),
        (
            {"kind": "landing", "format": "csv", "file_schema": " "},
            "is not a Spark DDL schema",
            "file_schema=",
        ),
        (
            {"kind": "landing", "settle_seconds": -1},
            "settle_seconds must be a finite number >= 0, got -1",
            "settle_seconds=",
        ),
        (
            {"kind": "landing", "settle_seconds": float("nan")},
            "settle_seconds must be",
            "settle_seconds=",
        ),
        (
            {"kind": "landing", "max_files_per_batch": 0},
            "max_files_per_batch must be a positive",
            "1 or more",
        ),
        ({"kind": "landing", "pattern": ""}, "pattern '' is not a glob", "pattern="),
        ({"kind": "landing", "pattern": "/in/*.csv"}, "matches no file", "'**/*.csv'"),
        ({"kind": "landing", "pattern": "a//*.csv"}, "matches no file", "'**'"),
        ({"kind": "landing", "pattern": "../*.csv"}, "'..' segments", "'*.csv'"),
        ({"kind": "landing", "pattern": "**.csv"}, "'**' inside a segment", "'**/*.csv'"),
        ({"kind": "landing", "start_from": "2026-01-01T00:00:00Z"}, "is a timestamp", "'latest'"),
        ({"kind": "landing", "table": "raw.drops"}, "cannot be named by catalog table", "path="),
    ],
)
def test_landing_settings_are_refused_naming_the_upstream_value_and_fix(
    kwargs: dict, message: str, fix: str
) -> None:
    kwargs = {**kwargs, "path": ""} if "table" in kwargs else {"path": "/in/drops", **kwargs}
    with pytest.raises(ConfigurationError, match=re.escape(message)) as raised:
        declare_upstream(name="drops", **kwargs)
    assert "drops" in str(raised.value)
    assert raised.value.fix is not None
    assert fix in raised.value.fix


def test_a_registry_file_declares_a_landing_upstream(tmp_path: Path) -> None:
    registry = tmp_path / "watermark.yaml"
    registry.write_text(
        "upstreams:\n"
        "  drops:\n"
        "    kind: landing\n"
        "    path: /in/drops\n"
        "    format: json\n"
        "    pattern: '*.json'\n"
        "    settle_seconds: 5\n"
        "    read_options: {multiLine: true}\n"
        "pipelines: {}\n"
    )
    drops = load_registry(registry).upstreams["drops"]
    assert isinstance(drops, LandingUpstream)
    assert (drops.pattern, drops.settle_seconds, drops.read_options) == (
        "*.json",
        5,
        {"multiLine": "true"},
    )
    registry.write_text(
        "upstreams:\n  drops:\n    kind: landing\n    path: /in/drops\n    tie_break: [id]\n"
        "pipelines: {}\n"
    )
    with pytest.raises(ConfigurationError, match=r"watermark.yaml:2.*tie_break does not apply"):
        load_registry(registry)


def test_only_settled_files_are_taken() -> None:
    now = 100 * 10**9
    files = [FileStat("old", 1, now - 31 * 10**9), FileStat("fresh", 1, now - 29 * 10**9)]
    assert [f.path for f in settled(files, 30, now)] == ["old"]
    assert [f.path for f in settled(files, 0, now)] == ["old", "fresh"]


@pytest.mark.parametrize(
    ("pattern", "taken", "left"),
    [
        ("*", ["a.csv", "x.tmp"], ["late/c.csv", "a/b/c"]),
        ("*.csv", ["a.csv", "a[1].csv"], ["late/c.csv", "a.json"]),
        ("**", ["a.csv", "late/c.csv", "a/b/c"], []),
        ("**/*.csv", ["a.csv", "late/c.csv", "a/b/c.csv"], ["a/b/c.json"]),
        ("2026/*/*.json", ["2026/01/a.json"], ["2026/a.json", "2026/01/02/a.json"]),
        ("2026/**/*.json", ["2026/a.json", "2026/01/02/a.json"], ["2027/a.json"]),
        ("in/**", ["in/a", "in/b/c"], ["in", "out/a"]),
        ("[ab].csv", ["a.csv"], ["ab.csv", "a/b.csv"]),
    ],
)
def test_a_pattern_is_matched_segment_by_segment(
    pattern: str, taken: list[str], left: list[str]
) -> None:
    """``*`` stops at ``/``; only a ``**`` segment matches folders (zero or more)."""
    LandingUpstream(name="drops", path="/in/drops", pattern=pattern)  # a valid pattern
    assert [p for p in taken + left if matches(pattern, p)] == taken


def test_the_default_pattern_takes_every_file_at_any_depth() -> None:
    default = LandingUpstream(name="drops", path="/in/drops")
    assert default.pattern == "**"
    assert matches(default.pattern, "2026/01/a.csv")


def test_a_path_handed_to_spark_has_its_glob_characters_escaped() -> None:
    upstream = LandingUpstream(name="drops", path="s3://in/drops[x]")
    assert spark_path(upstream, "a[1]/{b,c}?*\\.csv") == (
        "s3://in/drops\\[x\\]/a\\[1\\]/\\{b,c\\}\\?\\*\\\\.csv"
    )
    assert spark_path(upstream, "plain.csv") == "s3://in/drops[x]/plain.csv".replace(
        "[x]", "\\[x\\]"
    )
