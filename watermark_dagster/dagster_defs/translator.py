"""The translator mapping upstreams and pipelines to Dagster assets
(:class:`WatermarkTranslator`): asset key, group, description, metadata and kinds, each an
overridable hook.
"""

from typing import Any

from dagster import AssetKey, MetadataValue

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.declared import describe
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.upstream import CursorUpstream, Upstream


class WatermarkTranslator:
    """Maps upstreams and pipelines to Dagster assets; override a ``get_*`` hook to change
    one aspect (in the style of dagster-dbt's translator).

    Each hook takes an :class:`Upstream` or a :class:`Pipeline`. The asset of a pipeline
    also carries ``watermark/pipeline`` metadata naming it, whatever the hooks return: the
    headless runner finds pipeline assets by it.

    Example:
        >>> class Prefixed(WatermarkTranslator):
        ...     def get_asset_key(self, item):
        ...         return AssetKey(["lake", item.name])
        >>> defs = build_definitions(registry, control_root="/lake/_wm", translator=Prefixed())
    """

    def get_asset_key(self, item: Upstream | Pipeline) -> AssetKey:
        """Asset key (default: the name)."""
        return AssetKey([item.name])

    def get_group_name(self, item: Upstream | Pipeline) -> str:
        """Asset group (default: ``upstreams`` or ``pipelines``)."""
        return "pipelines" if isinstance(item, Pipeline) else "upstreams"

    def get_description(self, item: Upstream | Pipeline) -> str:
        """Asset description (default: the declared one, else where it reads or writes)."""
        if item.description:
            return item.description
        if isinstance(item, Pipeline):
            return f"Pipeline {item.name} → {item.target}"
        if isinstance(item, DatabaseUpstream):
            return (
                f"{item.database} table {item.source_table} at {item.url}, read by cursor "
                f"{item.cursor!r}"
            )
        if isinstance(item, CursorUpstream):
            return f"{item.format} source at {item.path}, read by cursor {item.cursor!r}"
        if isinstance(item, LandingUpstream):
            return f"Landing folder of {item.format} files at {item.path}, each loaded once"
        return f"Delta table at {item.path}"

    def get_metadata(self, item: Upstream | Pipeline) -> dict[str, Any]:
        """Asset definition metadata (default: path or target, mode, keys)."""
        if isinstance(item, Pipeline):
            metadata: dict[str, Any] = {
                "dagster/uri": item.target,
                "target": MetadataValue.path(item.target),
                "keys": list(item.keys),
                "write": str(item.write),
            }
            if item.declared is not None:
                # Where each upstream's changes reach the target: what the derived
                # incremental transform recomputes.
                metadata["transform"] = f"declared ({describe(item.declared)['form']})"
                metadata["key_paths"] = MetadataValue.json(describe(item.declared)["key_paths"])
                if item.declared.sql is not None:
                    metadata["sql"] = MetadataValue.md(f"```sql\n{item.declared.sql}\n```")
            elif item.full_transform is not None:
                metadata["transform"] = "hand-written, with a full transform"
            if item.chooses_strategy:
                metadata["strategy"] = str(item.strategy)
            return metadata
        return {
            "dagster/uri": item.path,
            "path": MetadataValue.path(item.path),
            "mode": str(item.mode),
            "start_from": str(item.start_from),
            **(
                {"max_versions_per_batch": item.max_versions_per_batch}
                if item.max_versions_per_batch is not None
                else {}
            ),
        }

    def get_kinds(self, item: Upstream | Pipeline) -> set[str]:
        """Kinds shown on the asset (default: ``delta``, plus ``spark`` for pipelines)."""
        return {"spark", "delta"} if isinstance(item, Pipeline) else {"delta"}

    # Called by build_definitions until it calls get_asset_key itself (not documented).
