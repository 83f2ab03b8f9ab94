"""Workers the client cannot read from: no read ever blocks without bound (issue #9).

A worker that advertises an address the client cannot reach (a host that does not
resolve, a port nothing listens on), one that accepts the connection but never
answers (a black hole, a SIGSTOPped process), and a job no worker serves: the
client names the worker in a warning within a few seconds, and when nothing could
be read from any worker for ``timeout_ms`` the read raises
``errors.ServiceUnavailableError`` naming the addresses tried. A slow pipeline is
not an unreachable worker: its worker keeps answering (empty) while it computes.

The in-process tests use ``TestCluster`` (tests/cluster.py); the ``slow`` ones
start real dispatcher and worker processes (tests/processes.py). Every read runs
on a ``BackgroundReader`` thread joined with a deadline, so a regression shows
as a failure, never as a hung test.

Example::

    $ .venv/bin/python -m pytest tests/test_unreachable_workers.py -q
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time

import pytest

from dataservice import Dataset, distribute, errors
from dataservice.worker.responses import TASK_ARRIVAL_WAIT_S
from tests.cluster import TestCluster, free_port
from tests.processes import BackgroundReader, slow_identity, wait_for_client_threads, wait_for_workers

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

#: The client's timeout_ms in the tests that expect the warning: the reader warns after a worker has
#: been failing for 2 s (UNREACHABLE_WARNING_S), at its next retry, up to ~1.5 s later with backoff.
TIMEOUT_MS = 4_000
#: How long after timeout_ms the read may raise at most.
LATE_S = 3.0
#: A hostname that never resolves (RFC 6761), at once on this machine.
UNRESOLVABLE = "worker-b.invalid"


@pytest.fixture
def cluster0():
    """A dispatcher without workers; the test adds the ones it needs."""
    test_cluster = TestCluster(num_workers=0)
    try:
        yield test_cluster
    finally:
        test_cluster.stop()
        # The reader's threads end once it raised: one still running would be a leak.
        assert wait_for_client_threads() == []


@pytest.fixture
def client_warnings(caplog):
    """The warnings of logger ``dataservice.client``, as (wall time, message)."""
    caplog.set_level(logging.WARNING, logger="dataservice.client")

    def get() -> list[tuple[float, str]]:
        return [(r.created, r.getMessage()) for r in caplog.records
                if r.name == "dataservice.client" and r.levelno == logging.WARNING]
    return get


def read_until_error(dataset, timeout_ms: int, convert=int) -> tuple[BackgroundReader, float, float]:
    """Reads ``dataset`` to its end on a thread: the reader (its error checked to be
    ServiceUnavailableError), when it started (wall clock), and how long it took."""
    started_wall, started = time.time(), time.monotonic()
    reader = BackgroundReader(dataset, convert=convert)
    if not reader.done.wait(timeout_ms / 1000 + LATE_S + 10):
        pytest.fail(f"the read hung: no error {timeout_ms} ms + {LATE_S + 10} s after it started "
                    f"({reader.count} elements read)")
    elapsed = time.monotonic() - started
    assert isinstance(reader.error, errors.ServiceUnavailableError), \
        f"expected ServiceUnavailableError, got {reader.error!r} after {reader.count} elements"
    return reader, started_wall, elapsed


def assert_raised_in_time(elapsed: float, timeout_ms: int) -> None:
    timeout_s = timeout_ms / 1000
    assert timeout_s - 0.25 <= elapsed < timeout_s + LATE_S, \
        f"the read raised after {elapsed:.2f} s; expected about timeout_ms={timeout_ms}"


def assert_warned_in_time(warnings: list[tuple[float, str]], started_wall: float, name: str,
                          timeout_ms: int) -> float:
    """One warning naming ``name``, before the read raised; returns its delay after the read started."""
    naming = [(t, m) for t, m in warnings if name in m]
    assert len(naming) == 1, f"expected one warning naming {name}, got: {warnings}"
    delay = naming[0][0] - started_wall
    assert delay <= timeout_ms / 1000, f"the warning came {delay:.2f} s into the read: {naming[0][1]}"
    assert "--worker-address" in naming[0][1], naming[0][1]
    return delay


# --- an address the client cannot reach ---------------------------------------------------------

@pytest.mark.parametrize("protocol", [None, "grpc"], ids=["tcp-data-path", "grpc"])
def test_unresolvable_worker_address_warns_then_raises_naming_it(cluster0, client_warnings, protocol):
    """A wrong ``--worker-address`` (a container name outside the compose network): the data-transfer
    address takes the same host, so the TCP path fails as the gRPC one does."""
    worker = cluster0.add_worker(worker_address=f"{UNRESOLVABLE}:%port%")
    cluster0.wait_for_workers(1)
    assert worker.address.startswith(UNRESOLVABLE) and worker.data_address.startswith(UNRESOLVABLE)

    reader, started_wall, elapsed = read_until_error(Dataset.range(10).apply(
        distribute("parallel_epochs", cluster0.target, timeout_ms=TIMEOUT_MS, data_transfer_protocol=protocol)),
        TIMEOUT_MS)

    assert reader.count == 0
    message = str(reader.error)
    assert f"worker {worker.address}" in message, message
    assert f"{TIMEOUT_MS} ms" in message, message
    assert "no worker has a task" not in message, message
    assert_raised_in_time(elapsed, TIMEOUT_MS)
    assert_warned_in_time(client_warnings(), started_wall, UNRESOLVABLE, TIMEOUT_MS)


@pytest.mark.parametrize("forced_by", ["worker", "client"])
def test_refused_port_warns_then_raises_naming_it(cluster0, client_warnings, forced_by):
    """A worker advertising a port nothing listens on; elements go over gRPC, which the worker
    (no data-transfer server) or the client (``data_transfer_protocol="grpc"``) chose."""
    address = f"127.0.0.1:{free_port()}"
    worker_protocol = "grpc" if forced_by == "worker" else "tcp"
    client_protocol = "grpc" if forced_by == "client" else None
    worker = cluster0.add_worker(worker_address=address, data_transfer_protocol=worker_protocol)
    cluster0.wait_for_workers(1)
    assert worker.address == address

    reader, started_wall, elapsed = read_until_error(Dataset.range(10).apply(
        distribute("parallel_epochs", cluster0.target, timeout_ms=TIMEOUT_MS,
                   data_transfer_protocol=client_protocol)), TIMEOUT_MS)

    message = str(reader.error)
    assert f"worker {address}" in message, message
    assert "refused" in message.lower(), message
    assert_raised_in_time(elapsed, TIMEOUT_MS)
    assert_warned_in_time(client_warnings(), started_wall, address, TIMEOUT_MS)


def test_another_worker_answering_at_the_advertised_address_fails_the_read_in_time(cluster0):
    """A wrong ``--worker-address`` that reaches another cluster's worker: it answers every request
    with "task not running". Before, such an answer counted as the worker answering, so the
    read waited forever; now it is no progress, and the read raises after ``timeout_ms``."""
    with TestCluster(num_workers=1) as other:
        stranger = other.workers[0]
        # Our worker runs the tasks, but advertises the stranger's address (elements over gRPC: the
        # data-transfer address would take our own data port, which is right).
        cluster0.add_worker(worker_address=stranger.address, data_transfer_protocol="grpc")
        cluster0.wait_for_workers(1)
        # Longer than the stranger takes to answer (it waits TASK_ARRIVAL_WAIT_S for the task to arrive).
        timeout_ms = int(TASK_ARRIVAL_WAIT_S * 1000) + 2_000
        reader, _, elapsed = read_until_error(Dataset.range(10).apply(
            distribute("distributed_epoch", cluster0.target, timeout_ms=timeout_ms)), timeout_ms)
    assert reader.count == 0
    message = str(reader.error)
    assert f"worker {stranger.address}" in message and "does not run the task" in message, message
    assert_raised_in_time(elapsed, timeout_ms)


def test_good_worker_delivers_everything_then_the_unreachable_one_is_named(cluster0, client_warnings):
    """parallel_epochs with one good and one unreachable worker: the dispatcher never revokes the
    unreachable one (it heartbeats fine), so its copy of the epoch can never be read. The good
    worker's copy arrives whole; then, timeout_ms after its last element, the read raises naming
    the unreachable worker only, rather than waiting for ever."""
    good = cluster0.add_worker()
    bad = cluster0.add_worker(worker_address=f"{UNRESOLVABLE}:%port%")
    cluster0.wait_for_workers(2)
    n = 2_000

    reader, started_wall, _ = read_until_error(Dataset.range(n).apply(
        distribute("parallel_epochs", cluster0.target, timeout_ms=TIMEOUT_MS)), TIMEOUT_MS,
        convert=lambda x: (int(x), time.monotonic()))
    raised_at = time.monotonic()  # within an event wake-up of the raise

    assert sorted(x for x, _ in reader.items) == list(range(n)), "the good worker's epoch did not arrive whole"
    after_last = raised_at - reader.items[-1][1]
    assert_raised_in_time(after_last, TIMEOUT_MS)
    message = str(reader.error)
    assert f"worker {bad.address}" in message, message
    assert good.address not in message, f"the good worker finished: it must not be named: {message}"
    assert_warned_in_time(client_warnings(), started_wall, UNRESOLVABLE, TIMEOUT_MS)
    assert not [m for _, m in client_warnings() if good.address in m]


# --- a worker that accepts the connection but never answers --------------------------------------

@pytest.fixture
def black_hole():
    """A TCP port that accepts connections and never sends a byte."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            accepted.append(conn)

    thread = threading.Thread(target=accept, name="black-hole", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)
        for conn in accepted:
            conn.close()


