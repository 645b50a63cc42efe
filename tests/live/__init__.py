"""Tests: the live tier."""
