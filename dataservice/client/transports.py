"""How a reader fetches a frame of elements from a worker: TCP or gRPC.

Both return the header (an ``ElementChunk`` without data) and the frame as a
``ReceivedFrame``: its prefix, and its out-of-band buffers (large arrays),
each in writable memory of its own when it came over TCP, so that a decoded
array is freed as soon as its consumer drops it. They raise
``TransientError`` for what a retry may cure (a worker dead, restarting or
stalled: the dispatcher decides within ``worker_timeout_ms`` whether to revoke
its task) and one of ``dataservice.errors`` otherwise.

Example::

    >>> transport = connect(task_def)
    >>> header, frame = transport.get(worker_pb2.GetElementsRequest(task_id=7, max_elements=64))
    >>> elements = frame.decode()
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Optional, Sequence, Union

import grpc
import numpy as np

from dataservice import errors
from dataservice.client.buffer_pool import BufferPool
from dataservice.proto import dispatcher_pb2, worker_pb2, worker_pb2_grpc
from dataservice.service.addresses import parse_address
from dataservice.service.rpc import make_channel, translate
from dataservice.service.wire import WireFormatError, buffer_sizes, decode_frame, prefix_size
from dataservice.worker.data_server import REQUEST_HEADER, RESPONSE_HEADER

__all__ = ["connect", "TransientError", "GrpcTransport", "TcpTransport", "ReceivedFrame", "GET_ELEMENTS_TIMEOUT_S"]

#: The longest one request may take (the worker answers within its wait).
GET_ELEMENTS_TIMEOUT_S = 60.0


class TransientError(Exception):
    """The worker could not answer now; try again."""


@dataclasses.dataclass
class ReceivedFrame:
    """A frame of elements as received: the prefix, then the out-of-band buffers."""

    prefix: Union[bytearray, memoryview]
    buffers: Sequence[Union[np.ndarray, memoryview]]

    @property
    def nbytes(self) -> int:
        return len(self.prefix) + sum(b.nbytes for b in self.buffers)

    def decode(self) -> list:
        return decode_frame(self.prefix, self.buffers) if len(self.prefix) else []


class GrpcTransport:
    def __init__(self, worker_address: str):
        host, port = parse_address(worker_address, "worker")
        self._what = f"worker {worker_address}"
        self._channel = make_channel(f"{host}:{port}")
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)

    def get(self, request: worker_pb2.GetElementsRequest) -> tuple[worker_pb2.ElementChunk, ReceivedFrame]:
        try:
            data = bytearray()
            head = None
            for chunk in self._stub.GetElements(request, timeout=GET_ELEMENTS_TIMEOUT_S):
                if head is None:
                    head = chunk
                data += chunk.data
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                              grpc.StatusCode.NOT_FOUND, grpc.StatusCode.CANCELLED):
                raise TransientError(str(exc.details())) from exc
            raise translate(exc, f"GetElements for task {request.task_id} from {self._what}") from exc
        if head is None:
            head = worker_pb2.ElementChunk()
        head.data = b""
        if not data:
            return head, ReceivedFrame(bytearray(), [])
        view = memoryview(data)
        start = prefix_size(view)
        buffers = []
        for n in buffer_sizes(view):
            buffers.append(view[start:start + n])
            start += n
        return head, ReceivedFrame(view[:prefix_size(view)], buffers)

    def close(self) -> None:
        self._channel.close()


class _Receiver:
    """Reads exact byte counts from a socket. Small reads are served from a scratch buffer
    filled by one ``recv`` (a small response costs one system call, not one per field);
    large ones go straight into their destination, with no copy in Python."""

    SCRATCH_BYTES = 64 * 1024

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._scratch = bytearray(self.SCRATCH_BYTES)
        self._view = memoryview(self._scratch)
        self._start = self._end = 0

    def read_into(self, dest: memoryview) -> None:
        n = dest.nbytes
        have = self._end - self._start
        if have:
            k = min(have, n)
            dest[:k] = self._view[self._start:self._start + k]
            self._start += k
            if k == n:
                return
            dest = dest[k:]
            n -= k
        if n >= self.SCRATCH_BYTES // 2:
            got = 0
            while got < n:
                k = self._sock.recv_into(dest[got:])
                if k == 0:
                    raise ConnectionError("the worker closed the connection")
                got += k
            return
        self._start = 0
        self._end = 0
        while self._end < n:
            k = self._sock.recv_into(self._view[self._end:])
            if k == 0:
                raise ConnectionError("the worker closed the connection")
            self._end += k
        dest[:] = self._view[:n]
        self._start = n

    def read(self, n: int) -> bytearray:
        out = bytearray(n)
        self.read_into(memoryview(out))
        return out


class TcpTransport:
    """One connection to the worker's data-transfer server, reopened after a failure."""

    def __init__(self, data_address: str, pool: Optional[BufferPool] = None):
        self._address = parse_address(data_address, "data transfer")
        self._pool = pool
        self._where = f"data transfer from {self._address[0]}:{self._address[1]}"
        self._sock: Union[socket.socket, None] = None
        self._receiver: Union[_Receiver, None] = None

    def _connect(self) -> tuple[socket.socket, _Receiver]:
        if self._sock is None:
            host, port = self._address
            sock = socket.create_connection((host.strip("[]"), port), timeout=GET_ELEMENTS_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
            self._receiver = _Receiver(sock)
        return self._sock, self._receiver

    def get(self, request: worker_pb2.GetElementsRequest) -> tuple[worker_pb2.ElementChunk, ReceivedFrame]:
        try:
            sock, receiver = self._connect()
            body = request.SerializeToString()
            sock.sendall(REQUEST_HEADER.pack(len(body)) + body)
            header_len, prefix_len, frame_len = RESPONSE_HEADER.unpack(receiver.read(RESPONSE_HEADER.size))
            raw = receiver.read(header_len)
            prefix = receiver.read(prefix_len)
            buffers = []
            if prefix_len:
                sizes = buffer_sizes(prefix)
                if prefix_len + sum(sizes) != frame_len:
                    raise WireFormatError(f"the response announced a {frame_len}-byte frame, whose prefix says "
                                          f"{prefix_len + sum(sizes)}")
                for n in sizes:
                    # Not a bytearray: no zeroing of memory about to be overwritten.
                    buffer = self._pool.take(n) if self._pool is not None else np.empty(n, np.uint8)
                    receiver.read_into(memoryview(buffer))
                    buffers.append(buffer)
        except OSError as exc:
            self.close()
            raise TransientError(f"data transfer from {self._where}: {exc}") from exc
        except WireFormatError as exc:
            self.close()
            raise errors.ServiceError(f"{self._where} sent a malformed response (is it a dataservice worker's "
                                      f"data-transfer port?): {exc}") from exc
        header = worker_pb2.ElementChunk.FromString(bytes(raw))
        if header.error_type == "NotFound":
            raise TransientError(header.error_message)
        if header.error_type == "InvalidArgument":
            raise errors.InvalidRequestError(header.error_message)
        return header, ReceivedFrame(prefix, buffers)

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._receiver = None


def connect(task: dispatcher_pb2.TaskDef, pool: Optional[BufferPool] = None) -> Union[TcpTransport, GrpcTransport]:
    """The fastest transport the task's worker offers; ``pool`` supplies TCP's receive buffers."""
    if task.data_address:
        return TcpTransport(task.data_address, pool)
    return GrpcTransport(task.worker_address)