def test_worker_that_accepts_but_never_answers_does_not_block_the_read(cluster0, black_hole):
    port, accepted = black_hole
    address = f"127.0.0.1:{port}"
    cluster0.add_worker(worker_address=address, data_transfer_protocol="grpc")
    cluster0.wait_for_workers(1)
    timeout_ms = 2_500

    reader, _, elapsed = read_until_error(Dataset.range(10).apply(
        distribute("parallel_epochs", cluster0.target, timeout_ms=timeout_ms)), timeout_ms)

    assert accepted, "the client never connected to the black hole: the test tests nothing"
    assert f"worker {address}" in str(reader.error), str(reader.error)
    assert_raised_in_time(elapsed, timeout_ms)


# --- what is not an unreachable worker -----------------------------------------------------------

#: Longer than the client's timeout_ms below: only the worker's empty answers (every
#: GET_ELEMENTS_WAIT_MS while it computes) show the client that the worker is alive.
SLOW_ELEMENT_S = 1.25


def slow_element(x):
    time.sleep(SLOW_ELEMENT_S)
    return x


def test_slow_pipeline_is_not_an_unreachable_worker(cluster0, client_warnings):
    cluster0.add_worker()
    cluster0.wait_for_workers(1)
    timeout_ms = 1_000
    started = time.monotonic()
    reader = BackgroundReader(Dataset.range(3).map(slow_element).apply(
        distribute("parallel_epochs", cluster0.target, timeout_ms=timeout_ms)))
    items = reader.join(3 * SLOW_ELEMENT_S + 20)
    elapsed = time.monotonic() - started
    assert items == [0, 1, 2]
    assert elapsed > 2 * timeout_ms / 1000, f"the read took {elapsed:.2f} s: too fast to show anything"
    assert client_warnings() == []


