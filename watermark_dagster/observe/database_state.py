"""A database upstream's state, read on each look without a JVM.

A look asks the database for the greatest position of its table, ``(cursor, *tie_break)``,
with one query the index on those columns serves (``ORDER BY ... DESC LIMIT 1``), through
a pure-Python driver (pg8000 for PostgreSQL, PyMySQL for MariaDB and MySQL). The answer is
the upstream's source state: the coordinator plans a batch for it only when that changed
since the committed window (or when rows held back by the lag pass it), so an idle table
costs one indexed query a tick, not a run a tick.

The same look counts the rows whose cursor is NULL (in no window: under ``null_cursor:
fail`` they block the upstream) and reads the table's columns from the database's catalog
(name, full type, nullability), which each batch records as the upstream's schema
fingerprint, compared by the next (:mod:`watermark_dagster.read.database_schema`).

What a cursor cannot see, this cannot either: a row deleted or written below the top
position leaves the state unchanged (docs/database-upstreams.md, "Deletes").

The queries are made of the upstream's validated identifiers, quoted for the database
(the catalog's takes the table's name as a bound parameter); no text a user wrote goes
into them. The credentials are read from the environment here, at
use, and go to the driver only.
"""

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

from watermark_dagster.config.database import DRIVERS, DatabaseUpstream
from watermark_dagster.config.secrets import resolved_options
from watermark_dagster.config.warehouse import PostgresTarget
from watermark_dagster.errors import UpstreamUnavailableError

CONNECT_SECONDS = 10
"""How long a look waits for the database to answer before the upstream is unavailable."""

_DEFAULT_PORTS = {"postgresql": 5432, "mariadb": 3306, "mysql": 3306}
_TLS = {"require", "verify-ca", "verify-full", "true"}


def top_position_query(upstream: DatabaseUpstream) -> str:
    """The query of the table's greatest ``(cursor, *tie_break)`` position, from validated
    identifiers quoted for the database."""
    quote = DRIVERS[upstream.database][1]
    columns = [f"{quote}{c}{quote}" for c in upstream.columns_read]
    order = ", ".join(f"{c} DESC" for c in columns)
    # A row with a NULL in its position is in no window (counted apart): never the top.
    present = " AND ".join(f"{c} IS NOT NULL" for c in columns)
    return (
        f"SELECT {', '.join(columns)} FROM {upstream.quoted_table} "
        f"WHERE {present} ORDER BY {order} LIMIT 1"
    )


@dataclass(frozen=True)
class DatabaseLook:
    """What one look at a database table found.

    Attributes:
        state: ``db:`` and its greatest position, or ``db:empty``.
        without_cursor: rows whose cursor is NULL, in no window.
        columns: each column as the database's catalog reports it: (name, type, nullable),
            in the table's order.
    """

    state: str
    without_cursor: int
    columns: tuple[tuple[str, str, bool], ...]

    @property
    def fingerprint(self) -> str:
        """:attr:`columns` as text (what a batch records, and the next one compares)."""
        return columns_fingerprint(self.columns)


def columns_fingerprint(columns: Iterable[tuple[str, str, bool]]) -> str:
    """Columns as the text a batch records as its upstream's schema fingerprint."""
    return json.dumps([[n, t, bool(nullable)] for n, t, nullable in columns])


def fingerprint_columns(fingerprint: str | None) -> dict[str, tuple[str, bool]] | None:
    """Name -> (type, nullable) of a recorded fingerprint (None: none, or not a database's)."""
    if not fingerprint or not fingerprint.startswith("["):
        return None
    try:
        found = json.loads(fingerprint)
        return {str(n): (str(t), bool(nullable)) for n, t, nullable in found}
    except (ValueError, TypeError):
        return None


def database_state(upstream: DatabaseUpstream) -> str:
    """The upstream's source state: ``db:`` and its table's greatest position, or
    ``db:empty`` (see :func:`look_at`)."""
    return look_at(upstream).state


