"""Which kind of upstream a declaration names, by its ``kind:`` key: one small table.

A registry file's entry, a component's spec and a test's spec are mappings of settings;
:func:`declare_upstream` builds the upstream of the kind they name (``delta`` by default,
``cursor`` also chosen by ``mode: timestamp``) and refuses settings that kind does not take.
"""

from watermark_dagster.config.landing import LandingUpstream
from watermark_dagster.config.options import options_of
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream, Upstream, UpstreamMode
from watermark_dagster.errors import ConfigurationError

UPSTREAM_KINDS: dict[str, type[Upstream]] = {
    "delta": DeltaUpstream,
    "cursor": CursorUpstream,
    "landing": LandingUpstream,
}
"""``kind:`` value -> the upstream type it declares."""


def declare_upstream(**settings: object) -> Upstream:
    """The upstream a mapping of settings declares (a YAML entry, a test spec), by its
    ``kind:`` (see :data:`UPSTREAM_KINDS`); without one, a :class:`CursorUpstream` when it says
    ``mode: timestamp``, else a :class:`DeltaUpstream`.

    Raises:
        ConfigurationError: an unknown kind, a setting that does not apply to that kind,
            or a bad value.
    """
    name = str(settings.get("name", "?"))
    kinds = UPSTREAM_KINDS
    mode = settings.get("mode")
    by_cursor = isinstance(mode, str) and mode.strip().lower() == UpstreamMode.TIMESTAMP
    kind = settings.pop("kind", None)
    if kind is None:
        kind = "cursor" if by_cursor else "delta"
    if not isinstance(kind, str) or kind.strip().lower() not in kinds:
        raise ConfigurationError(
            f"Upstream '{name}': kind {kind!r} is not one of {sorted(kinds)}.",
            upstream=name,
            fix=f"set kind to one of {sorted(kinds)} (default: delta).",
        )
    kind = kind.strip().lower()
    cls = kinds[kind]
    if kind == "cursor":
        if mode is not None and not by_cursor:
            raise ConfigurationError(
                f"Upstream '{name}' is read by cursor (kind: cursor); mode {mode!r} reads by "
                "version.",
                upstream=name,
                fix="drop mode (or give mode: timestamp), or choose kind: delta.",
            )
        by_cursor = True
    allowed = _keys(cls)
    wrong = ", ".join(sorted(set(settings) - allowed - ({"mode"} if by_cursor else set())))
    if wrong and kind == "landing":
        raise ConfigurationError(
            f"Upstream '{name}' is a landing folder (kind: landing); {wrong} do not apply to it.",
            upstream=name,
            fix=f"remove them; it takes {', '.join(sorted(allowed - {'name'}))}.",
        )
    if wrong and by_cursor:
        raise ConfigurationError(
            f"Upstream '{name}' is read by cursor (mode='timestamp'); {wrong} only apply to "
            "Delta upstreams read by version.",
            upstream=name,
            fix="remove them, or choose another mode to read it by version.",
        )
    landing_only = set(settings) - allowed - _keys(CursorUpstream)
    if wrong and landing_only and landing_only <= _keys(LandingUpstream):
        raise ConfigurationError(
            f"Upstream '{name}': {', '.join(sorted(landing_only))} only apply to a landing "
            "folder (kind: landing).",
            upstream=name,
            fix="set kind: landing (kind='landing') or drop them.",
        )
    if wrong:
        raise ConfigurationError(
            f"Upstream '{name}': {wrong} only apply to mode='timestamp'.",
            upstream=name,
            fix="set mode='timestamp' or drop the cursor settings.",
        )
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


def _keys(cls: type[Upstream]) -> frozenset[str]:
    """The settings an upstream of type ``cls`` takes."""
    return frozenset({"name"} | {o.key for o in options_of(cls)})
