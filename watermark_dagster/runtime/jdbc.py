"""The JDBC drivers of database upstreams, loaded into Spark like Delta's jars.

A code location that declares a
:class:`~watermark_dagster.config.database.DatabaseUpstream` gets :data:`JDBC_DRIVERS_KEY`
in its Spark settings (:func:`spark_jdbc_settings`); the session builder then resolves
:func:`jdbc_packages` with Delta's jars through ``spark.jars.packages`` (Ivy, once) and
remembers the jar files, so later sessions start without resolving. A location without a
database upstream never loads them. The two drivers are small (2.0 MB together; resolving
them the first time took 18 s here).
"""

from collections.abc import Iterable, Mapping

JDBC_DRIVERS_KEY = "spark.watermark.jdbcDrivers"
"""A Spark setting telling the session builder to add the JDBC drivers (value ``true``)."""

# PostgreSQL's driver, and MariaDB's, which also reads MySQL servers (jdbc:mysql://).
_PACKAGES = ("org.postgresql:postgresql:42.7.14", "org.mariadb.jdbc:mariadb-java-client:3.5.11")


def jdbc_packages() -> list[str]:
    """The Maven packages of the JDBC drivers database upstreams use."""
    return list(_PACKAGES)


def needs_jdbc_jars(settings: Mapping[str, str]) -> bool:
    """Whether a session built with ``settings`` reads a database (so needs the drivers)."""
    return str(settings.get(JDBC_DRIVERS_KEY, "")).lower() == "true"


def spark_jdbc_settings(databases: Iterable[str]) -> dict[str, str]:
    """The Spark settings for a location whose database upstreams are named by
    ``databases`` (empty: none, and no settings)."""
    return {JDBC_DRIVERS_KEY: "true"} if any(True for _ in databases) else {}


__all__ = ["JDBC_DRIVERS_KEY", "jdbc_packages", "needs_jdbc_jars", "spark_jdbc_settings"]
