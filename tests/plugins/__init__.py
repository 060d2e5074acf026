"""Fixtures shared across test folders, registered once by tests/conftest.py (pytest_plugins)."""
