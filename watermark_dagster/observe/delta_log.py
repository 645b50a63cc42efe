"""Observing upstream Delta tables without a JVM.

A table with no new commit costs one listing of its ``_delta_log`` folder (local paths);
only when the version moved is the table loaded with delta-rs to read its metadata (CDF
flag, table id, schema fingerprint), and the result is cached per version.
"""

import hashlib
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from watermark_dagster.core.planning import UpstreamPosition
from watermark_dagster.errors import UpstreamUnavailableError
from watermark_dagster.registry import Registry, Upstream

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True)
class Observation:
    """What one look at an upstream found."""

    upstream: str
    path: str
    latest_version: int
    cdf_enabled: bool
    table_id: str
    schema_fingerprint: str


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local_path(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def latest_local_version(path: str) -> int | None:
    """Newest commit version in a local table's ``_delta_log`` (None if there is none)."""
    latest = None
    try:
        with os.scandir(os.path.join(_local_path(path), "_delta_log")) as entries:
            for entry in entries:
                m = _COMMIT_FILE.match(entry.name)
                if m:
                    v = int(m.group(1))
                    if latest is None or v > latest:
                        latest = v
    except FileNotFoundError:
        return None
    return latest


class Observer:
    """Observes upstreams, caching metadata per (path, version). Thread-safe."""

    def __init__(self) -> None:
        self._cache: dict[str, Observation] = {}
        self._lock = threading.Lock()

    def observe(self, upstream: Upstream) -> Observation:
        """Look at one upstream.

        Raises:
            UpstreamUnavailableError: the path does not exist or holds no Delta table.
        """
        path = upstream.path
        if _is_local(path):
            version = latest_local_version(path)
            if version is None:
                raise self._unavailable(upstream, "no Delta log found there")
            with self._lock:
                cached = self._cache.get(path)
            if cached is not None and cached.latest_version == version:
                return cached
        try:
            dt = DeltaTable(path, storage_options=dict(upstream.storage_options or {}) or None)
        except TableNotFoundError as e:
            raise self._unavailable(upstream, str(e).splitlines()[0]) from e
        except (DeltaError, OSError) as e:
            raise self._unavailable(upstream, f"{type(e).__name__}: {e}") from e
        metadata = dt.metadata()
        config = {k.lower(): v for k, v in (metadata.configuration or {}).items()}
        fingerprint = hashlib.sha256(dt.schema().to_json().encode()).hexdigest()[:16]
        obs = Observation(
            upstream=upstream.name,
            path=path,
            latest_version=dt.version(),
            cdf_enabled=str(config.get("delta.enablechangedatafeed", "false")).lower() == "true",
            table_id=str(metadata.id),
            schema_fingerprint=fingerprint,
        )
        with self._lock:
            self._cache[path] = obs
        return obs

    @staticmethod
    def _unavailable(upstream: Upstream, why: str) -> UpstreamUnavailableError:
        return UpstreamUnavailableError(
            f"Upstream '{upstream.name}' at {upstream.path!r} is not a readable Delta table "
            f"({why}).",
            upstream=upstream.name,
            fix="check the path in the registry, or create the table; nothing is planned for "
            "it until then.",
        )


@dataclass(frozen=True)
class RegistryObservation:
    """One look at every upstream a registry's pipelines read, ready for planning."""

    observed: Mapping[str, Observation]
    errors: Mapping[str, str]
    positions: tuple[UpstreamPosition, ...]
    runnable: Mapping[str, tuple[str, ...]]


def observe_registry(
    registry: Registry, observer: Observer, committed: Mapping[str, int | None]
) -> RegistryObservation:
    """Observe the consumed upstreams; unavailable ones are reported in ``errors`` and the
    pipelines reading them are left out of ``runnable`` (nothing is planned for them)."""
    observed: dict[str, Observation] = {}
    errors: dict[str, str] = {}
    for upstream in registry.consumed_upstreams():
        try:
            observed[upstream.name] = observer.observe(upstream)
        except UpstreamUnavailableError as e:
            errors[upstream.name] = str(e)
    positions = tuple(
        UpstreamPosition(
            name=name,
            latest_version=obs.latest_version,
            committed_version=committed.get(name),
            max_versions_per_batch=registry.upstreams[name].max_versions_per_batch,
        )
        for name, obs in observed.items()
    )
    runnable = {
        p: ups for p, ups in registry.pipeline_inputs().items() if all(u in observed for u in ups)
    }
    return RegistryObservation(observed, errors, positions, runnable)
