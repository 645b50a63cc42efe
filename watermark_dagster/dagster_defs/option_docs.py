"""The option tables of the docs, made from the declarations
(:mod:`~watermark_dagster.config.options`): an upstream's and a pipeline's keys in
docs/registry-file.md, the location settings and their variables in docs/configuration.md.

``python -m watermark_dagster.dagster_defs.option_docs`` prints them; ``--write DOCS``
rewrites them in the pages under the folder DOCS, between their ``<!-- NAME:start -->`` and
``<!-- NAME:end -->`` markers. A test fails when a page differs from the declarations.
"""

import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from watermark_dagster.config.file_options import (
    PIPELINE_OPTIONS,
    UPSTREAM_OPTIONS,
    WAREHOUSE_OPTIONS,
)
from watermark_dagster.config.options import Kind, Option, shown_references
from watermark_dagster.dagster_defs.component import SETTINGS_OPTIONS


def _shown(option: Option) -> str:
    if option.required:
        return "required"
    default = option.default
    if default is None or default == () or default == "":
        return "unset"
    return f"`{default}`"


def _takes(option: Option) -> str:
    if option.kind is Kind.CHOICE:
        return " / ".join(f"`{c}`" for c in option.choices)
    return option.shape.replace("|", "\\|")


def _cell(text: str) -> str:
    plain = shown_references(text)
    return plain.replace("|", "\\|")


def markdown_table(options: Iterable[Option]) -> str:
    """The options as a Markdown table: key, for which entries, values, default, meaning."""
    rows = [
        "| key | for | takes | default | what it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    rows += [
        f"| `{o.key}` | {o.applies or 'all'} | {_takes(o)} | {_shown(o)} | {_cell(o.doc)} |"
        for o in options
    ]
    return "\n".join(rows)


def settings_table(options: Iterable[Option]) -> str:
    """The location settings as a Markdown table: variable, ``settings:`` key, default,
    meaning."""
    rows = [
        "| variable | `settings:` key | default | what it does |",
        "| --- | --- | --- | --- |",
    ]
    rows += [
        f"| {f'`{o.env}`' if o.env else 'none'} | `{o.key}` | {_shown(o)} | {_cell(o.doc)} |"
        for o in options
    ]
    return "\n".join(rows)


def docs_tables() -> dict[str, dict[str, str]]:
    """Each page's generated tables, by the name of their markers."""
    return {
        "registry-file.md": {
            "upstream-options": markdown_table(UPSTREAM_OPTIONS),
            "pipeline-options": markdown_table(PIPELINE_OPTIONS),
        },
        "configuration.md": {"location-settings": settings_table(SETTINGS_OPTIONS)},
        "warehouse.md": {"warehouse-options": markdown_table(WAREHOUSE_OPTIONS)},
    }


def with_tables(text: str, tables: Mapping[str, str]) -> str:
    """``text`` with each ``<!-- NAME:start -->`` ... ``<!-- NAME:end -->`` block replaced
    by its table.

    Raises:
        ValueError: a table's markers are missing.
    """
    for name, table in tables.items():
        pattern = re.compile(
            rf"(<!-- {name}:start -->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.DOTALL
        )
        if not pattern.search(text):
            raise ValueError(f"no <!-- {name}:start --> ... <!-- {name}:end --> markers")
        text = pattern.sub(lambda m, t=table: f"{m.group(1)}{t}\n{m.group(2)}", text)
    return text


def main(argv: list[str]) -> int:
    """``python -m watermark_dagster.dagster_defs.option_docs [--write DOCS]``: print the
    docs' option tables, or rewrite them in the pages under DOCS."""
    pages = docs_tables()
    if argv[:1] == ["--write"] and len(argv) == 2:
        for page, tables in pages.items():
            path = Path(argv[1]) / page
            text = path.read_text(encoding="utf-8")
            path.write_text(with_tables(text, tables), encoding="utf-8")
        return 0
    if argv:
        print("usage: python -m watermark_dagster.dagster_defs.option_docs [--write DOCS]")
        return 2
    for page, tables in pages.items():
        for name, table in tables.items():
            print(f"<!-- {page}: {name} -->\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
