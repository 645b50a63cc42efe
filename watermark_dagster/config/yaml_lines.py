"""YAML read with the line of every key: what lets a registry file's errors start with
``file:line``.

:class:`LineLoader` is PyYAML's safe loader whose mappings are :class:`LinedMapping`: each
knows its own line, its keys' lines, each key as written, the keys given twice (plain YAML
keeps the last one silently) and where a literal block's text starts.
:func:`with_lines` builds the same from plain data (a component's attributes) and a
function giving the lines.
"""

from collections.abc import Callable, Hashable, Mapping
from typing import Any, cast

import yaml

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MAP_TAG = "tag:yaml.org,2002:map"


class LinedMapping(dict[Any, Any]):
    """A YAML mapping that remembers where it and each of its keys are, and which keys
    appeared more than once (plain YAML loading silently keeps the last one)."""

    line: int
    key_lines: dict[Any, int]
    key_text: dict[Any, str]  # each key as written (YAML reads `on:` as True)
    duplicates: list[tuple[Any, int, int]]  # (key, line, line of its first occurrence)
    # For a literal block value (`key: |`), the file line of the text's first line: the
    # text keeps its line breaks, so its line n is at `block_lines[key] + n - 1`.
    block_lines: dict[Any, int]


class LineLoader(yaml.SafeLoader):
    """Safe loading, plus line numbers and duplicate keys; timestamps stay text (the
    registry parses them itself, always with a time zone)."""


LineLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_mapping(loader: LineLoader, node: yaml.MappingNode) -> Any:
    explicit = {id(key) for key, _ in node.value}
    # Resolves `<<` merge keys; merged pairs come first and explicit ones may override them.
    loader.flatten_mapping(node)
    data = LinedMapping()
    data.line, data.key_lines, data.key_text, data.duplicates = node.start_mark.line + 1, {}, {}, []
    data.block_lines = {}
    first_at: dict[Any, int] = {}  # explicit keys -> line
    # PyYAML's stubs leave construct_object untyped; it returns plain data of any type.
    construct = cast("Callable[..., object]", loader.construct_object)  # pyright: ignore[reportUnknownMemberType]
    yield data
    for key_node, value_node in node.value:
        key = construct(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                "found a key that is a list or a mapping",
                key_node.start_mark,
            )
        line = key_node.start_mark.line + 1
        if id(key_node) in explicit:
            if key in first_at:
                data.duplicates.append((key, line, first_at[key]))
            first_at.setdefault(key, line)
        data[key] = construct(value_node, deep=True)
        data.key_lines[key] = line
        data.key_text[key] = str(getattr(key_node, "value", key))
        if isinstance(value_node, yaml.ScalarNode) and value_node.style == "|":
            data.block_lines[key] = value_node.start_mark.line + 2  # the line after `|`


LineLoader.add_constructor(_MAP_TAG, _construct_mapping)


def mapping_at(line: int, items: dict[str, Any] | None = None) -> LinedMapping:
    """A mapping written by the loader itself (an empty section, a shorthand entry)."""
    made = LinedMapping(items or {})
    made.line, made.duplicates = line, []
    made.key_lines, made.key_text = dict.fromkeys(made, line), {k: k for k in made}
    made.block_lines = {}
    return made


def with_lines(
    value: Any,
    at: tuple[str | int, ...],
    line_of: Callable[[tuple[str | int, ...]], int | None],
    block_start: Callable[[tuple[str | int, ...]], int | None],
    line: int,
) -> Any:
    """Plain data as the loader would have built it: each mapping a :class:`LinedMapping`
    knowing its keys' lines (a key whose line is unknown gets its mapping's)."""
    if isinstance(value, list):
        items = cast("list[object]", value)
        return [
            with_lines(v, (*at, i), line_of, block_start, line_of((*at, i)) or line)
            for i, v in enumerate(items)
        ]
    if not isinstance(value, Mapping):
        return value
    entries = cast("Mapping[Any, Any]", value)
    made = mapping_at(line)
    for key, item in entries.items():
        path = (*at, str(key))
        key_line = line_of(path) or line
        made[key] = with_lines(item, path, line_of, block_start, key_line)
        made.key_lines[key] = key_line
        made.key_text[key] = str(key)
        first = block_start(path) if isinstance(item, str) and "\n" in item else None
        if first is not None:
            made.block_lines[key] = first
    return made
