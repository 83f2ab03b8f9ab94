"""The TCP data-transfer port with a cluster token: only the cluster's own members get in (issue #10).

Real dispatchers and workers in this process (``TestCluster``); the attackers are raw sockets.
A worker with a token reads no request, and answers no memory-read probe, before the peer passed
the handshake (``dataservice.service.data_transfer``); a client with a token decodes nothing from
a peer that has not proved it holds the token. Refusals are ``PermissionDeniedError`` at once,
never a retry loop; nothing here waits without a bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Callable, Iterator, Optional

import numpy as np
import pytest

from dataservice import Dataset, distribute, errors
from dataservice.client.transports import TcpTransport
from dataservice.proto import worker_pb2
from dataservice.service import cross_memory
from dataservice.service.auth import TOKEN_ENV, TOKEN_FILE_ENV, ClusterAuth, client_proof, new_nonce, server_proof
from dataservice.service.data_transfer import (CHALLENGE_BYTES, HELLO_BYTES, HELLO_MAGIC, REQUEST_HEADER,
                                               RESPONSE_HEADER, UNAUTHENTICATED)
from dataservice.service.endpoint_probe import DATA_TRANSFER_GREETING
from dataservice.service.wire import OUT_OF_BAND_BYTES, decode_elements, encode_elements
from dataservice.worker import data_server
from tests.cluster import TestCluster, run_with_deadline as cluster_run_with_deadline

TOKEN = "the-cluster-token-0123456789abcdef"
OTHER = "another-clusters-token-0123456789"
#: The longest any read or refusal here may take: far below a reader's timeout_ms, so a refusal that
#: turned into a retry loop fails the test instead of passing late.
DEADLINE_S = 20.0

# A background thread (fetcher, heartbeat, connection) dying of an exception fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


@pytest.fixture(autouse=True)
def no_token_in_the_environment(monkeypatch):
    """A token only where a test gives one: none inherited from the environment."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)


