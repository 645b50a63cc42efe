"""Writing pipeline targets idempotently."""
