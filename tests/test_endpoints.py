"""A client given an address that is not the dispatcher says what it reached, at once.

Real servers on 127.0.0.1: the ``cluster`` fixture's workers (their gRPC and data-transfer
ports), an HTTP/1 server, a bare gRPC server, sockets that refuse or never answer. Each
wrong endpoint must raise ``errors.WrongEndpointError`` well before ``timeout_ms`` (30 s
here, so a regression to retrying shows up as slowness), while an address where nobody
listens keeps the retries: a client may start before the cluster.

Example::

    $ python -m pytest tests/test_endpoints.py -q
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from concurrent import futures
from typing import Callable, Iterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

import dataservice as ds
from dataservice import errors
from dataservice.service import dispatcher_client as dispatcher_client_module
from dataservice.service.dispatcher_client import DISPATCHER_SERVICE, WORKER_SERVICE, DispatcherClient
from dataservice.service.endpoint_probe import DATA_TRANSFER_GREETING, HTTP2_PREFACE, EndpointKind, probe_endpoint
from dataservice.service.rpc import create_server
from tests.cluster import free_port, raw_tcp_server, wait_until

#: Long enough that retrying a wrong endpoint until the timeout would fail the time bound below.
GENEROUS_TIMEOUT_MS = 30_000
#: A wrong endpoint must be named this fast (it takes milliseconds; the margin is for loaded machines).
FAST_S = 5.0
HINT = "pass the dispatcher's address (the --port of `dataservice dispatcher`)"


# --- servers that are not a dispatcher ---------------------------------------------------------

@pytest.fixture
def http_server() -> Iterator[str]:
    """An HTTP/1 server (the standard library's), as ``127.0.0.1:PORT``."""
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep the test output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def foreign_grpc_server() -> Iterator[str]:
    """A gRPC server that is not ours: only the standard health service."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.fixture
def banner_server() -> Iterator[str]:
    """A server that speaks first, as SSH does: its banner, then it closes."""
    def speak_first(conn: socket.socket) -> None:
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(1.0)
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass

    with raw_tcp_server(speak_first) as address:
        yield address


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A socket that listens but never accepts: the kernel completes connections, nobody answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


# --- the three ways a user names the dispatcher ------------------------------------------------

def _register(address: str, timeout_ms: int) -> None:
    ds.register_dataset(address, ds.Dataset.range(3), timeout_ms=timeout_ms)


def _distribute(address: str, timeout_ms: int) -> None:
    dataset = ds.Dataset.range(3).apply(ds.distribute("parallel_epochs", address, timeout_ms=timeout_ms))
    list(dataset)


def _client(address: str, timeout_ms: int) -> None:
    client = DispatcherClient(address, timeout_ms=timeout_ms)
    try:
        client.get_status()
    finally:
        client.close()


ENTRY_POINTS = {"register_dataset": _register, "distribute": _distribute, "DispatcherClient": _client}


def _fails_fast(call: Callable[[str, int], None], address: str) -> errors.WrongEndpointError:
    """The WrongEndpointError ``call`` raises for ``address``, asserting it came long before the timeout."""
    start = time.monotonic()
    with pytest.raises(errors.WrongEndpointError) as info:
        call(address, GENEROUS_TIMEOUT_MS)
    elapsed = time.monotonic() - start
    assert elapsed < FAST_S, f"{address}: the error took {elapsed:.1f} s (timeout_ms={GENEROUS_TIMEOUT_MS})"
    assert isinstance(info.value.__cause__, grpc.RpcError), "the gRPC error must be chained (raise ... from exc)"
    return info.value


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_workers_grpc_port(cluster, entry: str) -> None:
    address = f"localhost:{cluster.workers[0].port}"
    error = _fails_fast(ENTRY_POINTS[entry], address)
    assert str(error) == f"{address} is a dataservice worker, not the dispatcher: {HINT}"


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_workers_data_transfer_port(cluster, entry: str) -> None:
    address = cluster.workers[0].data_address
    assert address and address != f"localhost:{cluster.workers[0].port}"
    error = _fails_fast(ENTRY_POINTS[entry], address)
    assert str(error) == f"{address} is a dataservice worker's data-transfer port, not the dispatcher: {HINT}"
    # The stranger did the worker no harm: readers still get their elements over that port.
    dataset = ds.Dataset.range(5).apply(ds.distribute("parallel_epochs", cluster.target, timeout_ms=20_000,
                                                      data_transfer_protocol="tcp"))
    assert sorted(int(x) for x in dataset) == sorted(list(range(5)) * len(cluster.workers))


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_an_http_server(http_server: str, entry: str) -> None:
    error = _fails_fast(ENTRY_POINTS[entry], http_server)
    message = str(error)
    assert message.startswith(f"{http_server} is not a dataservice dispatcher: it does not speak gRPC (it answered ")
    assert "Error response" in message  # the title of the page http.server answers with
    assert message.endswith(HINT)


def test_a_server_that_speaks_first(banner_server: str) -> None:
    error = _fails_fast(_register, banner_server)
    assert str(error) == (f"{banner_server} is not a dataservice dispatcher: it does not speak gRPC "
                          f"(it answered 'SSH-2.0-OpenSSH_9.6'); {HINT}")


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_grpc_server_that_is_not_ours(foreign_grpc_server: str, entry: str) -> None:
    error = _fails_fast(ENTRY_POINTS[entry], foreign_grpc_server)
    assert str(error) == f"{foreign_grpc_server} is a gRPC server but not a dataservice dispatcher: {HINT}"


def test_a_closed_port_is_retried_until_the_timeout() -> None:
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(errors.ServiceUnavailableError, match=f"RegisterDataset to dispatcher {address}: unreachable"):
        _register(address, 2000)
    elapsed = time.monotonic() - start
    # The retries stop when the next backoff (at most 1 s) would pass the deadline.
    assert 1.0 <= elapsed < 10, f"gave up after {elapsed:.2f} s for timeout_ms=2000"


def test_a_silent_server_is_retried_and_then_described(silent_server: str) -> None:
    # Silence is no proof (a paused dispatcher is silent too): the retries go on until the
    # timeout, and then the error says what was seen.
    start = time.monotonic()
    with pytest.raises(errors.ServiceUnavailableError) as info:
        _client(silent_server, 1500)
    elapsed = time.monotonic() - start
    assert 0.5 <= elapsed < 10, f"gave up after {elapsed:.2f} s for timeout_ms=1500"  # see the test above
    assert f"something at {silent_server} accepts connections but never answers as a gRPC server" in str(info.value)


def test_a_client_started_before_the_dispatcher_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    probed = threading.Event()
    verdicts: list = []

    def spy(address: str, *args, **kwargs):
        verdict = probe_endpoint(address, *args, **kwargs)
        verdicts.append(verdict.kind)
        probed.set()
        return verdict

    monkeypatch.setattr(dispatcher_client_module, "probe_endpoint", spy)
    outcome: dict = {}

    def register() -> None:
        try:
            outcome["id"] = ds.register_dataset(f"localhost:{port}", ds.Dataset.range(3), timeout_ms=20_000)
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=register, daemon=True)
    thread.start()
    dispatcher = None
    try:
        assert probed.wait(10), "the client never probed the refused address"
        dispatcher = ds.DispatchServer(ds.DispatcherConfig(port=port))
        thread.join(timeout=25)
        assert not thread.is_alive(), "register_dataset still waits for a dispatcher that is up"
    finally:
        if dispatcher is not None:
            dispatcher.stop()
    assert "error" not in outcome, outcome.get("error")
    assert isinstance(outcome["id"], int)
    assert verdicts[0] is EndpointKind.UNREACHABLE


def test_a_worker_logs_a_wrong_dispatcher_address(cluster, caplog: pytest.LogCaptureFixture) -> None:
    # A worker's heartbeats go through DispatcherClient too: pointed at another worker, it says so.
    wrong = f"localhost:{cluster.workers[0].port}"
    expected = f"{wrong} is a dataservice worker, not the dispatcher: {HINT}"
    caplog.set_level("WARNING", logger="dataservice.worker")
    worker = ds.WorkerServer(cluster.worker_config(dispatcher_address=wrong), start=False)
    # start() waits a while for a first registration that will never come: run it aside.
    starter = threading.Thread(target=worker.start, daemon=True)
    starter.start()
    try:
        wait_until(lambda: any(expected in record.getMessage() for record in caplog.records), 10,
                   "the worker's warning about its dispatcher address")
    finally:
        starter.join(timeout=15)
        worker.stop()
    assert not starter.is_alive()


# --- the pieces ----------------------------------------------------------------------------------

def test_servers_name_themselves_in_their_health_service(cluster) -> None:
    assert (DISPATCHER_SERVICE, WORKER_SERVICE) == ("dataservice.Dispatcher", "dataservice.Worker")
    for port, name, other in ((cluster.port, DISPATCHER_SERVICE, WORKER_SERVICE),
                              (cluster.workers[0].port, WORKER_SERVICE, DISPATCHER_SERVICE)):
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", name):
                response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert response.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as info:
                stub.Check(health_pb2.HealthCheckRequest(service=other), timeout=5)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_create_server_reports_the_services_it_is_given() -> None:
    server, port = create_server("127.0.0.1:0", services=("test.Thing",))
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="test.Thing"), timeout=5)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(None)


def test_probe_kinds(cluster, http_server: str, foreign_grpc_server: str, banner_server: str,
                     silent_server: str) -> None:
    worker = cluster.workers[0]
    cases = {
        cluster.dispatcher_address: EndpointKind.GRPC,
        f"localhost:{worker.port}": EndpointKind.GRPC,
        foreign_grpc_server: EndpointKind.GRPC,
        worker.data_address: EndpointKind.DATA_TRANSFER,
        http_server: EndpointKind.NOT_GRPC,
        banner_server: EndpointKind.NOT_GRPC,
        f"127.0.0.1:{free_port()}": EndpointKind.UNREACHABLE,
    }
    for address, kind in cases.items():
        start = time.monotonic()
        assert probe_endpoint(address).kind is kind, address
        assert time.monotonic() - start < FAST_S, address
    start = time.monotonic()
    assert probe_endpoint(silent_server, timeout_s=0.3).kind is EndpointKind.SILENT
    assert time.monotonic() - start < FAST_S


def test_probe_recognises_tls() -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_with_an_alert() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(b"\x15\x03\x03\x00\x02\x02\x46")  # TLS alert: protocol_version
    thread = threading.Thread(target=answer_with_an_alert, daemon=True)
    thread.start()
    try:
        assert probe_endpoint(f"127.0.0.1:{listener.getsockname()[1]}").kind is EndpointKind.TLS
    finally:
        listener.close()
        thread.join(timeout=5)


def test_data_transfer_port_greets_an_http2_client(cluster) -> None:
    host, port = cluster.workers[0].data_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(HTTP2_PREFACE)
        received = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            chunk = sock.recv(1024)
            if not chunk:
                break
            received += chunk
    assert received == DATA_TRANSFER_GREETING  # then it closed


def test_a_dispatcher_of_another_version_is_not_called_a_wrong_endpoint() -> None:
    # A dispatcher that lacks a method (an older dataservice) serves "dataservice.Dispatcher":
    # the client says the versions differ, not that the address is wrong.
    server, port = create_server("127.0.0.1:0", services=(DISPATCHER_SERVICE,))
    server.start()
    try:
        client = DispatcherClient(f"127.0.0.1:{port}", timeout_ms=GENEROUS_TIMEOUT_MS)
        try:
            with pytest.raises(errors.ServiceError) as info:
                client.get_status()
        finally:
            client.close()
        assert not isinstance(info.value, errors.WrongEndpointError)
        assert str(info.value) == (f"the dispatcher at 127.0.0.1:{port} does not know the call GetStatus: it runs "
                                   f"another version of dataservice than this process")
    finally:
        server.stop(None)
