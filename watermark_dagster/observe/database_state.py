"""A database upstream's state, read on each look without a JVM.

A look asks the database for the greatest position of its table, ``(cursor, *tie_break)``,
with one query the index on those columns serves (``ORDER BY ... DESC LIMIT 1``), through
a pure-Python driver (pg8000 for PostgreSQL, PyMySQL for MariaDB and MySQL). The answer is
the upstream's source state: the coordinator plans a batch for it only when that changed
since the committed window (or when rows held back by the lag pass it), so an idle table
costs one indexed query a tick, not a run a tick.

What a cursor cannot see, this cannot either: a row deleted or written below the top
position leaves the state unchanged (docs/database-upstreams.md, "Deletes").

The query is made of the upstream's validated identifiers, quoted for the database; no
text a user wrote goes into it. The credentials are read from the environment here, at
use, and go to the driver only.
"""

from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from watermark_dagster.config.database import DRIVERS, DatabaseUpstream
from watermark_dagster.config.secrets import resolved_options
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
    return (
        f"SELECT {', '.join(columns)} FROM {upstream.quoted_table} "
        f"WHERE {columns[0]} IS NOT NULL ORDER BY {order} LIMIT 1"
    )


def database_state(upstream: DatabaseUpstream) -> str:
    """The upstream's source state: ``db:`` and its table's greatest position, or
    ``db:empty``.

    Raises:
        UpstreamUnavailableError: a credential variable is not set, or the database did not
            answer, refused the credentials, or has no such table or column (the message
            names the upstream and the reason).
    """
    credentials: dict[str, Any] = {}
    try:
        credentials = dict(
            resolved_options(
                {k: v for k, v in (("user", upstream.user), ("password", upstream.password)) if v},
                upstream.owner,
            )
            or {}
        )
        row = _fetch_top(upstream, credentials)
    except Exception as e:  # a variable not set; the drivers' errors share no base class
        raise UpstreamUnavailableError(
            f"Upstream '{upstream.name}': the database at {upstream.url} did not answer the "
            f"look at {upstream.source_table} ({type(e).__name__}: "
            f"{_without_secrets(e, credentials.values())}).",
            upstream=upstream.name,
            fix="check that the database is up and reachable from the code location, that "
            "the credential variables are set there, and that the table and its cursor "
            "columns exist; nothing is planned for it until then.",
        ) from None
    if row is None:
        return "db:empty"
    return "db:" + "|".join(_text(v) for v in row)


def _fetch_top(upstream: DatabaseUpstream, credentials: dict[str, Any]) -> Sequence[Any] | None:
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

        connection = pg8000.dbapi.connect(
            user=user or "postgres",
            password=password,
            host=host,
            port=port,
            database=database,
            timeout=CONNECT_SECONDS,
            ssl_context=True if tls else None,
        )
    else:
        import pymysql

        connection = pymysql.connect(
            user=user,
            password=password or "",
            host=host,
            port=port,
            database=database,
            connect_timeout=CONNECT_SECONDS,
            read_timeout=CONNECT_SECONDS * 3,
            ssl={} if tls else None,
        )
    try:
        cursor = connection.cursor()
        cursor.execute(top_position_query(upstream))
        return cursor.fetchone()
    finally:
        connection.close()


def _text(value: object) -> str:
    """A position value as text, the same for the same value on every look."""
    return "NULL" if value is None else str(value)


def _without_secrets(error: BaseException, secrets: Iterable[object]) -> str:
    """The driver's message on one line, shortened, with any credential masked."""
    text = str(error).replace("\n", " ")
    for secret in secrets:
        if isinstance(secret, str) and secret:
            text = text.replace(secret, "***")
    return text[:300]
