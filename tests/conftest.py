"""Fixtures shared by the test modules: ``cluster``, a fresh two-worker in-process cluster, and
``procs``, real dispatcher, worker and client processes killed after the test."""

from tests.cluster import cluster  # noqa: F401  (registers the fixture for every test module)
from tests.processes import procs  # noqa: F401
