"""Helpers that more than one test module uses (each module here holds one concern)."""
