"""Where pipelines run: the Spark session (local, cluster or Spark Connect) and the resident
engine that keeps one warm for every run.

Kept apart from ``operations`` because it is infrastructure the adapters choose, not a use
case: an operation receives a Spark session and never builds one."""
