"""The TCP data-transfer path: a real DataServer serving a real TaskRunner, read by TcpTransport.

Framing must hold however the bytes are cut: requests sent a byte at a time,
responses read a few bytes per ``recv``; malformed peers get clear errors, not
hangs; and the reader's receive buffers are reused only once dropped.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from typing import Iterator, Optional

import numpy as np
import pytest

from dataservice import Dataset, errors
from dataservice.client.buffer_pool import BufferPool
from dataservice.client.transports import TcpTransport, TransientError, _Receiver
from dataservice.proto import dispatcher_pb2, state_pb2, worker_pb2
from dataservice.service import cross_memory
from dataservice.service.wire import OUT_OF_BAND_BYTES, buffer_sizes, decode_frame
from dataservice.service.data_transfer import MAX_REQUEST_BYTES, REQUEST_HEADER, RESPONSE_HEADER
from dataservice.worker.data_server import DataServer
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.shared_batches import SharedBatches
from dataservice.worker.task_runner import TaskRunner

TASK_ID = 7
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class OneTaskWorker:
    """A TaskSource holding one parallel_epochs task (which needs no dispatcher); with ``shared_batches``
    (a ``SharedBatches``) its large batches go into shared segments."""

    address = "localhost:0"

    def __init__(self, dataset: Dataset, shared_batches: Optional[SharedBatches] = None,
                 budget: Optional[MemoryBudget] = None):
        task = dispatcher_pb2.TaskDef(task_id=TASK_ID, processing_mode=state_pb2.PARALLEL_EPOCHS)
        self.runner = TaskRunner(task, dataset, dispatcher=None, worker_address=self.address, budget=budget,
                                 shared_batches=shared_batches)

    def find_task(self, task_id: int, wait_s: float) -> Optional[TaskRunner]:
        return self.runner if task_id == TASK_ID else None


@contextlib.contextmanager
def connected(port: int, *args, **kwargs) -> Iterator[TcpTransport]:
    """A TcpTransport to 127.0.0.1:``port``, closed on the way out."""
    transport = TcpTransport(f"127.0.0.1:{port}", *args, **kwargs)
    try:
        yield transport
    finally:
        transport.close()


class Trickle:
    """A real socket whose reads return at most ``most`` bytes: every frame boundary gets split."""

    def __init__(self, sock: socket.socket, most: int):
        self._sock = sock
        self._most = most

    def recv_into(self, buffer, nbytes: int = 0) -> int:
        return self._sock.recv_into(buffer, min(nbytes or len(buffer), self._most))


def big(x):
    return np.full(OUT_OF_BAND_BYTES // 8 + 3, x, np.float64)


def mixed(x):
    return (np.int64(x), np.arange(x % 5), big(x), f"n{x}")


@pytest.fixture
def serve():
    servers = []

    def start(dataset: Dataset, shared_batches: Optional[SharedBatches] = None,
              budget: Optional[MemoryBudget] = None) -> DataServer:
        server = DataServer(OneTaskWorker(dataset, shared_batches, budget), host="127.0.0.1",
                            shared_batches=shared_batches)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server._worker.runner.stop()
        server.stop()


def read_all(transport: TcpTransport, max_elements: int = 3) -> list:
    out = []
    while True:
        header, frame = transport.get(worker_pb2.GetElementsRequest(task_id=TASK_ID, max_elements=max_elements,
                                                                    max_bytes=1 << 20, wait_ms=1000))
        out.extend(frame.decode())
        if header.end_of_sequence:
            return out


def check_mixed(elements: list, n: int) -> None:
    assert [int(e[0]) for e in elements] == list(range(n))
    for x, (_, small, large, text) in enumerate(elements):
        np.testing.assert_array_equal(small, np.arange(x % 5))
        np.testing.assert_array_equal(large, big(x))
        assert text == f"n{x}"


@pytest.mark.parametrize("most", [1, 3, 4096])
def test_responses_read_a_few_bytes_at_a_time(serve, most):
    server = serve(Dataset.range(12).map(mixed))
    with connected(server.port, memory_reads=False) as transport:
        sock, _ = transport._connect()
        transport._receiver = _Receiver(Trickle(sock, most))
        check_mixed(read_all(transport), 12)


def test_requests_sent_a_byte_at_a_time(serve):
    server = serve(Dataset.range(4).map(mixed))
    request = worker_pb2.GetElementsRequest(task_id=TASK_ID, max_elements=4, max_bytes=1 << 20, wait_ms=1000)
    body = request.SerializeToString()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in REQUEST_HEADER.pack(len(body)) + body:
            sock.sendall(bytes([byte]))
        receiver = _Receiver(sock)
        header_len, prefix_len, frame_len = RESPONSE_HEADER.unpack(receiver.read(RESPONSE_HEADER.size))
        header = worker_pb2.ElementChunk.FromString(bytes(receiver.read(header_len)))
        prefix = receiver.read(prefix_len)
        rest = receiver.read(frame_len - prefix_len)
    assert header.num_elements == 4 and header.end_of_sequence
    buffers, at = [], 0
    for n in buffer_sizes(prefix):
        buffers.append(rest[at:at + n])
        at += n
    check_mixed(decode_frame(prefix, buffers), 4)


def test_a_garbage_request_closes_that_connection_only(serve):
    server = serve(Dataset.range(5).map(mixed))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as bad:
        bad.sendall(REQUEST_HEADER.pack(MAX_REQUEST_BYTES + 1) + b"x" * 16)
        try:
            assert bad.recv(1) == b""  # closed by the server...
        except ConnectionResetError:
            pass  # ...with our extra bytes unread
    with connected(server.port) as transport:
        check_mixed(read_all(transport), 5)


def test_an_unknown_task_is_transient_and_a_bad_request_is_invalid(serve):
    server = serve(Dataset.range(1))
    with connected(server.port) as transport:
        with pytest.raises(TransientError, match="task 99 is not running"):
            transport.get(worker_pb2.GetElementsRequest(task_id=99, max_elements=1))
        with pytest.raises(errors.InvalidRequestError, match="max_elements is 0, less than 1"):
            transport.get(worker_pb2.GetElementsRequest(task_id=TASK_ID, max_elements=0))


class FakePeer:
    """A plain TCP server answering every request with ``reply`` (then closing if ``close``)."""

    def __init__(self, reply: bytes, close: bool):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._reply, self._close = reply, close
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(self._reply)
            if not self._close:
                conn.recv(1)  # hold the connection until the client closes it

    def close(self) -> None:
        self._listener.close()
        self._thread.join(timeout=10)


def test_a_connection_closed_mid_frame_is_transient():
    header = worker_pb2.ElementChunk(num_elements=1).SerializeToString()
    peer = FakePeer(RESPONSE_HEADER.pack(len(header), 64, 1 << 20) + header + b"\0" * 10, close=True)
    try:
        with connected(peer.port, memory_reads=False) as transport:
            with pytest.raises(TransientError, match="closed the connection"):
                transport.get(worker_pb2.GetElementsRequest(task_id=1, max_elements=1))
    finally:
        peer.close()


def test_a_peer_that_is_not_a_worker_gets_a_clear_error():
    header = worker_pb2.ElementChunk(num_elements=1).SerializeToString()
    peer = FakePeer(RESPONSE_HEADER.pack(len(header), 16, 16) + header + b"HTTP/1.1 400 Bad", close=False)
    try:
        with connected(peer.port, memory_reads=False) as transport:
            with pytest.raises(errors.ServiceError, match="malformed response.*data-transfer port"):
                transport.get(worker_pb2.GetElementsRequest(task_id=1, max_elements=1))
    finally:
        peer.close()


# --- receive buffers ------------------------------------------------------------------------------

def test_receive_buffers_are_reused_once_the_consumer_drops_the_arrays(serve):
    server = serve(Dataset.range(40).map(big))
    pool = BufferPool(max_bytes=64 << 20)
    with connected(server.port, pool, memory_reads=False) as transport:
        held = []
        for x in range(40):
            header, frame = transport.get(worker_pb2.GetElementsRequest(task_id=TASK_ID, max_elements=1,
                                                                        wait_ms=1000))
            (array,) = frame.decode()
            np.testing.assert_array_equal(array, big(x))
            del frame
            if x < 5:
                held.append(array)  # kept by the consumer: never handed out again
            del array
    # 5 buffers are held; the other 35 elements went through one or two buffers, over and over.
    assert pool.reused >= 30
    assert pool.tracked_bytes <= 8 * big(0).nbytes + 64
    for x, array in enumerate(held):
        np.testing.assert_array_equal(array, big(x))


def test_buffer_pool_never_reuses_what_is_still_referenced():
    pool = BufferPool(max_bytes=1 << 20)
    a = pool.take(1000)
    view = a[10:20]
    exported = memoryview(a)
    del a
    b = pool.take(1000)
    assert not np.shares_memory(b, view)
    del exported
    c = pool.take(1000)
    assert not np.shares_memory(c, view) and not np.shares_memory(c, b)
    del view
    d = pool.take(1000)  # the first buffer is free at last
    assert pool.reused == 1 and not np.shares_memory(d, b) and not np.shares_memory(d, c)


def test_buffer_pool_fits_sizes_and_stays_within_its_bound():
    pool = BufferPool(max_bytes=10_000)
    a = pool.take(4000)
    del a
    small = pool.take(1000)       # 4000 > 2 x 1000: not worth pinning, a new buffer
    assert pool.reused == 0 and small.nbytes == 1000
    del small
    again = pool.take(3000)       # the 4000-byte buffer fits, given out as 3000 bytes
    assert pool.reused == 1 and again.nbytes == 3000
    held = [pool.take(4000) for _ in range(5)]
    assert pool.tracked_bytes <= 10_000
    assert all(h.nbytes == 4000 for h in held)


# --- same-host memory reads -----------------------------------------------------------------------

needs_memory_reads = pytest.mark.skipif(not cross_memory.available(), reason="process_vm_readv is Linux-only")


@needs_memory_reads
@pytest.mark.parametrize("memory_reads", [True, False])
def test_memory_reads_deliver_the_same_elements(serve, memory_reads):
    server = serve(Dataset.range(12).map(mixed))
    with connected(server.port, memory_reads=memory_reads) as transport:
        check_mixed(read_all(transport), 12)
        assert transport.memory_pid == (os.getpid() if memory_reads else None)


@needs_memory_reads
def test_an_answer_the_reader_could_not_copy_is_given_back(serve):
    server = serve(Dataset.range(6).map(big))
    with connected(server.port) as transport:
        sock, receiver = transport._connect()
        assert transport.memory_pid == os.getpid()
        header, prefix, _ = transport._exchange(sock, receiver, worker_pb2.GetElementsRequest(
            task_id=TASK_ID, max_elements=2, wait_ms=1000, read_memory=True))
        assert len(header.buffer_addresses) == 2 and header.runs[0].first_offset == 0
        # We never copy them, and say so: the worker puts elements 0 and 1 back, and they come as bytes.
        header, prefix, frame_len = transport._exchange(sock, receiver, worker_pb2.GetElementsRequest(
            task_id=TASK_ID, max_elements=6, max_bytes=1 << 30, wait_ms=1000, previous_unread=True))
        assert not header.buffer_addresses and header.runs[0].first_offset == 0
        buffers = [receiver.read(n) for n in buffer_sizes(prefix)]
        elements = decode_frame(prefix, buffers)
        assert [int(e[0]) for e in elements] == list(range(6))


@needs_memory_reads
def test_a_failed_memory_read_falls_back_to_tcp_without_losing_elements(serve):
    server = serve(Dataset.range(8).map(big))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with connected(server.port) as transport:
        transport._connect()
        transport.memory_pid = gone.pid  # a process that no longer exists: the copy fails (ESRCH)
        request = worker_pb2.GetElementsRequest(task_id=TASK_ID, max_elements=3, wait_ms=1000)
        with pytest.raises(TransientError, match="copying from the worker's memory failed"):
            transport.get(request)
        assert transport.memory_pid is None
        got = []
        while True:
            header, frame = transport.get(request)
            got.extend(int(e[0]) for e in frame.decode())
            if header.end_of_sequence:
                break
        assert got == list(range(8))  # 0, 1, 2 were given back, then the rest


def serve_in_this_process() -> None:
    """Runs a DataServer for a subprocess test: prints its port, serves until stdin closes."""
    server = DataServer(OneTaskWorker(Dataset.range(20).map(mixed)), host="127.0.0.1")
    server.start()
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()


@needs_memory_reads
def test_memory_reads_from_a_worker_in_another_process():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen([sys.executable, "-c", "import tests.test_data_transfer as t; t.serve_in_this_process()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        port = int(child.stdout.readline())
        with connected(port) as transport:
            check_mixed(read_all(transport), 20)
            assert transport.memory_pid == child.pid
    finally:
        child.stdin.close()
        child.wait(timeout=30)
