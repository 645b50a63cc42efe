"""Tests: the crash tier."""
