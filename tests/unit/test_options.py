"""One declaration per setting: the registry file, the Component and the docs' tables are
made from the dataclass fields, their types and their docstring sentences."""

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

import pytest

from watermark_dagster.config.option_docs import docs_tables, with_tables
from watermark_dagster.config.options import Kind, options_of, written_as
from watermark_dagster.config.pipeline import PIPELINE_OPTIONS, ChangeFeed, Strategy, WriteMode
from watermark_dagster.config.upstream import (
    UPSTREAM_OPTIONS,
    OnDataChange,
    SchemaChanges,
    UpstreamMode,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_option_tables_are_the_declarations() -> None:
    page = ROOT / "docs" / "registry-file.md"
    text = page.read_text(encoding="utf-8")
    assert with_tables(text, docs_tables()) == text, (
        "docs/registry-file.md's option tables differ from the declarations: run "
        "`python -m watermark_dagster.config.option_docs --write docs/registry-file.md`."
    )


@pytest.mark.parametrize(
    ("key", "enum", "options"),
    [
        ("mode", UpstreamMode, UPSTREAM_OPTIONS),
        ("on_data_change", OnDataChange, UPSTREAM_OPTIONS),
        ("schema_changes", SchemaChanges, UPSTREAM_OPTIONS),
        ("write", WriteMode, PIPELINE_OPTIONS),
        ("strategy", Strategy, PIPELINE_OPTIONS),
        ("change_feed", ChangeFeed, PIPELINE_OPTIONS),
    ],
)
def test_a_choice_takes_exactly_the_values_its_enum_stores(key, enum: type[StrEnum], options):
    (option,) = [o for o in options if o.key == key]
    assert option.choices == tuple(m.value for m in enum)


def test_every_setting_has_its_sentence_and_a_new_one_needs_nothing_else() -> None:
    for option in (*UPSTREAM_OPTIONS, *PIPELINE_OPTIONS):
        assert len(option.doc) > 10, option.key

    @dataclass(frozen=True, kw_only=True)
    class Probe:
        """A probe.

        Args:
            color: the color it is drawn in,
                on two lines.
            size: how big.
        """

        color: Literal["red", "blue"] = field(default="red", metadata=written_as(Kind.CHOICE))
        size: int = field(metadata=written_as(Kind.WHOLE))
        internal: int = 0

    color, size = options_of(Probe)
    assert (color.key, color.choices, color.default, color.shape) == (
        "color",
        ("red", "blue"),
        "red",
        "text (red or blue)",
    )
    assert color.doc == "the color it is drawn in, on two lines."
    assert size.required
    assert size.shape == "a whole number"


def test_a_setting_without_its_sentence_is_refused_at_import() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Undocumented:
        """Args:
        other: something else.
        """

        color: str = field(default="red", metadata=written_as(Kind.TEXT))

    with pytest.raises(TypeError, match=r"Undocumented.color .* Args:"):
        options_of(Undocumented)
