"""A dispatcher that cannot be reached is said at once, never waited on in silence (issue 25).

A client (``distribute``, ``from_dataset_id``, ``register_dataset``) given a dispatcher address
that refuses connections or does not resolve logs a warning within 5 s naming the address, the
cause and ``dataservice status --dispatcher ADDRESS``; it keeps trying until ``timeout_ms`` (not
a second more, not one less) and then raises ``errors.ServiceUnavailableError`` saying how long
it tried and why, with no gRPC exception dump in its traceback. Something that accepts
connections and closes them at once fails the client within 15 s whatever its ``timeout_ms``.
A worker whose dispatcher cannot be reached says so within 5 s of starting and again at a
bounded rate; one that registers says so in one line.

Real servers and sockets on 127.0.0.1 (``TestCluster``, tiny socket servers); the ``slow`` test
starts a real ``dataservice worker`` process (tests/processes.py). Every call runs under a
deadline (``run_with_deadline``), so a regression fails instead of hanging.

Example::

    $ .venv/bin/python -m pytest tests/test_unreachable_dispatcher.py -q
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
import traceback
from typing import Callable, Iterator

import grpc
import pytest

import dataservice as ds
from dataservice import errors
from dataservice.service import dispatcher_client
from dataservice.service.dispatcher_client import CLOSED_VERDICT_S, DispatcherClient
from dataservice.service.endpoint_probe import EndpointKind, probe_endpoint
from tests.cluster import free_port, raw_tcp_server, run_with_deadline, wait_until
from tests.processes import assert_clean_exit

#: The clients' timeout_ms where the test waits it out: long enough for the warning to come first.
TIMEOUT_MS = 4_000
#: How late after timeout_ms a client may give up (its last try, on a loaded machine).
LATE_S = 1.5
#: The issue's bound on the warning: within 5 s of the first failed call.
WARN_WITHIN_S = 5.0
#: A host name that never resolves (RFC 6761), at once on this machine.
UNRESOLVABLE = "nonexistent.invalid:5050"


class Records(logging.Handler):
    """The records of one logger at ``level`` and above, with the monotonic time each came (tests wait
    for one with ``wait_until``'s deadline, never a sleep)."""

    def __init__(self, logger: str, level: int = logging.WARNING):
        super().__init__(level)
        self.logger = logging.getLogger(logger)
        self.seen: list[tuple[float, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((time.monotonic(), record))

    def messages(self, containing: str = "") -> list[str]:
        return [r.getMessage() for _, r in self.seen if containing in r.getMessage()]

    def times(self, containing: str) -> list[float]:
        return [t for t, r in self.seen if containing in r.getMessage()]

    def __enter__(self) -> "Records":
        self._old_level = self.logger.level
        if self.logger.getEffectiveLevel() > self.level:
            self.logger.setLevel(self.level)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._old_level)


# --- a client ----------------------------------------------------------------------------------

def _distribute(address: str, timeout_ms: int) -> None:
    list(ds.Dataset.range(3).apply(ds.distribute("parallel_epochs", address, timeout_ms=timeout_ms)))


def _register(address: str, timeout_ms: int) -> None:
    ds.register_dataset(address, ds.Dataset.range(3), timeout_ms=timeout_ms)


def _from_dataset_id(address: str, timeout_ms: int) -> None:
    spec = ds.Dataset.range(3).element_spec  # given: the dataset is not asked for it at construction
    list(ds.from_dataset_id("parallel_epochs", address, 1, element_spec=spec, timeout_ms=timeout_ms))


ENTRIES = {"distribute": _distribute, "register_dataset": _register, "from_dataset_id": _from_dataset_id}
CAUSES = {"refused": "connection refused", "unresolvable": "the host name does not resolve"}


def _failure(entry: Callable[[str, int], None], address: str, timeout_ms: int, limit_s: float
             ) -> tuple[BaseException, float]:
    """What ``entry`` raised and after how long; AssertionError if it hangs past ``limit_s``."""
    start = time.monotonic()
    with pytest.raises(errors.DataServiceError) as info:
        run_with_deadline(lambda: entry(address, timeout_ms), limit_s)
    return info.value, time.monotonic() - start


def _assert_no_grpc_dump(error: BaseException) -> None:
    """The traceback a user sees: ours, chained from a one-line stand-in of gRPC's error."""
    assert isinstance(error.__cause__, grpc.RpcError), "the transport error must be chained"
    printed = "".join(traceback.format_exception(error))
    assert "_InactiveRpcError" not in printed and "debug_error_string" not in printed, printed
    assert "grpc/_channel.py" not in printed, printed


# Each cause once, and each entry point once: the three share the dispatcher client.
@pytest.mark.parametrize("kind, entry", [("refused", "distribute"), ("unresolvable", "from_dataset_id"),
                                         ("refused", "register_dataset")])
def test_a_client_warns_within_seconds_and_raises_at_timeout_ms_saying_how_long(kind: str, entry: str) -> None:
    address = f"127.0.0.1:{free_port()}" if kind == "refused" else UNRESOLVABLE
    with Records("dataservice.client") as records:
        started = time.monotonic()
        error, elapsed = _failure(ENTRIES[entry], address, TIMEOUT_MS, TIMEOUT_MS / 1000 + 20)

    warnings = records.messages(f"cannot reach the dispatcher at {address}")
    # Once, not per retry: the next would come UNREACHABLE_NOTICE_INTERVAL_S later, past the timeout.
    assert len(warnings) == 1, records.messages()
    warning = warnings[0]
    assert CAUSES[kind] in warning, warning
    assert f"dataservice status --dispatcher {address}" in warning, warning
    assert records.times(address)[0] - started <= WARN_WITHIN_S, warning

    assert isinstance(error, errors.ServiceUnavailableError), repr(error)
    message = str(error)
    tried = re.search(r"tried for ([\d.]+) s", message)
    assert tried, message
    assert TIMEOUT_MS / 1000 <= float(tried.group(1)) < TIMEOUT_MS / 1000 + LATE_S, message
    assert CAUSES[kind] in message and f"gave up at timeout_ms={TIMEOUT_MS}" in message, message
    # Neither early (it used to stop up to a backoff before the deadline) nor late.
    assert TIMEOUT_MS / 1000 <= elapsed < TIMEOUT_MS / 1000 + LATE_S, f"gave up after {elapsed:.2f} s"
    _assert_no_grpc_dump(error)


def test_a_call_with_its_own_timeout_fails_without_a_warning() -> None:
    """``release_iteration_client`` at a reader's close, ``dataservice status``: their callers say what
    failed, or it does not matter; a warning would be noise at exit, or said twice."""
    address = f"127.0.0.1:{free_port()}"
    client = DispatcherClient(address, timeout_ms=60_000)
    try:
        with Records("dataservice.client") as records:
            start = time.monotonic()
            with pytest.raises(errors.ServiceUnavailableError, match="tried for 2.[0-9] s") as info:
                run_with_deadline(lambda: client.get_status(timeout_s=2.0), 20)
            elapsed = time.monotonic() - start
    finally:
        client.close()
    assert 2.0 <= elapsed < 2.0 + LATE_S, f"gave up after {elapsed:.2f} s"
    assert "gave up at timeout_ms=2000" in str(info.value), str(info.value)
    assert records.messages() == [], records.messages()


# --- something that accepts connections and closes them ------------------------------------------

@pytest.fixture
def closing_server() -> Iterator[str]:
    """A TCP port that accepts each connection and closes it at once, without a byte."""
    accepted = []
    with raw_tcp_server(lambda conn: accepted.append(1)) as address:
        yield address
    assert accepted, "nothing connected to the closing server: the test tests nothing"


@pytest.mark.parametrize("entry", ["distribute"])
def test_a_server_that_closes_every_connection_fails_the_client_within_15_s(closing_server: str,
                                                                            entry: str) -> None:
    error, elapsed = _failure(ENTRIES[entry], closing_server, 60_000, 40)
    assert elapsed < 15, f"took {elapsed:.1f} s with timeout_ms=60000"
    assert elapsed >= CLOSED_VERDICT_S, f"gave up after {elapsed:.1f} s: one closed connection is no proof"
    assert isinstance(error, errors.ServiceUnavailableError), repr(error)
    message = str(error)
    assert f"the dispatcher at {closing_server}" in message, message
    assert "accepts connections and closes them at once" in message, message
    assert "proxy or load balancer" in message and "--port of `dataservice dispatcher`" in message, message
    _assert_no_grpc_dump(error)


def test_a_short_timeout_at_a_closing_server_says_what_was_seen(closing_server: str) -> None:
    error, elapsed = _failure(_register, closing_server, 1_500, 20)
    assert isinstance(error, errors.ServiceUnavailableError), repr(error)
    assert 1.5 <= elapsed < 1.5 + LATE_S, f"gave up after {elapsed:.2f} s"
    message = str(error)
    tried = re.search(r"tried for ([\d.]+) s", message)
    assert tried and 1.5 <= float(tried.group(1)) < 1.5 + LATE_S, message
    assert f"something at {closing_server} accepts connections and closes them at once" in message, message


def test_the_probe_says_why_it_could_not_connect(closing_server: str) -> None:
    """The client's cause when gRPC's wording is not one it knows (it varies across gRPC versions)."""
    refused = probe_endpoint(f"127.0.0.1:{free_port()}")
    assert (refused.kind, refused.reason) == (EndpointKind.UNREACHABLE, "connection refused")
    unresolvable = probe_endpoint(UNRESOLVABLE)
    assert unresolvable.kind is EndpointKind.UNREACHABLE
    assert unresolvable.reason.startswith("the host name does not resolve"), unresolvable
    assert probe_endpoint(closing_server).kind is EndpointKind.CLOSED


# --- a worker ------------------------------------------------------------------------------------

def _start_aside(worker: ds.WorkerServer) -> threading.Thread:
    # start() waits a while for a first registration that cannot come: run it aside.
    starter = threading.Thread(target=worker.start, daemon=True)
    starter.start()
    return starter


def test_a_worker_says_it_cannot_reach_its_dispatcher_within_5_s_then_at_a_bounded_rate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    interval_s = 1.5  # instead of UNREACHABLE_NOTICE_INTERVAL_S's 30 s, to see a few within the test
    monkeypatch.setattr(dispatcher_client, "UNREACHABLE_NOTICE_INTERVAL_S", interval_s)
    address = f"localhost:{free_port()}"
    worker = ds.WorkerServer(ds.WorkerConfig(dispatcher_address=address, port=0, heartbeat_interval_ms=100,
                                             dispatcher_timeout_ms=2_000), start=False)
    with Records("dataservice.worker") as records:
        started = time.monotonic()
        starter = _start_aside(worker)
        try:
            wait_until(lambda: len(records.times("cannot reach its dispatcher")) >= 3, 15,
                       "three warnings about the unreachable dispatcher")
        finally:
            starter.join(timeout=15)
            worker.stop()
    assert not starter.is_alive()
    times = records.times("cannot reach its dispatcher")
    assert times[0] - started <= WARN_WITHIN_S, f"the first warning came {times[0] - started:.1f} s after start"
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(gap >= interval_s - 0.05 for gap in gaps), f"warned per retry, not at a bounded rate: {gaps}"
    first = records.messages("cannot reach its dispatcher")[0]
    assert f"worker {worker.address} cannot reach its dispatcher at {address}" in first, first
    assert "connection refused" in first and f"dataservice status --dispatcher {address}" in first, first
    assert "Still trying" in first, first
    # Each call's give-up is not said besides: the warnings above say it at their rate.
    assert records.messages("heartbeat to dispatcher") == [], records.messages()


def _wait_for_heartbeats(dispatcher_address: str, worker_address: str, n: int) -> None:
    """Until the dispatcher has heard ``n`` more heartbeats of the worker (its status says when it last did)."""
    client = DispatcherClient(dispatcher_address, timeout_ms=10_000)
    seen: set = set()

    def heard() -> bool:
        for status in client.get_status().workers:
            if status.address == worker_address and status.last_heartbeat_unix > 0:
                seen.add(status.last_heartbeat_unix)
        return len(seen) > n

    try:
        wait_until(heard, 20, f"{n} heartbeats of worker {worker_address}", interval_s=0.05)
    finally:
        client.close()


def test_a_worker_started_before_its_dispatcher_warns_then_registers_in_one_line() -> None:
    port = free_port()
    address = f"localhost:{port}"
    worker = ds.WorkerServer(ds.WorkerConfig(dispatcher_address=address, port=0, heartbeat_interval_ms=100,
                                             dispatcher_timeout_ms=2_000), start=False)
    dispatcher = None
    with Records("dataservice.worker", logging.INFO) as records:
        starter = _start_aside(worker)
        try:
            wait_until(lambda: records.messages("cannot reach its dispatcher"), WARN_WITHIN_S + 5,
                       "the warning about the unreachable dispatcher")
            dispatcher = ds.DispatchServer(ds.DispatcherConfig(port=port))
            wait_until(lambda: records.messages("registered with"), 15, "the worker's registration line")
            _wait_for_heartbeats(address, worker.address, 3)  # more heartbeats do not repeat the line
        finally:
            starter.join(timeout=15)
            worker.stop()
            if dispatcher is not None:
                dispatcher.stop()
    assert not starter.is_alive()
    registered = records.messages("registered with")
    assert registered == [f"worker {worker.address} registered with the dispatcher at {address}"], registered
    assert records.messages("reached again") == [], records.messages()


def test_a_worker_logs_one_registration_line(cluster) -> None:
    with Records("dataservice.worker", logging.INFO) as records:
        worker = cluster.add_worker()
        _wait_for_heartbeats(cluster.dispatcher_address, worker.address, 3)
    assert records.messages("registered with") == [
        f"worker {worker.address} registered with the dispatcher at {cluster.dispatcher_address}"]
    assert records.messages("cannot reach") == []


# --- a real worker process -------------------------------------------------------------------------

@pytest.mark.slow
def test_a_worker_process_with_a_wrong_dispatcher_address_says_so_then_registers(procs) -> None:
    """``dataservice worker --dispatcher localhost:PORT`` with nothing on PORT: its stderr says so, naming the
    address and the cause, while it keeps running; a dispatcher started there later gets it registered."""
    port = free_port()
    worker = procs.worker(port)
    wait_until(lambda: "cannot reach its dispatcher" in worker.proc.stderr, 15, "the worker's warning")
    warning = next(line for line in worker.proc.stderr.splitlines() if "cannot reach its dispatcher" in line)
    assert " WARNING dataservice.worker: " in warning, warning
    assert f"at localhost:{port}" in warning and "connection refused" in warning, warning
    assert f"dataservice status --dispatcher localhost:{port}" in warning, warning
    assert worker.proc.popen.poll() is None, "the worker gave up: it must keep trying"

    procs.dispatcher(port=port)
    wait_until(lambda: "registered with the dispatcher" in worker.proc.stderr, 20, "the registration line")
    lines = [line for line in worker.proc.stderr.splitlines() if "registered with the dispatcher" in line]
    assert len(lines) == 1 and f"worker {worker.address} registered with the dispatcher at localhost:{port}" \
        in lines[0], lines
    assert "Traceback" not in worker.proc.stderr, worker.proc.stderr
    assert_clean_exit(worker.proc, signal.SIGTERM)
