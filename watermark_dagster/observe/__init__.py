"""Observing upstreams: version, CDF flag, table id and schema, without a JVM."""
