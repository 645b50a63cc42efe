"""Tests: the bench tier."""