def look_at(upstream: DatabaseUpstream, *, refuse: bool = True) -> DatabaseLook:
    """One look at the table: its greatest position, its rows without a cursor value and
    its columns.

    Args:
        upstream: the database upstream.
        refuse: raise when the look finds rows without a cursor value (under
            ``null_cursor: fail``) or a lag on a cursor that is not a timestamp.

    Raises:
        UpstreamUnavailableError: a credential variable is not set, or the database did not
            answer, refused the credentials, or has no such table or column (the message
            names the upstream and the reason); with ``refuse``, rows have no cursor value
            under ``null_cursor: fail``, or ``lag_seconds`` is set on a cursor that is not a
            timestamp.
    """
    credentials: dict[str, Any] = {}
    try:
        credentials = credentials_of(upstream)
        row, without, columns = _fetch(upstream, credentials)
    except Exception as e:  # a variable not set; the drivers' errors share no base class
        raise UpstreamUnavailableError(
            f"Upstream '{upstream.name}': the database at {upstream.url} did not answer the "
            f"look at {upstream.source_table} ({driver_message(e, credentials.values())}).",
            upstream=upstream.name,
            fix="check that the database is up and reachable from the code location, that "
            "the credential variables are set there, and that the table and its cursor "
            "columns exist; nothing is planned for it until then.",
        ) from None
    state = "db:empty" if row is None else "db:" + "|".join(_text(v) for v in row)
    look = DatabaseLook(state, without, columns)
    if refuse:
        refuse_look(upstream, look)
    return look


def refuse_look(upstream: DatabaseUpstream, look: DatabaseLook) -> None:
    """Block the upstream for what its look found that no batch may read past.

    Raises:
        UpstreamUnavailableError: rows without a cursor value under ``null_cursor: fail``,
            or ``lag_seconds`` on a cursor column that is not a timestamp, a date or an
            integer.
    """
    types = {n: t for n, t, _ in look.columns}
    cursor_type = types.get(upstream.cursor)
    if upstream.lag_seconds and cursor_type is not None and not lag_applies(cursor_type):
        raise UpstreamUnavailableError(
            f"Upstream '{upstream.name}': lag_seconds={upstream.lag_seconds:g} applies to a "
            f"timestamp, date or integer cursor only; {upstream.source_table}."
            f"{upstream.cursor} is {cursor_type}, where a lag has no meaning.",
            upstream=upstream.name,
            fix="remove lag_seconds (a row written late below the committed position is "
            "missed: see docs/database-upstreams.md, late rows), or read the table by a "
            "timestamp, date or integer cursor.",
        )
    if look.without_cursor and upstream.null_cursor == "fail":
        raise UpstreamUnavailableError(
            null_cursor_message(upstream, look.without_cursor),
            upstream=upstream.name,
            fix=null_cursor_fix(upstream),
        )


def null_cursor_message(upstream: DatabaseUpstream, count: int) -> str:
    """What an upstream blocked by rows without a cursor value says."""
    return (
        f"Upstream '{upstream.name}': {count} row(s) of {upstream.source_table} have "
        f"{_position_names(upstream)} NULL; no window can read them (null_cursor: fail), "
        "so nothing is planned for it."
    )


def _position_names(upstream: DatabaseUpstream) -> str:
    """The columns of a position, for messages: ``updated_at`` or ``updated_at or id``."""
    return " or ".join([upstream.cursor, *upstream.tie_break])


def null_cursor_fix(upstream: DatabaseUpstream) -> str:
    """The fix of rows without a cursor value under ``null_cursor: fail``."""
    return (
        f"give those rows a {upstream.cursor} value after the committed position (see "
        f"`watermark get -t {upstream.name}`; the current time is): they then load, while "
        "a value at or below it, such as the rows' old one, is in no window and never "
        "loads. Or set null_cursor: skip on the upstream to load the other rows without them."
    )


_INTEGER = re.compile(r"^((big|small|tiny|medium)?int(eger)?|(big|small)?serial)\b", re.I)


def is_integer_type(type_name: str) -> bool:
    """Whether a catalog type name is an integer (PostgreSQL's ``bigint``, ``integer``,
    ``smallint``; MariaDB's ``bigint(20)``, ``int(11) unsigned``, ...)."""
    return bool(_INTEGER.match(type_name.strip()))


def lag_applies(type_name: str) -> bool:
    """Whether ``lag_seconds`` has a meaning on a cursor of this catalog type: a timestamp,
    a date or an integer (docs/database-upstreams.md, late rows)."""
    return (
        is_timestamp_type(type_name)
        or type_name.strip().lower() == "date"
        or is_integer_type(type_name)
    )