def big(x):
    """An element with an out-of-band array (read from the worker's memory on this host)."""
    return np.full(OUT_OF_BAND_BYTES // 8 + 3, x, np.float64)


@contextlib.contextmanager
def cluster_of(dispatcher_token: Optional[str], worker_token: Optional[str]) -> Iterator[TestCluster]:
    """A dispatcher and one worker, each with its own token (or none)."""
    cluster = TestCluster(num_workers=0, auth_token=dispatcher_token)
    try:
        cluster.add_worker(auth_token=worker_token)
        cluster.wait_for_workers(1)
        yield cluster
    finally:
        cluster.stop()


def run_with_deadline(fn, timeout_s: float = DEADLINE_S):
    return cluster_run_with_deadline(fn, timeout_s)


def read(cluster: TestCluster, mode: str, token: Optional[str], protocol: Optional[str], n: int = 12) -> list:
    ds = Dataset.range(n).map(big).apply(distribute(mode, cluster.target, auth_token=token,
                                                    data_transfer_protocol=protocol, timeout_ms=60_000))
    return run_with_deadline(lambda: list(ds))


def data_port(cluster: TestCluster) -> int:
    return int(cluster.workers[0].data_address.rsplit(":", 1)[1])


def raw_connection(port: int, timeout_s: float = 5.0) -> socket.socket:
    return socket.create_connection(("localhost", port), timeout=timeout_s)


def read_response(sock: socket.socket) -> worker_pb2.ElementChunk:
    """One framed response's header (what a refused peer gets: a protobuf, never a pickle)."""
    header_len, prefix_len, frame_len = RESPONSE_HEADER.unpack(recv_exactly(sock, RESPONSE_HEADER.size))
    assert (prefix_len, frame_len) == (0, 0)  # no frame: nothing to decode
    return worker_pb2.ElementChunk.FromString(recv_exactly(sock, header_len))


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the peer closed (EOF or reset); the socket's timeout bounds the wait."""
    try:
        while True:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def request_bytes(request: worker_pb2.GetElementsRequest) -> bytes:
    body = request.SerializeToString()
    return REQUEST_HEADER.pack(len(body)) + body


# --- members read, over TCP and from memory ----------------------------------------------------------

@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
@pytest.mark.parametrize("protocol", [None, "tcp"])
def test_the_right_token_reads_and_memory_reads_start_after_the_handshake(mode, protocol, monkeypatch):
    if protocol is None and not cross_memory.available():
        pytest.skip("process_vm_readv is Linux-only")
    events: list = []
    handshake, probe, read_into = TcpTransport._handshake, TcpTransport._probe, cross_memory.read_into

    def spy_handshake(self, sock, auth):
        events.append("handshake")
        return handshake(self, sock, auth)

    def spy_probe(self, sock, receiver):
        events.append("probe")
        pid = probe(self, sock, receiver)
        events.append(f"probed {pid}")
        return pid

    def spy_read_into(pid, *args):
        events.append(f"memory read from {pid}")
        return read_into(pid, *args)

    monkeypatch.setattr(TcpTransport, "_handshake", spy_handshake)
    monkeypatch.setattr(TcpTransport, "_probe", spy_probe)
    monkeypatch.setattr(cross_memory, "read_into", spy_read_into)
    with cluster_of(TOKEN, TOKEN) as cluster:
        elements = read(cluster, mode, TOKEN, protocol)
    assert sorted(int(e[0]) for e in elements) == list(range(12))
    for e in elements:
        np.testing.assert_array_equal(e, big(int(e[0])))
    assert events and events[0] == "handshake"
    if protocol is None:
        # The probe ran on the authenticated connection and found this process: the worker's arrays
        # were then copied out of its memory (the probe's copy, then the elements').
        me = os.getpid()
        assert events[:4] == ["handshake", "probe", f"memory read from {me}", f"probed {me}"]
        assert f"memory read from {me}" in events[4:]
    else:
        assert set(events) == {"handshake"}  # over TCP only: no probe, no memory reads


# --- clients without the token -----------------------------------------------------------------------

@pytest.mark.parametrize("protocol", [None, "tcp"])
@pytest.mark.parametrize("client_token, why", [
    (None, "refused this client: this worker requires the cluster's auth token: set DATASERVICE_AUTH_TOKEN"),
    # Each side finds the other's proof wrong; the client checks first, and says both possibilities.
    (OTHER, r"does not hold the cluster token \(a wrong proof: .*or this client's token is not the cluster's\)"),
])
def test_a_client_without_the_workers_token_gets_permission_denied_at_once(client_token, why, protocol):
    # The dispatcher has no token here, so that the client reaches the worker's data port: the worker's
    # handshake is all that stands in its way.
    with cluster_of(None, TOKEN) as cluster:
        started = time.monotonic()
        with pytest.raises(errors.PermissionDeniedError, match=why):
            read(cluster, "parallel_epochs", client_token, protocol)
        assert time.monotonic() - started < 10.0  # refused, not retried until timeout_ms (60 s)


@pytest.mark.parametrize("client_token", [None, OTHER])
def test_a_cluster_members_data_port_refuses_a_transport_without_its_token(client_token):
    with cluster_of(TOKEN, TOKEN) as cluster:
        transport = TcpTransport(cluster.workers[0].data_address,
                                 auth=ClusterAuth(client_token) if client_token else None)
        try:
            with pytest.raises(errors.PermissionDeniedError,
                               match="refused this client" if client_token is None else "a wrong proof"):
                run_with_deadline(lambda: transport.get(worker_pb2.GetElementsRequest(task_id=1, max_elements=1)))
            assert transport._sock is None  # closed: the next call starts a new handshake
            assert transport.memory_pid is None
        finally:
            transport.close()
        # Members still get in.
        assert len(read(cluster, "distributed_epoch", TOKEN, None, n=3)) == 3


def test_a_worker_without_a_token_and_a_client_with_one():
    with cluster_of(None, None) as cluster:
        with pytest.raises(errors.PermissionDeniedError,
                           match="runs without an auth token, but this client has one: every member"):
            read(cluster, "parallel_epochs", TOKEN, None)


# --- raw sockets against a worker with a token --------------------------------------------------------

@pytest.mark.parametrize("probe", [False, True])
def test_a_request_without_the_handshake_gets_unauthenticated_and_is_closed(probe):
    with cluster_of(TOKEN, TOKEN) as cluster:
        with raw_connection(data_port(cluster)) as sock:
            sock.sendall(request_bytes(worker_pb2.GetElementsRequest(task_id=1, max_elements=5,
                                                                     probe_memory=probe)))
            header = read_response(sock)
            assert header.error_type == UNAUTHENTICATED
            assert "requires the cluster's auth token" in header.error_message
            assert not header.worker_pid and not header.buffer_addresses  # no probe answered
            assert closed_by_peer(sock)


def test_a_wrong_proof_gets_unauthenticated_and_is_closed():
    with cluster_of(TOKEN, TOKEN) as cluster:
        with raw_connection(data_port(cluster)) as sock:
            client_nonce = new_nonce()
            sock.sendall(HELLO_MAGIC + client_nonce)
            answer = recv_exactly(sock, CHALLENGE_BYTES)
            server_nonce = answer[:len(client_nonce)]
            # The server proved itself; we answer with another cluster's proof (and a probe behind it).
            assert answer[len(client_nonce):] == server_proof(ClusterAuth(TOKEN), client_nonce, server_nonce)
            sock.sendall(client_proof(ClusterAuth(OTHER), client_nonce, server_nonce)
                         + request_bytes(worker_pb2.GetElementsRequest(probe_memory=True)))
            header = read_response(sock)
            assert header.error_type == UNAUTHENTICATED and "wrong auth token" in header.error_message
            assert not header.worker_pid
            assert closed_by_peer(sock)


def test_a_replayed_server_proof_is_no_client_proof():
    with cluster_of(TOKEN, TOKEN) as cluster:
        with raw_connection(data_port(cluster)) as sock:
            client_nonce = new_nonce()
            sock.sendall(HELLO_MAGIC + client_nonce)
            answer = recv_exactly(sock, CHALLENGE_BYTES)
            sock.sendall(answer[len(client_nonce):])  # the server's own proof, reflected
            assert read_response(sock).error_type == UNAUTHENTICATED
            assert closed_by_peer(sock)


@pytest.mark.parametrize("sent", [b"", b"\x00\x01\x02", HELLO_MAGIC + b"\x07" * 10, "hello"],
                         ids=["nothing", "3 bytes", "half a hello", "a hello, then no proof"])
def test_a_stalled_handshake_is_closed_within_the_timeout(sent, monkeypatch):
    monkeypatch.setattr(data_server, "HANDSHAKE_TIMEOUT_S", 0.5)
    with cluster_of(TOKEN, TOKEN) as cluster:
        with raw_connection(data_port(cluster), timeout_s=5.0) as sock:
            started = time.monotonic()
            if sent == "hello":
                sock.sendall(HELLO_MAGIC + new_nonce())
                assert len(recv_exactly(sock, CHALLENGE_BYTES)) == CHALLENGE_BYTES
            else:
                sock.sendall(sent)
            assert closed_by_peer(sock), "the server kept a stalled handshake open for 5 s"
            assert time.monotonic() - started < 4.0
        # And it goes on serving members.
        assert len(read(cluster, "parallel_epochs", TOKEN, "tcp", n=3)) == 3


def test_garbage_is_refused_without_being_parsed_and_text_gets_the_greeting():
    with cluster_of(TOKEN, TOKEN) as cluster:
        with raw_connection(data_port(cluster)) as sock:
            sock.sendall(b"\xff\xfe\x00\x80" + os.urandom(HELLO_BYTES + 100))
            assert read_response(sock).error_type == UNAUTHENTICATED
            assert closed_by_peer(sock)
        with raw_connection(data_port(cluster)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")  # a person with a browser: told where they are
            assert recv_exactly(sock, len(DATA_TRANSFER_GREETING)) == DATA_TRANSFER_GREETING
            assert closed_by_peer(sock)


def test_refused_peers_are_logged_at_most_once_a_minute(caplog):
    with cluster_of(TOKEN, TOKEN) as cluster:
        caplog.set_level(logging.WARNING, logger="dataservice.worker")
        for _ in range(3):
            with raw_connection(data_port(cluster)) as sock:
                sock.sendall(request_bytes(worker_pb2.GetElementsRequest(task_id=1, max_elements=1)))
                assert read_response(sock).error_type == UNAUTHENTICATED
                assert closed_by_peer(sock)
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert "no auth token" in refusals[0] and "once a minute" in refusals[0]


# --- a fake worker cannot make a client decode anything -------------------------------------------------

class WritesMarker:
    """An element whose unpickling creates a file: what an attacker's frame would carry."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def malicious_response(marker: str) -> bytes:
    frame = encode_elements([WritesMarker(marker)])
    header = worker_pb2.ElementChunk(num_elements=1, end_of_sequence=True).SerializeToString()
    prefix = b"".join(bytes(p) for p in frame.prefix)
    return RESPONSE_HEADER.pack(len(header), len(prefix), len(prefix)) + header + prefix


class FakeWorker:
    """A data port played by a peer without the token. ``challenge`` makes its answer to a HELLO (None:
    it reads nothing and sends the frame at once); then it sends ``payload``, a frame that would run
    code if it were unpickled, and holds the connection until the client closes it."""

    def __init__(self, challenge: Optional[Callable[[bytes], bytes]], payload: bytes):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(DEADLINE_S)
        self.port = self._listener.getsockname()[1]
        self._challenge, self._payload = challenge, payload
        self.hello = b""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(DEADLINE_S)
            try:
                if self._challenge is not None:
                    self.hello = recv_exactly(conn, HELLO_BYTES)
                    conn.sendall(self._challenge(self.hello))
                conn.sendall(self._payload)
                conn.recv(4096)  # until the client closes
            except (OSError, AssertionError):
                pass

    def close(self) -> None:
        self._listener.close()
        self._thread.join(timeout=DEADLINE_S)


def _echo(hello: bytes) -> bytes:
    nonce = hello[len(HELLO_MAGIC):]
    return nonce + nonce  # the client's nonce as its own, and as its "proof": all it can do without the key


CHALLENGES = {"random bytes": lambda hello: os.urandom(CHALLENGE_BYTES),
              "the frame at once": None,
              "the client's nonce echoed": _echo}


@pytest.mark.parametrize("answer", list(CHALLENGES))
@pytest.mark.parametrize("memory_reads", [True, False])
def test_a_fake_worker_cannot_make_a_client_unpickle_anything(answer, memory_reads, tmp_path):
    # The payload is live: decoding it (here, on purpose) does create its file.
    control = str(tmp_path / "control")
    raw = malicious_response(control)
    header_len = RESPONSE_HEADER.unpack(raw[:RESPONSE_HEADER.size])[0]
    decode_elements(bytearray(raw[RESPONSE_HEADER.size + header_len:]))
    assert os.path.exists(control)

    marker = str(tmp_path / "pwned")
    fake = FakeWorker(CHALLENGES[answer], malicious_response(marker))
    transport = TcpTransport(f"127.0.0.1:{fake.port}", memory_reads=memory_reads, auth=ClusterAuth(TOKEN))
    try:
        with pytest.raises(errors.PermissionDeniedError,
                           match=f"worker at 127.0.0.1:{fake.port} does not hold the cluster token "
                                 f"\\(a wrong proof.*\\) — nothing it sent was loaded"):
            run_with_deadline(lambda: transport.get(worker_pb2.GetElementsRequest(task_id=1, max_elements=1)))
        assert transport._sock is None
    finally:
        transport.close()
        fake.close()
    assert not os.path.exists(marker)
    if CHALLENGES[answer] is not None:
        # What the client sent: the magic and a fresh nonce. The token never crossed the wire.
        assert fake.hello.startswith(HELLO_MAGIC) and len(fake.hello) == HELLO_BYTES
        assert TOKEN.encode() not in fake.hello
