"""Fixtures shared by the test modules: ``cluster``, a fresh two-worker in-process cluster, and
``procs``, real dispatcher, worker and client processes killed after the test; and a guard over every
test: a ``grpc.RpcError`` that reaches test code from our code untranslated fails the test, even when
the test caught it (``tests/grpc_leak_guard.py``)."""

import os

# Before anything imports grpc: gRPC's fork handlers off, as `dataservice dispatcher` has them, so the in-process
# fault-tolerant dispatchers of the tests write their checkpoints from a forked child (dispatcher.forked_writes).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from tests.cluster import cluster  # noqa: F401, E402  (registers the fixture for every test module)
from tests.processes import procs  # noqa: F401, E402
from tests.grpc_leak_guard import pytest_runtest_call  # noqa: F401, E402  (fails a test a grpc.RpcError leaked into)

# tests/containers/ builds the image and runs docker-compose.yml on a real Docker engine: `make test-containers`
# runs it (setting this variable), `make test` does not collect it.
collect_ignore = [] if os.environ.get("DATASERVICE_CONTAINER_TESTS") else ["containers"]
