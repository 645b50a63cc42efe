"""Resolving a registry's catalog table names to locations when the code location loads.

Observation and planning read Delta logs by location with delta-rs and start no JVM, so a
name has to become a location first, and only Spark can ask the catalog. That is done once
per load of a registry that names catalog tables (none: nothing here runs), in a child
process, ``python -m watermark_dagster.runtime.catalog``, built with the code location's
own Spark settings: its JVM ends with it, so no JVM stays in the code server or the
command, and an embedded metastore (Derby admits one JVM at a time) is free again for the
runs. Each run resolves the names again through its own session and refuses a name that
moved (:func:`watermark_dagster.read.catalog.check_catalog_names`).

An upstream whose table does not exist is left unresolved, as a path that does not exist
is left as declared: the observer reports it unavailable
(:func:`~watermark_dagster.errors.missing_table_error`), its pipelines are blocked, and the
rest of the code location loads and runs.
"""

import json
import logging
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from watermark_dagster.config.names import quote_table_name
from watermark_dagster.config.registry import Registry
from watermark_dagster.errors import ConfigurationError, missing_table_error

log = logging.getLogger("watermark_dagster")

_ANSWER = "WATERMARK_CATALOG_LOCATIONS "
# A first resolution may fetch Delta's jars; a metastore may be slow to answer.
RESOLVE_TIMEOUT_SECONDS = 900


def resolve_catalog_tables(
    registry: Registry,
    *,
    master: str,
    remote: str | None,
    app_name: str,
    conf: Mapping[str, str],
) -> Registry:
    """``registry`` with every catalog table name resolved to its location (the same
    registry when it names none: no process, no JVM). An upstream whose table does not
    exist is left unresolved: observing it reports it unavailable, which blocks only the
    pipelines reading it.

    Args:
        registry: the declared upstreams and pipelines.
        master: the Spark master of the code location's runs.
        remote: their Spark Connect URL, if any.
        app_name: their application name (the resolving process adds ``-catalog``).
        conf: their Spark settings (the catalog's and the metastore's among them).

    Raises:
        ConfigurationError: an upstream's table is not a Delta table, a missing target's
            schema does not exist, or the catalog could not be reached; the message names
            the declaration and the table.
    """
    upstreams, targets = registry.catalog_names()
    if not upstreams and not targets:
        return registry
    request = {
        "spark": {"master": master, "remote": remote, "app_name": app_name, "conf": dict(conf)},
        "upstreams": {n: list(p) for n, p in upstreams.items()},
        "targets": {n: list(p) for n, p in targets.items()},
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "watermark_dagster.runtime.catalog"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=RESOLVE_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConfigurationError(
            f"Resolving the catalog tables {_names(upstreams, targets)} took more than "
            f"{RESOLVE_TIMEOUT_SECONDS} s.",
            fix="check that the catalog (metastore) answers with the code location's Spark "
            "settings.",
        ) from None
    answer = next(
        (
            json.loads(line[len(_ANSWER) :])
            for line in reversed(done.stdout.splitlines())
            if line.startswith(_ANSWER)
        ),
        None,
    )
    if answer is None:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise ConfigurationError(
            f"Could not resolve the catalog tables {_names(upstreams, targets)}: the Spark "
            f"process exited with {done.returncode}:\n{tail}",
            fix="check the Spark settings (WATERMARK_SPARK_CONF: the catalog and its "
            "metastore) and that no other process holds an embedded metastore.",
        )
    error = answer.get("error")
    if error is not None:
        raise ConfigurationError(error["reason"], fix=error["fix"], **error["names"])
    for name in answer.get("missing", []):
        log.warning("%s", missing_table_error(name, quote_table_name(upstreams[name])))
    return registry.with_locations(answer["upstreams"], answer["targets"])


def _names(upstreams: Mapping[str, tuple[str, ...]], targets: Mapping[str, tuple[str, ...]]) -> str:
    return ", ".join(quote_table_name(p) for p in [*upstreams.values(), *targets.values()])


def _resolve(request: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to one request, in the child: name -> location, the upstreams whose
    table does not exist, or the first error."""
    from watermark_dagster.read.catalog import new_table_location, table_location
    from watermark_dagster.runtime.spark import build_spark_session

    settings = request["spark"]
    spark = build_spark_session(
        master=settings["master"],
        remote=settings["remote"],
        app_name=f"{settings['app_name']}-catalog",
        conf=settings["conf"],
    )
    names: dict[str, str] = {}
    try:
        upstreams: dict[str, str] = {}
        missing: list[str] = []
        for name, raw in request["upstreams"].items():
            names = {"upstream": name}
            location = table_location(spark, tuple(raw))
            if location is None:
                missing.append(name)
            else:
                upstreams[name] = location
        targets: dict[str, str] = {}
        for name, raw in request["targets"].items():
            parts = tuple(raw)
            names = {"pipeline": name}
            targets[name] = table_location(spark, parts) or new_table_location(spark, parts)
    except ConfigurationError as e:
        owner = f"Upstream '{names.get('upstream')}'" if "upstream" in names else None
        reason = e.reason if owner is None or e.reason.startswith(owner) else f"{owner}: {e.reason}"
        if "pipeline" in names and not reason.startswith("Pipeline"):
            reason = f"Pipeline '{names['pipeline']}': {reason}"
        return {"error": {"reason": reason, "fix": e.fix or "", "names": names}}
    finally:
        spark.stop()
    return {"upstreams": upstreams, "targets": targets, "missing": missing}


def main() -> None:
    """Read a request (JSON on stdin), answer on stdout with one marked line."""
    answer = _resolve(json.loads(sys.stdin.read()))
    print(_ANSWER + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
