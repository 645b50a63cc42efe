"""The pure core: ranges and planning rules, with no Dagster, Spark or delta-rs imports."""
