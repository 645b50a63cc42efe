"""Sizes as Spark's settings write them (``512m``, ``6g``)."""


def size_bytes(size: str) -> int:
    """The bytes of a Spark size setting with a ``k``, ``m`` or ``g`` suffix."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    return int(size[:-1]) * units[size[-1].lower()]
