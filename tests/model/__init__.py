"""Tests: the model tier."""