def is_timestamp_type(type_name: str) -> bool:
    """Whether a catalog type name is a timestamp (PostgreSQL's ``timestamp...``,
    MariaDB's ``datetime``/``timestamp``)."""
    return type_name.lower().startswith(("timestamp", "datetime"))


def credentials_of(upstream: DatabaseUpstream) -> dict[str, Any]:
    """The upstream's user and password, read from the environment now.

    Raises:
        ConfigurationError: a referenced variable is not set.
    """
    found = resolved_options(
        {k: v for k, v in (("user", upstream.user), ("password", upstream.password)) if v},
        upstream.owner,
    )
    return dict(found or {})


def _fetch(
    upstream: DatabaseUpstream, credentials: dict[str, Any]
) -> tuple[Sequence[Any] | None, int, tuple[tuple[str, str, bool], ...]]:
    """The top position, the count of rows without a cursor value and the columns, over
    one connection."""
    connection = connect(upstream, credentials)
    try:
        cursor = connection.cursor()
        query, params = columns_query(upstream)
        cursor.execute(query, params)
        columns = tuple((str(n), str(t), _yes(v)) for n, t, v in cursor.fetchall())
        cursor.execute(top_position_query(upstream))
        top = cursor.fetchone()
        if top is not None:
            top = _first_of_equals(cursor, upstream, columns, top)
        # A tie-break column the catalog declares NOT NULL (a primary key) is not counted.
        nullable = {n for n, _, may_be_null in columns if may_be_null}
        cursor.execute(null_cursor_query(upstream, nullable))
        counted = cursor.fetchone()
        return top, int(counted[0] if counted else 0), columns
    finally:
        connection.close()


def is_text_type(type_name: str) -> bool:
    """Whether a catalog type name is text, compared by a collation (PostgreSQL's ``text``,
    ``character varying``, ``character``, ``citext``; MariaDB's ``varchar``, ``char``,
    ``*text``)."""
    name = type_name.lower()
    return name.startswith(("text", "character", "varchar", "char", "citext")) or (
        name.endswith("text")
    )


def _first_of_equals(
    cursor: Any,
    upstream: DatabaseUpstream,
    columns: Sequence[tuple[str, str, bool]],
    top: Sequence[Any],
) -> Sequence[Any]:
    """The same one of the rows tied at the top position under the database's collation
    on every look (by their bytes), so that a case-insensitive tie (``'a'`` and ``'A'``)
    does not make the state change from look to look, and plan empty batches for ever.
    Only for a position with a text column; served by the index's equality prefix."""
    types = {n: t for n, t, _ in columns}
    texts = [c for c in upstream.columns_read if is_text_type(types.get(c, ""))]
    if not texts:
        return top
    quote = DRIVERS[upstream.database][1]
    names = [f"{quote}{c}{quote}" for c in upstream.columns_read]
    equal = " AND ".join(f"{c} = %s" for c in names)
    as_bytes = (
        (lambda c: f'{c} COLLATE "C"')
        if upstream.database == "postgresql"
        else (lambda c: f"CAST({c} AS BINARY)")
    )
    order = ", ".join(f"{as_bytes(f'{quote}{c}{quote}')} DESC" for c in texts)
    cursor.execute(
        f"SELECT {', '.join(names)} FROM {upstream.quoted_table} WHERE {equal} "
        f"ORDER BY {order} LIMIT 1",
        tuple(top),
    )
    return cursor.fetchone() or top


def columns_of(upstream: DatabaseUpstream) -> tuple[tuple[str, str, bool], ...]:
    """The table's columns now (see :class:`DatabaseLook`), without refusing anything.

    Raises:
        UpstreamUnavailableError: as :func:`look_at`.
    """
    return look_at(upstream, refuse=False).columns


def _yes(value: object) -> bool:
    return value is True or str(value).upper() in ("YES", "TRUE", "T", "1")


