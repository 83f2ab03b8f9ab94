"""An in-process test cluster: one DispatchServer and some WorkerServers on localhost.

Modelled on tf.data service's ``TestCluster``: short heartbeats and timeouts so
that tests run fast, the dispatcher restartable on the same port, workers
addable, stoppable and restartable (a restarted worker keeps its port).

Example::

    >>> with TestCluster(num_workers=2) as cluster:
    ...     ds = Dataset.range(10).apply(distribute("parallel_epochs", cluster.target))
    ...     sorted(int(x) for x in ds)

Every test module can use the ``cluster`` fixture (two workers; ``tests/conftest.py``
registers it), or build its own ``TestCluster`` when it needs another shape.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from typing import Callable, Iterator, Optional

import pytest

from dataservice import DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer

__all__ = ["TestCluster", "cluster", "wait_until", "free_port", "raw_tcp_server"]

#: Dispatcher settings that keep tests fast; a test overrides any of them by keyword.
_DISPATCHER_DEFAULTS = dict(job_gc_check_interval_ms=200, worker_timeout_ms=2_000, client_timeout_ms=10_000)
#: How long a worker retries an unreachable dispatcher per call (a restart takes well under this).
WORKER_DISPATCHER_TIMEOUT_MS = 2_000


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.01):
    """Polls ``predicate`` until it returns something truthy; AssertionError naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def run_with_deadline(fn: Callable[[], object], timeout_s: float):
    """``fn()`` on a helper thread; its result or exception, or AssertionError if it hangs."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"hung for more than {timeout_s} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def free_port() -> int:
    """A port nothing listens on right now (for a dispatcher started later, or a dead address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def raw_tcp_server(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that is not ours: ``handle(conn)`` runs for each connection, which is
    closed after it. Yields its ``host:port``; closes the listener and its thread on the way out."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                handle(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes accept(), which close() alone does not on Linux
        listener.close()
        thread.join(timeout=5)


class TestCluster:
    """A dispatcher and ``num_workers`` workers in this process; see the module docstring."""

    __test__ = False  # not a test class, despite the name

    def __init__(self, num_workers: int = 2, heartbeat_interval_ms: int = 100, **dispatcher_config_overrides):
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._dispatcher_config = DispatcherConfig(**{**_DISPATCHER_DEFAULTS, **dispatcher_config_overrides})
        self.dispatcher: Optional[DispatchServer] = None
        #: Every worker by index; a stopped one stays (stopped) so that it can be restarted on its port.
        self.workers: list[WorkerServer] = []
        try:
            self.dispatcher = DispatchServer(self._dispatcher_config)
            # Later restarts must come back on the port workers and clients already use.
            self._dispatcher_config = dataclasses.replace(self._dispatcher_config, port=self.dispatcher.port)
            for _ in range(num_workers):
                self.add_worker()
            self.wait_for_workers(num_workers)
        except BaseException:
            self.stop()
            raise

    # --- addresses ---------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._dispatcher_config.port

    @property
    def target(self) -> str:
        """``grpc://localhost:PORT``, valid across dispatcher restarts."""
        return f"grpc://localhost:{self.port}"

    @property
    def dispatcher_address(self) -> str:
        return f"localhost:{self.port}"

    # --- the dispatcher ----------------------------------------------------------------
    def stop_dispatcher(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.dispatcher = None

    def start_dispatcher(self) -> DispatchServer:
        """Starts a new dispatcher (empty state unless fault tolerant) on the cluster's port."""
        if self.dispatcher is None:
            self.dispatcher = DispatchServer(self._dispatcher_config)
        return self.dispatcher

    def restart_dispatcher(self) -> DispatchServer:
        """Stops the dispatcher and starts a new one on the same port with the same config."""
        self.stop_dispatcher()
        return self.start_dispatcher()

    def num_registered_workers(self) -> int:
        if self.dispatcher is None:
            return 0
        core = self.dispatcher.core
        with core._cond:  # the core's lock: read a consistent state
            return len(core.state.workers)

    def wait_for_workers(self, n: int, timeout_s: float = 10.0) -> None:
        """Waits until the dispatcher knows at least ``n`` workers."""
        wait_until(lambda: self.num_registered_workers() >= n, timeout_s, f"{n} workers to register")

    # --- workers -----------------------------------------------------------------------
    def worker_config(self, port: int = 0, **overrides) -> WorkerConfig:
        settings = dict(dispatcher_address=self.dispatcher_address, port=port,
                        heartbeat_interval_ms=self.heartbeat_interval_ms,
                        dispatcher_timeout_ms=WORKER_DISPATCHER_TIMEOUT_MS)
        settings.update(overrides)
        return WorkerConfig(**settings)

    def add_worker(self, **config_overrides) -> WorkerServer:
        """Starts one more worker; it registers with the dispatcher as it starts."""
        worker = WorkerServer(self.worker_config(**config_overrides))
        self.workers.append(worker)
        return worker

    def stop_worker(self, index: int) -> None:
        """Stops worker ``index``; it stays in ``workers`` (stopped) and can be restarted."""
        self.workers[index].stop()

    def restart_worker(self, index: int) -> WorkerServer:
        """Stops worker ``index`` (if running) and starts a new worker on the same port."""
        old = self.workers[index]
        self.stop_worker(index)
        self.workers[index] = WorkerServer(dataclasses.replace(old.config, port=old.port))
        return self.workers[index]

    # --- lifecycle ---------------------------------------------------------------------
    def stop(self) -> None:
        """Stops every worker, then the dispatcher; safe to call twice."""
        failures = []
        for worker in self.workers:
            try:
                worker.stop()  # idempotent
            except Exception as exc:  # stop the others and the dispatcher all the same
                failures.append(exc)
        self.stop_dispatcher()
        if failures:
            raise failures[0]

    def __enter__(self) -> "TestCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture
def cluster():
    """A fresh two-worker cluster, stopped after the test."""
    test_cluster = TestCluster(num_workers=2)
    try:
        yield test_cluster
    finally:
        test_cluster.stop()
