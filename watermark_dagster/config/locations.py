"""Where a declared location is: one rule for every path the configuration accepts.

A location with a scheme (``s3a://bucket/t``, ``abfss://...``, ``file:///lake/t``,
``file:/lake/t``) is kept as written. A local path is made absolute once, when it is
declared: ``~`` is expanded and a relative path is taken from ``base``, the registry file's
folder for YAML, or the current folder when a Python code location declares it. Every
process that loads the code location then names the same table, and nothing downstream
(Spark's ``delta.`path```, the control tables, the file log) sees a relative path.

Example:
    >>> absolute_location("s3a://lake/orders")
    's3a://lake/orders'
    >>> absolute_location("orders", Path("/lake"))
    '/lake/orders'
"""

import os
import re
from pathlib import Path

# ``scheme:`` as RFC 3986 spells it; two letters or more, so a drive letter is a path.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def absolute_location(value: str, base: Path | None = None) -> str:
    """``value`` as an absolute local path (from ``base``, else the current folder), or as
    written when it is a URI; surrounding spaces are kept out."""
    text = value.strip()
    if _SCHEME.match(text):
        return text
    path = Path(os.path.expanduser(text))
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    return os.path.normpath(path)
