"""Tests: the unit tier."""
