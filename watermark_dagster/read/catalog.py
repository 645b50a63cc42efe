"""Catalog table names, through a Spark session: where a name points, where a new target
goes, registering a target the first write created, and the run's check that a name still
points where its batch was planned (I6).

Names reach Spark only as validated parts, each in backticks
(:func:`~watermark_dagster.config.names.quote_table_name`), and only through the catalog
API and Delta's ``DeltaTable.forName``: no SQL text is built from a declaration.
"""

from collections.abc import Mapping

from pyspark.sql import SparkSession

from watermark_dagster.config.names import quote_table_name
from watermark_dagster.config.pipeline import Pipeline
from watermark_dagster.config.registry import Registry
from watermark_dagster.errors import ConfigurationError, UpstreamRecreatedError, reset_command

_S3, _S3A = "s3://", "s3a://"


def normalize_location(location: str) -> str:
    """A table location in the spelling delta-rs and the registry use: Spark's
    ``file:/a/b`` and ``file:///a/b`` become ``/a/b``, and Hadoop's ``s3a://bucket/a``
    becomes ``s3://bucket/a``, as tables on S3 are declared by path (one table, one
    spelling: the registry compares locations to find cycles and shared targets); other
    URIs are kept."""
    text = location.strip()
    if text.startswith("file:"):
        text = "/" + text[len("file:") :].lstrip("/")
    elif text[: len(_S3A)].lower() == _S3A:
        text = _S3 + text[len(_S3A) :]
    return text.rstrip("/") or "/"


def catalog_spelling(location: str, schema_location: str) -> str:
    """``location`` (in :func:`normalize_location`'s spelling) in the S3 scheme of its
    schema's location as the catalog gives it: a catalog that stores ``s3a://`` locations
    gets one back, which Spark readers knowing only Hadoop's s3a file system can open."""
    if location.startswith(_S3) and schema_location.strip()[: len(_S3A)].lower() == _S3A:
        return _S3A + location[len(_S3) :]
    return location


def table_location(spark: SparkSession, parts: tuple[str, ...]) -> str | None:
    """Where the catalog table ``parts`` is stored, or None when no table has that name.

    Raises:
        ConfigurationError: the name is a table, but not a Delta table.
    """
    from delta.tables import DeltaTable

    name = quote_table_name(parts)
    if not spark.catalog.tableExists(name):
        return None
    try:
        row = DeltaTable.forName(spark, name).detail().select("location").first()
    except Exception as e:  # Spark's AnalysisException, over py4j or Connect alike
        raise ConfigurationError(
            f"Catalog table {name} is not a Delta table ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}).",
            fix="name a Delta table, or convert it (CONVERT TO DELTA).",
        ) from None
    if row is None or not row[0]:
        raise ConfigurationError(
            f"Catalog table {name} has no location.",
            fix="name a Delta table stored at a location.",
        )
    return normalize_location(str(row[0]))


def new_table_location(spark: SparkSession, parts: tuple[str, ...]) -> str:
    """Where a target named ``parts`` that does not exist yet is created: in its schema's
    folder, under the table's name in lower case, where Spark's session catalog puts a
    managed table of that name.

    Raises:
        ConfigurationError: the schema does not exist, or the catalog gives it no location.
    """
    schema = parts[:-1] or (spark.catalog.currentDatabase(),)
    schema_name = quote_table_name(schema)
    try:
        found = spark.catalog.getDatabase(schema_name)
    except Exception:  # AnalysisException: no such schema
        raise ConfigurationError(
            f"The schema {schema_name} of the target table {quote_table_name(parts)} does not "
            "exist.",
            fix=f"create it first (CREATE SCHEMA {schema_name}), or name another schema.",
        ) from None
    if not found.locationUri:
        raise ConfigurationError(
            f"The catalog gives the schema {schema_name} no location, so the target "
            f"{quote_table_name(parts)} has nowhere to be created.",
            fix="create the target table in the catalog first, or give the target as a path.",
        )
    return f"{normalize_location(found.locationUri)}/{parts[-1].lower()}"


def register_table(spark: SparkSession, parts: tuple[str, ...], location: str) -> bool:
    """Register the Delta table at ``location`` under the name ``parts`` unless the name
    exists (the first write of a target named by catalog table created it by path). The
    table is external: dropping the name leaves the data, as for a table given by path.
    On S3 it is registered in the scheme its schema's location has (:func:`catalog_spelling`).

    Returns:
        True when this call registered it.
    """
    name = quote_table_name(parts)
    if spark.catalog.tableExists(name):
        return False
    if location.startswith(_S3):
        schema = parts[:-1] or (spark.catalog.currentDatabase(),)
        found = spark.catalog.getDatabase(quote_table_name(schema))
        location = catalog_spelling(location, found.locationUri or "")
    spark.catalog.createTable(name, path=location, source="delta")
    return True


def moved_error(
    subject: str,
    parts: tuple[str, ...],
    planned: str,
    now: str | None,
    *,
    batch_id: str,
    upstream: str | None = None,
    pipeline: str | None = None,
) -> UpstreamRecreatedError:
    """The I6 error of a catalog name that no longer points where batch ``batch_id``
    expects it: it names the table, both locations and the fix."""
    name = quote_table_name(parts)
    where = "no table has that name any more" if now is None else f"the name now points at {now}"
    if upstream is not None:
        fix = (
            f"check that the table now named {name} is the one to follow, then run "
            f"`{reset_command(upstream)}`: its watermark is forgotten (the open batch is "
            f"abandoned) and its pipelines reload it from the table the name points at."
        )
    else:
        fix = (
            f"point {name} back at {planned}, or, to write the table the name now points at, "
            "restart the code location so it resolves the name again."
        )
    return UpstreamRecreatedError(
        f"{subject} (catalog table {name}) was dropped and recreated since batch {batch_id} "
        f"was planned: the batch uses it at {planned}, and {where}. Nothing was read or "
        "written.",
        upstream=upstream,
        pipeline=pipeline,
        batch_id=batch_id,
        fix=fix,
    )


def check_catalog_names(
    spark: SparkSession,
    registry: Registry,
    pipeline: Pipeline,
    planned_locations: Mapping[str, str | None],
    *,
    batch_id: str,
) -> None:
    """Before a run reads or writes: every catalog name the pipeline uses still points
    where its batch expects it.

    An upstream named by catalog table must be where the batch recorded it when it was
    planned (``planned_locations``; a batch recorded before locations were, None, is not
    checked); the target, when its name exists, where the code location resolved it.

    Raises:
        UpstreamRecreatedError: a name points elsewhere, or an upstream's table is gone;
            the message names the table, both locations and the fix.
    """
    for name in pipeline.upstreams:
        parts = registry.upstreams[name].table_parts
        planned = planned_locations.get(name)
        if parts is None or planned is None:
            continue
        now = table_location(spark, parts)
        if now != normalize_location(planned):
            raise moved_error(
                f"Upstream '{name}'", parts, planned, now, batch_id=batch_id, upstream=name
            )
    parts = pipeline.table_parts
    if parts is not None:
        now = table_location(spark, parts)
        if now is not None and now != normalize_location(pipeline.target):
            raise moved_error(
                f"The target of pipeline '{pipeline.name}'",
                parts,
                pipeline.target,
                now,
                batch_id=batch_id,
                pipeline=pipeline.name,
            )
