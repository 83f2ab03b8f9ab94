"""Fixtures shared by the test modules: ``cluster``, a fresh two-worker in-process cluster."""

from tests.cluster import cluster  # noqa: F401  (registers the fixture for every test module)
