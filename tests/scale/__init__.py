"""Tests: the scale tier (real servers on loopback)."""
