"""Helpers that more than one test module uses (each module here holds one concern), and the
scripts tests start as child processes (``python -m tests.support.run_pipeline``,
``python -m tests.support.first_load``). No test module imports another
(tests/unit/test_architecture.py)."""
