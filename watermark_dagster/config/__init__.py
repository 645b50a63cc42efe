"""Configuration: the registry of upstreams and pipelines, its YAML form, and every
setting read from the environment with its one default."""
