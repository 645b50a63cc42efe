"""Why the coordinator plans nothing, in one place: with no batch open and its look done,
:class:`IdleReason` says what kept every upstream out of a batch. The coordinator sensor's
skip reason and ``watermark plan`` (``idle_reason`` in its JSON, the first line of its
text) are both this value's text, so the UI and the command line never disagree."""

from dataclasses import dataclass

from watermark_dagster.core.observations import RegistryObservation
from watermark_dagster.errors import ReloadHeldError, UpstreamRecreatedError


@dataclass(frozen=True)
class IdleReason:
    """What a look that plans nothing found, by upstream name (each tuple sorted).

    Attributes:
        recreated: upstreams blocked because the table was dropped and recreated.
        held: upstreams blocked because a pipeline reading them owes a reload it cannot
            have; ``held_fix`` is the first one's fix.
        unreadable: the other blocked upstreams (their next range is no longer readable).
        unavailable: upstreams that could not be observed (missing, not a table, ...) and
            are not blocked.
    """

    recreated: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    held_fix: str | None = None
    unreadable: tuple[str, ...] = ()
    unavailable: tuple[str, ...] = ()

    @classmethod
    def of(cls, look: RegistryObservation) -> "IdleReason":
        """The reason a look (:class:`RegistryObservation`) planned nothing."""
        blocked = look.blocked
        recreated = tuple(
            sorted(n for n, e in blocked.items() if isinstance(e, UpstreamRecreatedError))
        )
        held = tuple(sorted(n for n, e in blocked.items() if isinstance(e, ReloadHeldError)))
        return cls(
            recreated=recreated,
            held=held,
            held_fix=blocked[held[0]].fix if held else None,
            unreadable=tuple(sorted(set(blocked) - set(recreated) - set(held))),
            unavailable=tuple(sorted(set(look.errors) - set(blocked))),
        )

    @property
    def text(self) -> str:
        """One line: no new versions, or that nothing can be planned, and each kind of
        blocked or unavailable upstream with where its fix is."""
        parts: list[str] = []
        if self.recreated:
            parts.append(
                f"blocked, dropped and recreated: {list(self.recreated)} (see their "
                "watermark_continuity check for the fix)"
            )
        if self.held:
            parts.append(
                "blocked, a pipeline reading them owes a reload it cannot have: "
                f"{list(self.held)} ({self.held_fix})"
            )
        if self.unreadable:
            parts.append(
                f"blocked, next range no longer readable: {list(self.unreadable)} (see their "
                "watermark_continuity check for the fix)"
            )
        if self.unavailable:
            parts.append(f"unavailable: {list(self.unavailable)}")
        if not parts:
            return "no upstream has new versions"
        return "nothing can be planned; " + "; ".join(parts)
