"""Where pipelines run: the Spark session (local, cluster or Spark Connect) and the home's
engine, a local Spark Connect server every run uses.

Kept apart from ``operations`` because it is infrastructure the adapters choose, not a use
case: an operation receives a Spark session and never builds one."""
