"""Reading a batch's pinned inputs with Spark."""
