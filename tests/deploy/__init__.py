"""Tests: the deploy tier (dg, the shipped Dagster instance settings, Postgres storage)."""
