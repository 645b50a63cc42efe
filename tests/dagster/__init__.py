"""Tests: the dagster tier."""
