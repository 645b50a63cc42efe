"""The Dagster adapters: resources, assets, sensors and the definitions builder."""