def null_cursor_query(upstream: DatabaseUpstream, nullable: Collection[str] | None = None) -> str:
    """The count of the rows without a position (the cursor or a tie-break column NULL:
    such a row compares to nothing, so no window holds it), from validated quoted
    identifiers. Tie-break columns outside ``nullable`` (declared NOT NULL; None: all may
    be NULL) are left out, so for the usual primary-key tie-break an index on the cursor
    serves it."""
    quote = DRIVERS[upstream.database][1]
    columns = [upstream.cursor] + [
        c for c in upstream.tie_break if nullable is None or c in nullable
    ]
    missing = " OR ".join(f"{quote}{c}{quote} IS NULL" for c in columns)
    return f"SELECT count(*) FROM {upstream.quoted_table} WHERE {missing}"


def columns_query(upstream: DatabaseUpstream) -> tuple[str, tuple[str, ...]]:
    """The catalog query of the table's columns (name, full type, nullable) and its bound
    parameters: no identifier is pasted into it."""
    parts = upstream.source_table.split(".")
    if upstream.database == "postgresql":
        return (
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull "
            "FROM pg_catalog.pg_attribute a WHERE a.attrelid = to_regclass(%s) "
            "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (upstream.quoted_table,),
        )
    schema = "%s" if len(parts) == 2 else "DATABASE()"
    return (
        "SELECT column_name, column_type, is_nullable FROM information_schema.columns "
        f"WHERE table_schema = {schema} AND table_name = %s ORDER BY ordinal_position",
        tuple(parts),
    )


def connect(
    upstream: "DatabaseUpstream | PostgresTarget",
    credentials: dict[str, Any],
    *,
    timeout: float = CONNECT_SECONDS,
) -> Any:
    """A DB-API connection to the upstream's (or a warehouse target's) database whose
    session is in UTC (MariaDB's
    ``TIMESTAMP`` values are shown in the session's zone; windows are UTC whatever the
    host's zone, docs/reliability.md)."""
    parts = urlsplit(upstream.url[len("jdbc:") :])
    params = {k.lower(): v.lower() for k, v in parse_qsl(parts.query)}
    tls = bool(_TLS & {params.get("sslmode", ""), params.get("ssl", ""), params.get("usessl", "")})
    host = parts.hostname or "localhost"
    port = parts.port or _DEFAULT_PORTS[upstream.database]
    database = unquote(parts.path.lstrip("/").split(";")[0]) or None
    user = credentials.get("user")
    password = credentials.get("password")
    if upstream.database == "postgresql":
        import pg8000.dbapi

        return pg8000.dbapi.connect(
            user=user or "postgres",
            password=password,
            host=host,
            port=port,
            database=database,
            timeout=timeout,
            ssl_context=True if tls else None,
            startup_params={"TimeZone": "UTC"},
        )
    import pymysql

    return pymysql.connect(
        user=user,
        password=password or "",
        host=host,
        port=port,
        database=database,
        connect_timeout=CONNECT_SECONDS,
        read_timeout=CONNECT_SECONDS * 3,
        ssl={} if tls else None,
        init_command="SET time_zone = '+00:00'",
    )


def _text(value: object) -> str:
    """A position value as text, the same for the same value on every look."""
    return "NULL" if value is None else str(value)


def driver_message(error: BaseException, secrets: Iterable[object] = ()) -> str:
    """A driver's error as a sentence: PostgreSQL's as ``SEVERITY SQLSTATE: message``
    (pg8000 carries the server's fields as a mapping), MariaDB's as ``code: message``,
    others as ``Type: message``; on one line, shortened, with any credential masked."""
    fields = error.args[0] if error.args else None
    if isinstance(fields, Mapping) and "M" in fields:
        found = cast("Mapping[str, object]", fields)
        head = " ".join(str(found[k]) for k in ("S", "C") if found.get(k))
        text = f"{head}: {found['M']}" if head else str(found["M"])
        if found.get("D"):
            text += f" ({found['D']})"
    elif len(error.args) == 2 and isinstance(error.args[0], int):
        text = f"{type(error).__name__} {error.args[0]}: {error.args[1]}"
    else:
        text = f"{type(error).__name__}: {error}"
    return _without_secrets(text, secrets)


def _without_secrets(text: str, secrets: Iterable[object]) -> str:
    """A message on one line, shortened, with any credential masked."""
    text = text.replace("\n", " ")
    for secret in secrets:
        if isinstance(secret, str) and secret:
            text = text.replace(secret, "***")
    return text[:300]
