"""Tests: the store tier."""
