"""Fixtures for memwatch's tests (helpers in mwhelpers.py)."""
from mwhelpers import lab, mw, run_memwatch  # noqa: F401  (pytest fixtures)
