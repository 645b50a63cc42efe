"""A database table as an upstream: read through Spark's JDBC source by a cursor column.

A :class:`DatabaseUpstream` is a :class:`~watermark_dagster.config.upstream.CursorUpstream`
whose rows live in PostgreSQL or MariaDB/MySQL instead of a folder: the same windows
(``start < (cursor, *tie_break) <= end``), lag and late-row rules, and its own settings for
the connection. The window is filtered on the raw cursor column against typed literals, so
Spark hands it to the database as a ``WHERE`` clause that an index on the cursor serves;
no SQL text is ever built from a setting (the table's name is validated and quoted).

Credentials are environment references only (``{env: VARIABLE}``), read when Spark opens
the connection: neither the name's value nor the secret is stored by Dagster.

Example:
    >>> orders = DatabaseUpstream(
    ...     name="orders_db", url="jdbc:postgresql://db.internal:5432/shop",
    ...     source_table="public.orders", cursor="updated_at", tie_break=["id"],
    ...     user=EnvRef("SHOP_DB_USER"), password=EnvRef("SHOP_DB_PASSWORD"))
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args
from urllib.parse import parse_qsl, urlsplit

from watermark_dagster.config.options import Kind, written_as
from watermark_dagster.config.secrets import EnvRef, StorageOptions, as_reference
from watermark_dagster.config.upstream import CursorUpstream
from watermark_dagster.errors import ConfigurationError

# The databases whose drivers the Spark session loads, by the JDBC URL's sub-protocol, each
# with its driver class and how it quotes an identifier.
DRIVERS: Mapping[str, tuple[str, str]] = {
    "postgresql": ("org.postgresql.Driver", '"'),
    "mariadb": ("org.mariadb.jdbc.Driver", "`"),
    "mysql": ("org.mariadb.jdbc.Driver", "`"),
}
NullCursor = Literal["fail", "skip"]
NULL_CURSOR_CHOICES: tuple[str, ...] = get_args(NullCursor)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# URL parameters (and user-info) that would carry a credential into Dagster's storage.
_CREDENTIAL_PARAMETERS = re.compile(r"^(user|password|passwd|pwd|sslpassword|sslkey)$", re.I)


@dataclass(frozen=True, kw_only=True)
class DatabaseUpstream(CursorUpstream):
    """A database table read through Spark's JDBC source in windows of a cursor column.

    Args:
        url: the JDBC URL, ``jdbc:postgresql://host:5432/db`` or
            ``jdbc:mariadb://host:3306/db`` (``jdbc:mysql://`` is read by the MariaDB
            driver); no user or password inside it.
        source_table: the table in the database, ``schema.table`` (or ``table``), each part
            letters, digits and underscores; it is quoted for the database.
        user: the database user as ``{env: VARIABLE}`` (``EnvRef("VARIABLE")`` in Python).
        password: the password as ``{env: VARIABLE}``, never as text.
        fetch_size: rows the driver fetches per round trip (JDBC ``fetchsize``).
        partitions: read each window in this many parallel ranges of the cursor column
            (JDBC ``partitionColumn``/bounds); 1 reads it in one query.
        soft_delete: a boolean column that marks a row deleted: such rows become deletes
            in the changes, and leave the snapshot.
        reconcile_every: every this many batches, the extraction pipeline
            (:func:`~watermark_dagster.read.extraction.extraction_stage`) also deletes
            the keys its target holds that the table no longer has (hard deletes).
        null_cursor: what rows whose cursor is NULL (in no window) do: ``fail`` (default)
            blocks the upstream while any exist, ``skip`` counts and shows them and loads
            nothing for them.

    The cursor settings (``cursor``, ``tie_break``, ``lag_seconds``, ``start_from``) are
    those of :class:`~watermark_dagster.config.upstream.CursorUpstream` (``lag_seconds``
    only for a timestamp cursor: the first look refuses it on another); ``path``,
    ``table``, ``format``, ``read_options``, ``storage_options`` and ``cursor_fallback`` do
    not apply.
    """

    # The cursor settings that do not apply: no longer settings (no ``written_as``).
    path: str = ""
    table: str | None = None
    storage_options: StorageOptions | None = None
    format: str = "jdbc"
    read_options: Mapping[str, str] | None = None
    cursor_fallback: str | None = None

    url: str = field(
        metadata=written_as(Kind.TEXT, shape="text (jdbc:postgresql://... or jdbc:mariadb://...)")
    )
    source_table: str = field(
        metadata=written_as(Kind.TEXT, shape="text (schema.table in the database)")
    )
    user: EnvRef | None = field(default=None, metadata=written_as(Kind.SECRET))
    password: EnvRef | None = field(default=None, metadata=written_as(Kind.SECRET))
    fetch_size: int = field(default=10_000, metadata=written_as(Kind.WHOLE))
    partitions: int = field(default=1, metadata=written_as(Kind.WHOLE))
    soft_delete: str | None = field(default=None, metadata=written_as(Kind.COLUMN))
    reconcile_every: int | None = field(
        default=None, metadata=written_as(Kind.WHOLE, shape="a whole number of batches")
    )
    null_cursor: NullCursor = field(default="fail", metadata=written_as(Kind.CHOICE))

    def __post_init__(self) -> None:
        owner = f"Upstream '{self.name}'"
        located = f"{self.url}#{self.source_table}"
        for what, given in (
            ("path", self.path),
            ("table", self.table),
            ("storage_options", self.storage_options),
            ("read_options", self.read_options),
            ("cursor_fallback", self.cursor_fallback),
        ):
            if given and not (what == "path" and given == located):
                raise ConfigurationError(
                    f"{owner} is read from a database; {what}={given!r} does not apply.",
                    upstream=self.name,
                    fix=f"remove {what}: the table is named by url and source_table"
                    + (
                        " (a cursor fallback would hide the cursor from the database's index)."
                        if what == "cursor_fallback"
                        else "."
                    ),
                )
        if self.format != "jdbc":
            raise ConfigurationError(
                f"{owner} is read through JDBC; format={self.format!r} does not apply.",
                upstream=self.name,
                fix="remove format.",
            )
        set_ = object.__setattr__
        set_(self, "path", located)
        super().__post_init__()
        check_url(owner, self.name, self.url)
        # Declarations come from plain Python and YAML: the annotation is not enforced.
        named = self.source_table
        parts = named.split(".") if isinstance(named, str) else [str(named), "?"]  # pyright: ignore[reportUnnecessaryIsInstance]
        if len(parts) > 2 or not all(_IDENTIFIER.match(p) for p in parts):
            raise ConfigurationError(
                f"{owner}: source_table {self.source_table!r} is not schema.table of plain "
                "identifiers (letters, digits and underscores).",
                upstream=self.name,
                fix="name the table so, e.g. source_table: public.orders (each part is quoted "
                "for the database).",
            )
        for what in ("user", "password"):
            set_(self, what, _secret(owner, self.name, what, getattr(self, what)))
        for what, least in (("fetch_size", 1), ("partitions", 1), ("reconcile_every", 1)):
            value = getattr(self, what)
            if value is None and what == "reconcile_every":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigurationError(
                    f"{owner}: {what} must be a whole number >= {least}, got {value!r}.",
                    upstream=self.name,
                    fix=f"set {what} to {least} or more"
                    + (
                        ", or leave it out to never reconcile."
                        if what == "reconcile_every"
                        else "."
                    ),
                )
        if self.null_cursor not in NULL_CURSOR_CHOICES:
            raise ConfigurationError(
                f"{owner}: null_cursor must be fail or skip, got {self.null_cursor!r}.",
                upstream=self.name,
                fix="set null_cursor: fail (block while rows have no cursor value) or "
                "null_cursor: skip (count them, load nothing for them).",
            )
        if self.soft_delete is not None and not _IDENTIFIER.match(str(self.soft_delete)):
            raise ConfigurationError(
                f"{owner}: soft_delete {self.soft_delete!r} is not a column name.",
                upstream=self.name,
                fix="rename the column to letters, digits and underscores, or leave "
                "soft_delete out.",
            )

    @property
    def database(self) -> str:
        """The URL's sub-protocol: ``postgresql``, ``mariadb`` or ``mysql``."""
        return self.url.split(":", 2)[1].lower()

    @property
    def driver(self) -> str:
        """The JDBC driver class Spark loads for the URL."""
        return DRIVERS[self.database][0]

    @property
    def quoted_table(self) -> str:
        """``source_table`` with each (validated) part quoted for the database."""
        quote = DRIVERS[self.database][1]
        return ".".join(f"{quote}{part}{quote}" for part in self.source_table.split("."))

    @property
    def columns_read(self) -> Sequence[str]:
        """The columns a window's end is pinned from: the cursor, then the tie-break keys."""
        return (self.cursor, *self.tie_break)


