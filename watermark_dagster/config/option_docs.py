"""The option tables of docs/registry-file.md, made from the declarations
(:mod:`~watermark_dagster.config.options`).

``python -m watermark_dagster.config.option_docs`` prints them; ``--write
docs/registry-file.md`` rewrites them between their ``<!-- NAME:start -->`` and
``<!-- NAME:end -->`` markers. A test fails when the page differs from the declarations.
"""

import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from watermark_dagster.config.options import Kind, Option
from watermark_dagster.config.pipeline import PIPELINE_OPTIONS
from watermark_dagster.config.upstream import UPSTREAM_OPTIONS


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
    plain = re.sub(r":\w+:`~?\.?([^`]+)`", r"`\1`", text).replace("``", "`")
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


def docs_tables() -> dict[str, str]:
    """Each generated table of docs/registry-file.md, by the name of its markers."""
    return {
        "upstream-options": markdown_table(UPSTREAM_OPTIONS),
        "pipeline-options": markdown_table(PIPELINE_OPTIONS),
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
    """``python -m watermark_dagster.config.option_docs [--write FILE]``: print the docs' option
    tables, or rewrite them in FILE between their markers."""
    tables = docs_tables()
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        path.write_text(with_tables(path.read_text(encoding="utf-8"), tables), encoding="utf-8")
        return 0
    if argv:
        print("usage: python -m watermark_dagster.config.option_docs [--write FILE]")
        return 2
    for name, table in tables.items():
        print(f"<!-- {name} -->\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