def test_no_worker_raises_within_timeout_saying_no_worker_has_a_task(cluster0):
    timeout_ms = 2_000
    reader, _, elapsed = read_until_error(Dataset.range(10).apply(
        distribute("parallel_epochs", cluster0.target, timeout_ms=timeout_ms)), timeout_ms)
    message = str(reader.error)
    assert "no worker has a task" in message, message
    assert "dataservice status" in message and cluster0.dispatcher_address in message, message
    assert_raised_in_time(elapsed, timeout_ms)


# --- real processes ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("protocol", [None, "grpc"], ids=["default-data-path", "grpc"])
def test_worker_stopped_mid_read_fails_the_read_within_timeout(procs, protocol):
    """SIGSTOP: the worker keeps its connections open and answers nothing. The dispatcher would
    notice only after --worker-timeout-ms (60 s here), so the client's timeout_ms is what ends
    the read."""
    dispatcher = procs.dispatcher("--worker-timeout-ms", "60000")
    worker = procs.worker(dispatcher.port)
    wait_for_workers(dispatcher.port, [worker.address])
    timeout_ms = 3_000
    reader = BackgroundReader(Dataset.range(10_000_000).map(slow_identity).apply(
        distribute("parallel_epochs", dispatcher.target, max_outstanding_requests=16, timeout_ms=timeout_ms,
                   data_transfer_protocol=protocol)))
    reader.wait_for(2_000, 30)
    worker.proc.send(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        if not reader.done.wait(timeout_ms / 1000 + LATE_S + 10):
            pytest.fail(f"the read hung on a stopped worker ({reader.count} elements read)")
        elapsed = time.monotonic() - stopped_at
        assert isinstance(reader.error, errors.ServiceUnavailableError), repr(reader.error)
        message = str(reader.error)
        assert f"worker {worker.address}" in message, message
        # It answered until the stop: not "no answer yet", which would send the user looking at the network.
        assert "since its last one" in message, message
        # The last answer came just before the stop.
        assert timeout_ms / 1000 - 0.5 <= elapsed < timeout_ms / 1000 + LATE_S, \
            f"the read raised {elapsed:.2f} s after the stop; timeout_ms={timeout_ms}"
        assert worker.proc.popen.poll() is None, "the worker died: it was to be stopped"
    finally:
        worker.proc.send(signal.SIGCONT)
        worker.proc.kill9()


UNRESOLVABLE_CLIENT = """
import sys, time
import dataservice as ds

dataset = ds.Dataset.range(10).apply(ds.distribute("parallel_epochs", sys.argv[1], timeout_ms=int(sys.argv[2])))
started = time.monotonic()
try:
    print(list(dataset))
except ds.errors.ServiceUnavailableError as exc:
    print(f"ServiceUnavailableError after {time.monotonic() - started:.2f} s: {exc}", flush=True)
"""


@pytest.mark.slow
def test_worker_process_with_unresolvable_worker_address(procs):
    """``dataservice worker --worker-address worker-b.invalid:%port%``, read by a client script that
    configures no logging: the warning reaches its stderr all the same (logging's last resort), the
    error names the advertised address, and the script exits cleanly."""
    dispatcher = procs.dispatcher()
    worker = procs.worker(dispatcher.port, "--worker-address", f"{UNRESOLVABLE}:%port%")
    advertised = f"{UNRESOLVABLE}:{worker.port}"
    wait_for_workers(dispatcher.port, [advertised])

    client = procs.python(UNRESOLVABLE_CLIENT, dispatcher.target, str(TIMEOUT_MS))
    match = client.wait_for_line(r"^ServiceUnavailableError after ([\d.]+) s: (.*)$", timeout_s=60)
    assert client.popen.wait(timeout=30) == 0, client.stderr
    elapsed, message = float(match.group(1)), match.group(2)
    assert f"worker {advertised}" in message, message
    assert_raised_in_time(elapsed, TIMEOUT_MS)
    stderr = client.stderr
    assert f"cannot reach worker {advertised}" in stderr, stderr
    assert "Traceback" not in stderr, stderr
