"""Declared SQL as the load and a batch see it, for the tests of what key_inference
accepts: the key paths a batch follows, or the refusal (no JVM)."""

from collections.abc import Mapping, Sequence

from watermark_dagster.config.declared import paths_for_batch
from watermark_dagster.config.pipeline import Pipeline, sql_pipeline
from watermark_dagster.errors import ConfigurationError


def load(sql: str, upstreams: dict[str, str], keys: list[str]) -> Pipeline:
    return sql_pipeline(name="pipe", sql=sql, upstreams=upstreams, target="/lake/pipe", keys=keys)


def key_paths(
    sql: str,
    upstreams: dict[str, str],
    keys: list[str],
    schemas: Mapping[str, Sequence[str]],
) -> dict[str, list[str]] | None:
    """The key paths a batch follows, per upstream, as text; None when the SQL is refused
    (when it loads, or once the batch places its columns with ``schemas``)."""
    try:
        pipeline = load(sql, upstreams, keys)
    except ConfigurationError:
        return None
    assert pipeline.declared is not None
    try:
        paths = paths_for_batch("pipe", pipeline.declared, keys, schemas)
    except ConfigurationError:
        return None
    return {u: [str(p) for p in ps] for u, ps in paths.items()}


def refused(
    sql: str,
    upstreams: dict[str, str],
    keys: list[str],
    schemas: Mapping[str, Sequence[str]],
) -> None:
    paths = key_paths(sql, upstreams, keys, schemas)
    assert paths is None, f"accepted with key paths {paths}"


def refused_or_follows(
    sql: str,
    upstreams: dict[str, str],
    keys: list[str],
    schemas: Mapping[str, Sequence[str]],
    upstream: str,
    needed: str,
) -> None:
    paths = key_paths(sql, upstreams, keys, schemas)
    assert paths is None or needed in paths[upstream], (
        f"accepted without the key path {needed!r} for '{upstream}': {paths}"
    )
