"""Tests: the spark tier."""
