"""Spark helpers below both :mod:`~watermark_dagster.read` and :mod:`~watermark_dagster.write`:
quoting, the latest change per key (:mod:`.changes`), and the Delta session settings,
table opening and commit-conflict test both layers use (:mod:`.delta`)."""
