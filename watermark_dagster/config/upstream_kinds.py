"""Which kind of upstream a mapping of settings declares (a registry entry, a component's
``defs.yaml``, a test spec): its ``kind:`` key picks the class from :data:`UPSTREAM_KINDS`.

Without ``kind:``, ``mode: timestamp`` declares a cursor upstream, as it always has, and
anything else a Delta upstream.
"""

from watermark_dagster.config.database import DatabaseUpstream
from watermark_dagster.config.options import options_of
from watermark_dagster.config.upstream import CursorUpstream, DeltaUpstream, Upstream, UpstreamMode
from watermark_dagster.errors import ConfigurationError

UPSTREAM_KINDS: dict[str, type[Upstream]] = {
    "delta": DeltaUpstream,
    "cursor": CursorUpstream,
    "database": DatabaseUpstream,
}
"""``kind:`` -> the class it declares. A new kind of upstream is one line here."""

# Either kind, for code that reads the settings of one kind after checking which it is.
AnyUpstream = DeltaUpstream | CursorUpstream | DatabaseUpstream


def declare_upstream(**settings: object) -> AnyUpstream:
    """The upstream a mapping of settings declares: the class its ``kind:`` names in
    :data:`UPSTREAM_KINDS`; without one, a :class:`CursorUpstream` when it says
    ``mode: timestamp``, else a :class:`DeltaUpstream`.

    Raises:
        ConfigurationError: an unknown kind, a setting that does not apply to the kind (the
            message names the upstream, the settings and the fix), or a bad value.
    """
    name = str(settings.get("name", "?"))
    mode = settings.get("mode")
    by_timestamp = isinstance(mode, str) and mode.strip().lower() == UpstreamMode.TIMESTAMP
    given = settings.pop("kind", None)
    kind = str(given).strip().lower() if given is not None else None
    if kind is None:
        kind = "cursor" if by_timestamp else "delta"
    cls = UPSTREAM_KINDS.get(kind)
    if cls is None:
        raise ConfigurationError(
            f"Upstream '{name}': kind {given!r} is not one of {sorted(UPSTREAM_KINDS)}.",
            upstream=name,
            fix=f"set kind to one of {sorted(UPSTREAM_KINDS)} (or leave it out for delta).",
        )
    by_cursor = issubclass(cls, CursorUpstream)
    if by_cursor and mode is not None and not by_timestamp:
        raise ConfigurationError(
            f"Upstream '{name}' is a {kind} upstream, read by cursor; mode={mode!r} does not "
            "apply.",
            upstream=name,
            fix="remove mode (or set it to 'timestamp').",
        )
    allowed = {"name"} | {o.key for o in options_of(cls)}
    wrong = ", ".join(sorted(set(settings) - allowed - ({"mode"} if by_cursor else set())))
    if wrong and cls is CursorUpstream:
        raise ConfigurationError(
            f"Upstream '{name}' is read by cursor (mode='timestamp'); {wrong} only apply to "
            "Delta upstreams read by version.",
            upstream=name,
            fix="remove them, or choose another mode to read it by version.",
        )
    if wrong and cls is DeltaUpstream:
        raise ConfigurationError(
            f"Upstream '{name}': {wrong} only apply to mode='timestamp'"
            + (" or to another kind:" if given is None else "")
            + ".",
            upstream=name,
            fix="set mode='timestamp' (or kind: database) or drop those settings.",
        )
    if wrong:
        raise ConfigurationError(
            f"Upstream '{name}' is a {kind} upstream; {wrong} "
            + ("does" if "," not in wrong else "do")
            + " not apply to it.",
            upstream=name,
            fix=f"remove them; a {kind} upstream takes {', '.join(sorted(allowed))}.",
        )
    if by_cursor and not settings.get("cursor"):
        raise ConfigurationError(
            f"Upstream '{name}' is read by timestamp but names no cursor column.",
            upstream=name,
            fix="give cursor='updated_at' (a timestamp or increasing id column).",
        )
    kwargs = {k: v for k, v in settings.items() if not (by_cursor and k == "mode")}
    # The settings are untyped (a YAML entry, a test spec), like plain-Python arguments:
    # the upstream checks its values when it is built.
    return cls(**kwargs)  # pyright: ignore[reportArgumentType, reportReturnType]


__all__ = ["UPSTREAM_KINDS", "AnyUpstream", "declare_upstream"]
