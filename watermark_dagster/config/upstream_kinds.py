"""Which kind of upstream a declaration names, by its ``kind:`` key: one small table.

A registry file's entry, a component's spec and a test's spec are mappings of settings;
:func:`declare_upstream` builds the upstream of the kind they name (``delta`` by default,
``cursor`` also chosen by ``mode: timestamp``) and refuses settings that kind does not take.
A new kind of upstream is one line in :data:`UPSTREAM_KINDS`.
"""

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.options import options_of
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream, Upstream, UpstreamMode
from watermark_dagster.errors import ConfigurationError

UPSTREAM_KINDS: dict[str, type[Upstream]] = {
    "delta": DeltaUpstream,
    "cursor": CursorUpstream,
    "landing": LandingUpstream,
    "database": DatabaseUpstream,
}
"""``kind:`` value -> the upstream type it declares."""


def declare_upstream(**settings: object) -> Upstream:
    """The upstream a mapping of settings declares (a YAML entry, a test spec), by its
    ``kind:`` (see :data:`UPSTREAM_KINDS`); without one, a :class:`CursorUpstream` when it says
    ``mode: timestamp``, else a :class:`DeltaUpstream`.

    Raises:
        ConfigurationError: an unknown kind, a setting that does not apply to that kind (the
            message names the upstream, the settings and the fix), or a bad value.
    """
    name = str(settings.get("name", "?"))
    mode = settings.get("mode")
    by_timestamp = isinstance(mode, str) and mode.strip().lower() == UpstreamMode.TIMESTAMP
    given = settings.pop("kind", None)
    kind = "cursor" if by_timestamp else "delta"
    if given is not None:
        kind = given.strip().lower() if isinstance(given, str) else ""
    cls = UPSTREAM_KINDS.get(kind)
    if cls is None:
        raise ConfigurationError(
            f"Upstream '{name}': kind {given!r} is not one of {sorted(UPSTREAM_KINDS)}.",
            upstream=name,
            fix=f"set kind to one of {sorted(UPSTREAM_KINDS)} (default: delta).",
        )
    by_cursor = issubclass(cls, CursorUpstream)
    if by_cursor and mode is not None and not by_timestamp:
        raise ConfigurationError(
            f"Upstream '{name}' is read by cursor (kind: {kind}); mode={mode!r} does not "
            "apply (it reads by version).",
            upstream=name,
            fix="drop mode (or give mode: timestamp), or choose kind: delta.",
        )
    allowed = _keys(cls)
    extra = set(settings) - allowed - ({"mode"} if by_cursor else set())
    if extra:
        raise _not_taken(name, kind, cls, extra, allowed)
    if by_cursor:
        if not settings.get("cursor"):
            raise ConfigurationError(
                f"Upstream '{name}' is read by timestamp but names no cursor column.",
                upstream=name,
                fix="give cursor='updated_at' (a timestamp or increasing id column).",
            )
        settings = {k: v for k, v in settings.items() if k != "mode"}
    # The settings are untyped (a YAML entry, a test spec), like plain-Python arguments:
    # the upstream checks its values when it is built.
    return cls(**settings)  # pyright: ignore[reportArgumentType]


def _not_taken(
    name: str, kind: str, cls: type[Upstream], extra: set[str], allowed: frozenset[str]
) -> ConfigurationError:
    """The error for settings ``extra`` that an upstream of ``kind`` does not take: it names
    the kind they belong to when that is one other kind."""
    wrong = ", ".join(sorted(extra))
    if cls is CursorUpstream:
        return ConfigurationError(
            f"Upstream '{name}' is read by cursor (mode='timestamp'); {wrong} only apply to "
            "Delta upstreams read by version.",
            upstream=name,
            fix="remove them, or choose another mode to read it by version.",
        )
    if cls is DeltaUpstream:
        for other in ("landing", "database"):
            owned = extra - _keys(CursorUpstream)
            if owned and owned <= _keys(UPSTREAM_KINDS[other]):
                what = "a landing folder" if other == "landing" else "a database upstream"
                return ConfigurationError(
                    f"Upstream '{name}': {', '.join(sorted(owned))} only apply to {what} "
                    f"(kind: {other}).",
                    upstream=name,
                    fix=f"set kind: {other} (kind='{other}') or drop them.",
                )
        return ConfigurationError(
            f"Upstream '{name}': {wrong} only apply to mode='timestamp' or to another kind.",
            upstream=name,
            fix="set mode='timestamp' (or kind: landing or database) or drop those settings.",
        )
    what = "a landing folder" if cls is LandingUpstream else f"a {kind} upstream"
    return ConfigurationError(
        f"Upstream '{name}' is {what} (kind: {kind}); {wrong} "
        + ("does" if len(extra) == 1 else "do")
        + " not apply to it.",
        upstream=name,
        fix=f"remove them; it takes {', '.join(sorted(allowed - {'name'}))}.",
    )


def _keys(cls: type[Upstream]) -> frozenset[str]:
    """The settings an upstream of type ``cls`` takes."""
    return frozenset({"name"} | {o.key for o in options_of(cls)})
