"""Fixtures for memwatch's tests (helpers in mwhelpers.py)."""
# Importing the fixtures registers them with pytest for every test of this folder.
from mwhelpers import lab, mw, run_memwatch  # noqa: F401  pylint: disable=unused-import