def check_url(owner: str, name: str, url: object) -> None:
    """Refuse a JDBC URL of another database, or one carrying a credential.

    Raises:
        ConfigurationError: naming the upstream, the URL (a credential in it masked) and
            the fix.
    """
    supported = ", ".join(f"jdbc:{d}://" for d in DRIVERS)
    if not isinstance(url, str) or not re.match(r"^jdbc:[a-z]+://", url, re.I):
        raise ConfigurationError(
            f"{owner}: url {url!r} is not a JDBC URL.",
            upstream=name,
            fix=f"give e.g. jdbc:postgresql://host:5432/db ({supported}).",
        )
    database = url.split(":", 2)[1].lower()
    if database not in DRIVERS:
        raise ConfigurationError(
            f"{owner}: url {url!r} is for {database}, which has no driver here.",
            upstream=name,
            fix=f"use one of {supported}.",
        )
    parts = urlsplit(url.removeprefix("jdbc:"))
    query = [k for k, _ in parse_qsl(parts.query.replace(";", "&"))]
    query += [p.split("=", 1)[0] for p in parts.path.split(";")[1:]]
    if "@" in parts.netloc or any(_CREDENTIAL_PARAMETERS.match(k) for k in query):
        shown = re.sub(r"//[^/@]*@", "//***@", url)
        shown = re.sub(
            r"(?i)((?:password|passwd|pwd|user|sslpassword|sslkey)=)[^&;]*", r"\1***", shown
        )
        raise ConfigurationError(
            f"{owner}: url {shown!r} carries a user or password; Dagster would store it in "
            "its run records and show it in the UI.",
            upstream=name,
            fix="remove them from the url and give user: {env: DB_USER} and "
            "password: {env: DB_PASSWORD} (EnvRef('DB_PASSWORD') in Python).",
        )


def _kind_of(value: object) -> str:
    """What a value is, without showing it (it may be the credential)."""
    return "text" if isinstance(value, str) else f"a {type(value).__name__}"


def _secret(owner: str, name: str, what: str, value: object) -> EnvRef | None:
    """``value`` as an environment reference; text is refused."""
    if value is None:
        return None
    reference = as_reference(value)
    if reference is None:
        raise ConfigurationError(
            f"{owner}: {what} is given as {_kind_of(value)}; "
            "a database credential is only read from the environment, so Dagster never "
            "stores it.",
            upstream=name,
            fix=f"write {what}: {{env: DB_{what.upper()}}} (EnvRef('DB_{what.upper()}') in "
            "Python) and set that variable where the code location and its runs start.",
        )
    return reference


__all__ = ["DRIVERS", "NULL_CURSOR_CHOICES", "DatabaseUpstream", "NullCursor", "check_url"]
