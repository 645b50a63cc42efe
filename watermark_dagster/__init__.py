"""watermark-dagster."""
