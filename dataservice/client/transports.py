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
import hmac
import logging
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Optional, Sequence, Union

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from dataservice import errors
from dataservice.client.buffer_pool import BufferPool
from dataservice.client.shared_segments import MappedSegments
from dataservice.proto import dispatcher_pb2, worker_pb2, worker_pb2_grpc
from dataservice.service.addresses import channel_address, parse_address
from dataservice.service.auth import NONCE_KEY, PROOF_KEY, ClusterAuth, check_proof, client_proof, new_nonce, \
    server_proof
from dataservice.service import cross_memory
from dataservice.service.rpc import GrpcFailure, make_channel, translate
from dataservice.service.config import DATA_TRANSFER_PROTOCOLS as WORKER_PROTOCOLS
from dataservice.service.data_transfer import (CHALLENGE_BYTES, HELLO_MAGIC, REQUEST_HEADER, RESPONSE_HEADER,
                                               TOO_MANY_CONNECTIONS, UNAUTHENTICATED, recv_into_exact)
from dataservice.service.endpoint_probe import DATA_TRANSFER_GREETING
from dataservice.service.auto_compression import LinkMeter
from dataservice.service.frame_compression import decompress_frame, request_compression
from dataservice.service.host_identity import host_id
from dataservice.service.tls import FIX_CA, TlsSettings, describe_tls_failure, grpc_handshake_error, \
    is_tls_record
from dataservice.service.wire import WireFormatError, buffer_sizes, decode_frame, split_frame

if TYPE_CHECKING:  # local_transport imports this module
    from dataservice.client.local_transport import LocalTransport

__all__ = ["connect", "TransientError", "GrpcTransport", "TcpTransport", "ReceivedFrame", "ANSWER_TIMEOUT_S",
           "CONNECT_TIMEOUT_S", "DATA_TRANSFER_PROTOCOLS", "received_bytes"]

log = logging.getLogger("dataservice.client")

#: The longest a worker may keep a reader waiting for the next bytes of an answer. A worker answers
#: within its wait for a first element (at most 5 s) plus its wait for a task it has not heard of
#: yet (at most 5 s); past this it is stuck (stopped, or wedged), and the reader tries again —
#: its own ``timeout_ms`` decides when to give up on every worker.
ANSWER_TIMEOUT_S = 15.0
#: The longest a connection to a worker may take to open.
CONNECT_TIMEOUT_S = 5.0
#: The longest a whole gRPC answer may take: it can be a frame of up to 8 MiB cut in messages.
GRPC_ANSWER_TIMEOUT_S = 60.0
#: A response header is a few numbers per element run: anything longer is not one of ours.
MAX_HEADER_BYTES = 64 * 1024 * 1024
#: The longest refusal a worker at its connection limit sends in place of the handshake's CHALLENGE.
_MAX_REFUSAL_BYTES = 4096
#: A connection unused for this long is checked for a close by the worker (idle) before a request. Not
#: every time: the check is a system call, which lets the consumer's thread take the GIL for up to 5 ms
#: in a busy reader. A worker that closed it sooner (an idle timeout this short) costs a retry instead.
IDLE_CHECK_AFTER_S = 0.05


_received_lock = threading.Lock()
_received = {"tcp": 0, "memory": 0, "grpc": 0}


def received_bytes() -> dict[str, int]:
    """Bytes of element frames this process received from workers so far, by the way they came: ``"tcp"``
    (the data-transfer socket), ``"memory"`` (large arrays copied from a same-host worker's memory) and
    ``"grpc"``. A diagnostic of the path reads took (tests/test_multihost.py checks that a read across
    hosts came over TCP); it counts frames as they came (compressed ones compressed), not the protocol's headers.

    Example::

        >>> received_bytes()
        {'tcp': 26218496, 'memory': 0, 'grpc': 0}
    """
    with _received_lock:
        return dict(_received)


def _count_received(**counts: int) -> None:
    with _received_lock:  # once per frame, from each fetcher thread
        for how, n in counts.items():
            _received[how] += n


class TransientError(Exception):
    """The worker could not answer now; try again. ``answered`` is True when the worker did answer
    (it does not hold the task yet, or any more): it is reachable."""

    def __init__(self, message: str, answered: bool = False):
        super().__init__(message)
        self.answered = answered


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
    """GetElements over gRPC. ``compression`` is ``distribute``'s (checked): under "AUTO" a worker on this host
    (``same_host``: see ``connect``) is asked for none, as for None."""

    def __init__(self, worker_address: str, auth: Optional[ClusterAuth] = None, tls: Optional[TlsSettings] = None,
                 compression: Optional[str] = None, same_host: bool = False):
        self._what = f"worker {worker_address}"
        #: What this transport asks the worker for (``GetElementsRequest.compression``).
        self.compression = request_compression(compression, same_host, False)
        self._auth = auth
        #: Under "AUTO", what this channel's answers measure, sent in each request (as TcpTransport.link).
        self.link = LinkMeter()
        self._channel = make_channel(channel_address(worker_address, "worker"), auth, tls)
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)

    def get(self, request: worker_pb2.GetElementsRequest) -> tuple[worker_pb2.ElementChunk, ReceivedFrame]:
        auto = (self.compression or request.compression) == "AUTO"
        if self.compression or auto:
            compressed = worker_pb2.GetElementsRequest()
            compressed.CopyFrom(request)
            if self.compression:
                compressed.compression = self.compression
            if auto:
                self.link.fill(compressed)  # what the worker decides on (auto_compression)
            request = compressed
        try:
            data = bytearray()
            head = None
            head_at, alone = 0.0, False  # when the header came, and whether alone (a worker asked for AUTO)
            nonce = new_nonce() if self._auth is not None else None
            call = self._stub.GetElements(request, timeout=GRPC_ANSWER_TIMEOUT_S,
                                          metadata=((NONCE_KEY, nonce.hex()),) if nonce else None)
            if nonce is not None:
                # Before a byte of it is decoded (elements may be pickles): the worker must hold the token.
                metadata = call.initial_metadata()
                if PROOF_KEY not in dict(metadata or ()) and call.done():
                    for _ in call:  # it failed before answering (unreachable, refused): raise why, below
                        pass
                check_proof(self._auth, nonce, metadata, f"GetElements from {self._what}")
            for chunk in call:
                if head is None:
                    head, head_at, alone = chunk, time.perf_counter(), not chunk.data
                data += chunk.data
        except grpc.RpcError as exc:
            code = exc.code()
            handshake_error = grpc_handshake_error(exc.details() or "")
            if code == grpc.StatusCode.UNAVAILABLE and handshake_error is not None:
                # A certificate refused, or TLS on one side only: retrying cannot help.
                why = describe_tls_failure(Exception(handshake_error), self._what)
                raise (errors.WrongEndpointError if "does not speak TLS" in why
                       else errors.PermissionDeniedError)(f"GetElements from {self._what}: {why}") from GrpcFailure(exc)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.CANCELLED):
                raise TransientError(str(exc.details()), answered=code == grpc.StatusCode.NOT_FOUND) \
                    from GrpcFailure(exc)
            raise translate(exc, f"GetElements for task {request.task_id} from {self._what}") from GrpcFailure(exc)
        except ValueError as exc:  # grpc's word for a channel that interrupt() closed under us
            raise TransientError(f"{self._what}: {exc}") from None
        if head is None:
            head = worker_pb2.ElementChunk()
        head.data = b""
        if not data:
            return head, ReceivedFrame(bytearray(), [])
        _count_received(grpc=len(data))
        if auto and alone:
            # Under AUTO the worker sends the header alone first: the frame's transfer is what came after it.
            self.link.received(len(data), time.perf_counter() - head_at)
        try:
            if head.compression:
                started = time.perf_counter()
                frame = ReceivedFrame(*decompress_frame(head, data))
                if auto:
                    self.link.decompressed(frame.nbytes, time.perf_counter() - started)
                    self.link.answered(head, frame.nbytes)
                return head, frame
            if auto:
                self.link.answered(head, len(data))
            return head, ReceivedFrame(*split_frame(data))
        except WireFormatError as exc:
            raise errors.ServiceError(f"{self._what} sent a malformed frame: {exc}") from exc

    def interrupt(self) -> None:
        """From another thread: ends a call in flight (the reader is closing)."""
        self._channel.close()

    def close(self) -> None:
        self._channel.close()


class _Receiver:
    """Reads exact byte counts from a socket. Small reads are served from a scratch buffer
    filled by one ``recv`` (a small response costs one system call, not one per field);
    large ones go straight into their destination, with no copy in Python."""

    SCRATCH_BYTES = 64 * 1024

    def __init__(self, sock: socket.socket, where: str = "the worker"):
        self._where = where
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
            if not recv_into_exact(self._sock, dest):
                raise ConnectionError("the worker closed the connection")
            return
        self._start = 0
        self._end = 0
        while self._end < n:
            k = self._sock.recv_into(self._view[self._end:])
            if k == 0:
                if is_tls_record(bytes(self._view[:min(self._end, 2)])):  # the data_server's answer to plaintext
                    raise errors.WrongEndpointError(_plaintext_to_tls(self._where))
                raise ConnectionError("the worker closed the connection")
            self._end += k
        dest[:] = self._view[:n]
        self._start = n

    def read(self, n: int) -> bytearray:
        out = bytearray(n)
        self.read_into(memoryview(out))
        return out

    @property
    def buffered(self) -> int:
        """Bytes received and not read yet."""
        return self._end - self._start


def _plaintext_to_tls(where: str) -> str:
    return f"{where} speaks TLS, and this client speaks plaintext: the cluster uses TLS: {FIX_CA}"


def _recv_upto(sock: socket.socket, n: int) -> bytes:
    """Up to ``n`` bytes: fewer only if the peer closed the connection first."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            break
        got += k
    return bytes(buf[:got])


class TcpTransport:
    """One connection to the worker's data-transfer server, reopened after a failure.

    With ``auth`` (the cluster's token), each new connection starts with the handshake that
    ``dataservice.service.data_transfer`` describes: nothing the worker sends is decoded before
    it proved it holds the token, and a worker that cannot, or that refuses ours, raises
    ``PermissionDeniedError`` (retrying would not help).

    With ``memory_reads`` (and a worker on this host that allows it, which a probe on each new
    connection tells, after the handshake), large arrays are copied straight out of the worker's
    memory (``dataservice.service.cross_memory``) rather than read from the socket.

    With ``tls`` (a client's ``TlsSettings``) each connection is TLS from its first byte, the
    worker's certificate verified against the CA and its host name checked; the token's handshake
    and the memory-read probe run inside it. A certificate refused by either side raises
    ``PermissionDeniedError``, TLS on one side only ``WrongEndpointError``: retrying cannot help.

    A worker closes a connection left idle (``data_idle_timeout_ms``): before each request this
    transport looks whether the worker closed it, and if so opens a new one, unseen by the caller
    (the worker read no request on the old one, so nothing is lost or sent twice). A worker at its
    connection limit (``data_max_connections``) refuses a new connection with a message naming the
    limit: ``TransientError``, which the reader retries with backoff like a worker it cannot reach.
    """

    def __init__(self, data_address: str, pool: Optional[BufferPool] = None, memory_reads: bool = True,
                 auth: Optional[ClusterAuth] = None, tls: Optional[TlsSettings] = None,
                 compression: Optional[str] = None, same_host: bool = False):
        self._address = parse_address(data_address, "data transfer")
        self._auth = auth
        self._tls = tls
        self._pool = pool
        self._where = f"data transfer from {self._address[0]}:{self._address[1]}"
        self._worker = f"worker at {self._address[0]}:{self._address[1]}"
        self._sock: Union[socket.socket, None] = None
        self._receiver: Union[_Receiver, None] = None
        self._closed_check: Optional[select.poll] = None  # tells whether the worker closed the connection
        self._last_used = 0.0  # when the last answer came (monotonic)
        #: Connections reopened because the worker had closed them (idle): for tests and diagnostics.
        self.reopened = 0
        # A named codec compresses on every connection, and memory reads never are: it does without them.
        self._memory_reads = memory_reads and cross_memory.available() and compression in (None, "AUTO")
        self._compression = compression
        self._same_host = same_host  # the worker is on this host (see connect)
        #: What this connection asks the worker for (``GetElementsRequest.compression``): decided when it opens,
        #: by ``frame_compression.request_compression`` — under "AUTO", none from a worker on this host.
        self.compression = ""
        #: The worker's pid while this connection copies large arrays from its memory; else None.
        self.memory_pid: Optional[int] = None
        self._unread = False  # the last answer's arrays could not be copied: the worker takes them back
        #: Under "AUTO", what this connection's answers measure (the link's rate, our decompress speed),
        #: sent in each request: the worker compresses when it pays (``auto_compression``). Kept across
        #: reconnections: the path to the worker stays.
        self.link = LinkMeter()
        self._answer_at = 0.0  # when the last answer's first bytes came (perf_counter)
        self._answer_unread = 0  # bytes of it (header and frame) not received yet then
        # A worker's shared batch segments mapped through this connection (worker.shared_batches): with memory
        # reads, large batches are mapped, not copied. Off for good once mapping failed (copies go on).
        self._segments = MappedSegments()
        self._shared = self._memory_reads

    def _closed_by_worker(self) -> bool:
        """Whether the worker closed our connection while it was idle (checked after IDLE_CHECK_AFTER_S
        unused: see there)."""
        return time.monotonic() - self._last_used >= IDLE_CHECK_AFTER_S and self._worker_closed()

    def _worker_closed(self) -> bool:
        """Whether the worker closed our connection: between two requests it sends nothing, so anything
        readable now is its close (or a reset, or bytes that make no sense). One poll(2) on the socket;
        under TLS the close is readable there too."""
        if self._closed_check is None:
            return False
        try:
            return bool(self._closed_check.poll(0))
        except OSError:
            return True

    def _connect(self) -> tuple[socket.socket, _Receiver]:
        if self._sock is not None and self._closed_by_worker():
            log.debug("%s: the worker closed the connection (idle): opening a new one", self._where)
            self.close()
            self.reopened += 1
        if self._sock is None:
            host, port = self._address
            sock = socket.create_connection((host.strip("[]"), port), timeout=CONNECT_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                try:  # the handshake, within CONNECT_TIMEOUT_S
                    sock = self._tls.client_context().wrap_socket(sock, server_hostname=host.strip("[]"))
                except BaseException:
                    sock.close()
                    raise
            sock.settimeout(ANSWER_TIMEOUT_S)  # per receive: a stuck worker cannot hold the reader
            self._sock = sock  # from here on, interrupt() can wake a receive on it, and close() closes it
            self._unread = False  # a new connection: the worker dropped what it held for the old one
            self._segments.reset()  # and let go of the segments the old one was lent
            self.memory_pid = None
            try:
                if self._auth is not None:
                    self._handshake(sock, self._auth)
                receiver = _Receiver(sock, self._worker)
                self.memory_pid = self._probe(sock, receiver) if self._memory_reads else None
                self.compression = request_compression(self._compression, self._same_host,
                                                       self.memory_pid is not None)
            except BaseException:
                self.close()
                raise
            self._receiver = receiver
            self._closed_check = select.poll()
            self._closed_check.register(sock.fileno(), select.POLLIN)
        return self._sock, self._receiver

    def _handshake(self, sock: socket.socket, auth: ClusterAuth) -> None:
        """Proves to the worker that we hold the token, and has it prove the same to us before we read
        anything else from it. Our proof goes out without waiting: the worker checks it before it reads
        the request that follows, and answers a wrong one with an "Unauthenticated" header."""
        client_nonce = new_nonce()
        sock.sendall(HELLO_MAGIC + client_nonce)
        answer = _recv_upto(sock, CHALLENGE_BYTES)
        self._raise_if_refused(sock, answer)
        if len(answer) < CHALLENGE_BYTES:
            if is_tls_record(answer):  # the data_server's answer to plaintext, with TLS on
                raise errors.WrongEndpointError(_plaintext_to_tls(self._worker))
            if answer.startswith(DATA_TRANSFER_GREETING.rstrip(b"\n")):  # it read our HELLO as text
                raise errors.PermissionDeniedError(
                    f"{self._worker} runs without an auth token, but this client has one: every member of the "
                    f"cluster needs the same token")
            raise ConnectionError(f"the worker closed the connection during the handshake "
                                  f"(after {len(answer)} of {CHALLENGE_BYTES} bytes)")
        server_nonce, proof = answer[:len(client_nonce)], answer[len(client_nonce):]
        if not hmac.compare_digest(proof, server_proof(auth, client_nonce, server_nonce)):
            # With two tokens, each side finds the other's proof wrong: we cannot tell whose token is the cluster's.
            raise errors.PermissionDeniedError(
                f"{self._worker} does not hold the cluster token (a wrong proof: it is not a member of this "
                f"cluster, or this client's token is not the cluster's) — nothing it sent was loaded")
        sock.sendall(client_proof(auth, client_nonce, server_nonce))

    def _raise_if_refused(self, sock: socket.socket, answer: bytes) -> None:
        """A worker at its connection limit answers a HELLO with a response header (its prefix and frame
        lengths: 16 zero bytes, which a random nonce is not) carrying ``TOO_MANY_CONNECTIONS``: raises
        ``TransientError`` with its message. Only a protobuf is decoded, never a pickle, and only that
        error is believed: anything else goes on to the proof check, which fails."""
        if answer[4:RESPONSE_HEADER.size] != bytes(RESPONSE_HEADER.size - 4):
            return
        header_len = RESPONSE_HEADER.unpack(answer[:RESPONSE_HEADER.size])[0]
        if header_len > _MAX_REFUSAL_BYTES:
            return
        raw = answer[RESPONSE_HEADER.size:] + _recv_upto(sock, max(RESPONSE_HEADER.size + header_len - len(answer), 0))
        try:
            header = worker_pb2.ElementChunk.FromString(raw[:header_len])
        except DecodeError:
            return
        if header.error_type == TOO_MANY_CONNECTIONS:
            raise TransientError(f"{self._worker} refused the connection: {header.error_message}")

    def _exchange(self, sock: socket.socket, receiver: _Receiver, request: worker_pb2.GetElementsRequest
                  ) -> tuple[worker_pb2.ElementChunk, bytearray, int]:
        """Sends a request; returns the answer's header, its frame's prefix and the frame's length."""
        body = request.SerializeToString()
        sock.sendall(REQUEST_HEADER.pack(len(body)) + body)
        header_len, prefix_len, frame_len = RESPONSE_HEADER.unpack(receiver.read(RESPONSE_HEADER.size))
        # The answer has begun to arrive (the worker sends it in one go once it is ready): the clock of its
        # transfer, for AUTO compression's measure of the link.
        self._answer_at, self._answer_unread = time.perf_counter(), header_len + frame_len - receiver.buffered
        if header_len > MAX_HEADER_BYTES or prefix_len > frame_len:
            raise WireFormatError(f"a response header of {header_len} bytes, a prefix of {prefix_len} bytes "
                                  f"in a frame of {frame_len}")
        raw = receiver.read(header_len)
        try:
            header = worker_pb2.ElementChunk.FromString(bytes(raw))
        except DecodeError as exc:
            raise WireFormatError(f"an unreadable response header: {exc}") from exc
        if header.error_type == UNAUTHENTICATED:
            # The worker refused us (no token, or another one) and closes: not a failure to retry.
            raise errors.PermissionDeniedError(f"{self._worker} refused this client: {header.error_message}")
        if header.error_type == TOO_MANY_CONNECTIONS:
            # Sent as it accepted us, before reading our request; it closes. Another time there may be room.
            self.close()
            raise TransientError(f"{self._worker} refused the connection: {header.error_message}")
        return header, receiver.read(prefix_len), frame_len

    def _probe(self, sock: socket.socket, receiver: _Receiver) -> Optional[int]:
        """The worker's pid if we can copy from its memory: we read the token it publishes both from
        its memory and from the socket, and they must agree."""
        header, token, _ = self._exchange(sock, receiver, worker_pb2.GetElementsRequest(probe_memory=True))
        if not header.worker_pid or len(header.buffer_addresses) != 1 or header.buffer_lengths[0] != len(token):
            return None
        copied = np.zeros(len(token), np.uint8)
        try:
            cross_memory.read_into(header.worker_pid, [copied], header.buffer_addresses, header.buffer_lengths)
        except (OSError, EOFError) as exc:
            log.info("%s: copying from the worker's memory is not possible (%s): large arrays come over TCP",
                     self._where, exc)
            return None
        if copied.tobytes() != bytes(token):
            log.info("%s: pid %d is not the worker (another pid namespace?): large arrays come over TCP",
                     self._where, header.worker_pid)
            return None
        # Checked once the pid is known to be the worker's. The same kernel but another network: another host
        # as far as we are concerned (a container sharing the host's pids, a test's simulated host).
        if not cross_memory.same_network_namespace(header.worker_pid):
            log.info("%s: the worker (pid %d) is in another network namespace: large arrays come over TCP",
                     self._where, header.worker_pid)
            return None
        log.debug("%s: the worker (pid %d) is on this host: copying large arrays from its memory", self._where,
                  header.worker_pid)
        return header.worker_pid

    def _take(self, n: int) -> np.ndarray:
        # Not a bytearray: no zeroing of memory about to be overwritten.
        return self._pool.take(n) if self._pool is not None else np.empty(n, np.uint8)

    def get(self, request: worker_pb2.GetElementsRequest) -> tuple[worker_pb2.ElementChunk, ReceivedFrame]:
        try:
            sock, receiver = self._connect()
            mine = worker_pb2.GetElementsRequest()
            mine.CopyFrom(request)
            mine.read_memory = self.memory_pid is not None
            mine.shared_memory = mine.read_memory and self._shared
            mine.previous_unread, self._unread = self._unread, False
            mine.returned_segments.extend(self._segments.returnable())
            if self.compression:
                mine.compression = self.compression
            auto = mine.compression == "AUTO"
            if auto:
                self.link.fill(mine)  # what the worker decides on (auto_compression)
            header, prefix, frame_len = self._exchange(sock, receiver, mine)
            buffers = []
            wire_bytes = len(prefix)
            if header.compression and prefix:
                # The frame is its compressed segments, all in the "prefix" (frame_compression).
                if frame_len != len(prefix) or header.buffer_addresses:
                    raise WireFormatError(f"a compressed answer of {len(prefix)} bytes announced a {frame_len}-byte "
                                          f"frame")
                if auto:
                    self._measure_link()
                started = time.perf_counter()
                prefix, buffers = decompress_frame(header, prefix)
                if auto:
                    size = sum(header.uncompressed_lengths)
                    self.link.decompressed(size, time.perf_counter() - started)
                    self.link.answered(header, size)
            elif prefix:
                sizes = buffer_sizes(prefix)
                by_address = bool(header.buffer_addresses)
                expected = len(prefix) + (0 if by_address else sum(sizes))
                if frame_len != expected or (by_address and len(header.buffer_addresses) != len(sizes)):
                    raise WireFormatError(f"the response announced a {frame_len}-byte frame; its prefix says "
                                          f"{expected} bytes, {len(sizes)} buffers")
                if by_address:
                    if self.memory_pid is None:
                        raise WireFormatError("an answer by address to a request for bytes")
                    buffers = self._from_worker(header, sizes)
                    if self._worker_closed():
                        # Closed, the worker frees these arrays soon after (DataServer._close): the copy may
                        # have read memory already reused. Dropped, not a byte of it used: a worker that stopped
                        # has its splits redone without them (the reader never said it held them).
                        raise OSError("the worker closed the connection while its answer was copied from its "
                                      "memory; the copy is dropped")
                else:
                    buffers = [self._take(n) for n in sizes]
                    for buffer in buffers:
                        receiver.read_into(memoryview(buffer))
                    if auto:
                        self._measure_link()
                        self.link.answered(header, frame_len)
        except ssl.SSLError as exc:
            self.close()
            if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):  # the worker went away mid-stream
                raise TransientError(f"{self._where}: {exc}") from exc
            why = describe_tls_failure(exc, self._worker)
            raise (errors.WrongEndpointError if "does not speak TLS" in why
                   else errors.PermissionDeniedError)(f"{self._where}: {why}") from exc
        except OSError as exc:
            self.close()
            raise TransientError(f"{self._where}: {exc}") from exc
        except WireFormatError as exc:
            self.close()
            raise errors.ServiceError(f"{self._where} sent a malformed response (is it a dataservice worker's "
                                      f"data-transfer port?): {exc}") from exc
        except errors.DataServiceError:
            self.close()  # refused (or unproven) at the handshake: the connection is over
            raise
        self._last_used = time.monotonic()
        if header.compression and wire_bytes:
            _count_received(tcp=wire_bytes)
        elif prefix:
            out_of_band = sum(b.nbytes for b in buffers)
            by_memory = bool(header.buffer_addresses)
            _count_received(tcp=len(prefix) + (0 if by_memory else out_of_band), memory=out_of_band if by_memory else 0)
        if header.error_type == "NotFound":
            raise TransientError(header.error_message, answered=True)
        if header.error_type == "PermissionDenied":  # a wrong read key: retrying cannot help
            raise errors.PermissionDeniedError(f"{self._where}: {header.error_message}")
        if header.error_type == "InvalidArgument":
            raise errors.InvalidRequestError(header.error_message)
        return header, ReceivedFrame(prefix, buffers)

    def _measure_link(self) -> None:
        """The answer just read came whole over the socket: the link's rate, from its first bytes to its last."""
        self.link.received(self._answer_unread, time.perf_counter() - self._answer_at)

    def _from_worker(self, header: worker_pb2.ElementChunk, sizes: list) -> list:
        """The answer's out-of-band buffers from the worker's memory: mapped where it names a shared segment,
        else copied."""
        segments = header.buffer_segments
        if not segments:
            buffers = [self._take(n) for n in sizes]
            self._copy_from_worker(header, buffers, range(len(buffers)))
            return buffers
        if len(segments) != len(sizes) or not (len(header.segment_fds) == len(header.segment_inodes)
                                               == len(header.segment_offsets) == len(sizes)):
            raise WireFormatError(f"an answer names shared segments for {len(segments)} of {len(sizes)} buffers")
        buffers: list = [None] * len(sizes)
        mapped = 0
        try:
            for i, segment_id in enumerate(segments):
                if segment_id:
                    # From the pid the probe checked, not whatever a header says.
                    buffers[i] = self._segments.view(self.memory_pid, segment_id, header.segment_fds[i],
                                                     header.segment_inodes[i], header.segment_offsets[i], sizes[i])
                    mapped += 1
        except (OSError, ValueError) as exc:
            # The worker takes the answer back (previous_unread, which also returns its segments); from now
            # on this connection copies, as a reader without shared batches does.
            self._segments.drop_unreturned(mapped)
            log.warning("%s: mapping the worker's shared batch failed (%s): large arrays are copied from now on",
                        self._where, exc)
            self._shared = False
            self._unread = True
            raise TransientError(f"{self._where}: mapping the worker's shared batch failed: {exc}") from None
        copied = [i for i, segment_id in enumerate(segments) if not segment_id]
        for i in copied:
            buffers[i] = self._take(sizes[i])
        if copied:
            try:
                self._copy_from_worker(header, buffers, copied)
            except TransientError:
                self._segments.drop_unreturned(mapped)
                raise
        return buffers

    def _copy_from_worker(self, header: worker_pb2.ElementChunk, buffers: list, which: Sequence[int]) -> None:
        try:
            # From the pid the probe checked, not whatever a header says.
            cross_memory.read_into(self.memory_pid, [buffers[i] for i in which],
                                   [header.buffer_addresses[i] for i in which],
                                   [header.buffer_lengths[i] for i in which])
        except (OSError, EOFError, ValueError) as exc:
            # The worker still holds these elements: our next request tells it to take them back,
            # and asks for bytes over the socket from then on.
            log.warning("%s: copying from the worker's memory failed (%s): large arrays come over TCP from now on",
                        self._where, exc)
            self.memory_pid = None
            self._unread = True
            raise TransientError(f"{self._where}: copying from the worker's memory failed: {exc}") from None

    def interrupt(self) -> None:
        """From another thread: wakes a receive in flight, which then fails (the reader is closing).
        Only shuts the socket down: the fetcher's thread still owns and closes it."""
        sock = self._sock
        if sock is not None:
            try:
                # The plain socket's shutdown: an SSLSocket's would also drop its TLS state under the
                # receive in flight, which would then read raw bytes.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._receiver = None
                self._closed_check = None
                # Closed, the worker orphans what this connection was lent: our mappings go with the arrays.
                self._segments.reset()


#: What ``distribute(data_transfer_protocol=...)`` accepts: None for the fastest a worker offers.
DATA_TRANSFER_PROTOCOLS = (None, *WORKER_PROTOCOLS)


def connect(task: dispatcher_pb2.TaskDef, pool: Optional[BufferPool] = None, protocol: Optional[str] = None,
            auth: Optional[ClusterAuth] = None, tls: Optional[TlsSettings] = None,
            compression: Optional[str] = None, in_process: bool = False
            ) -> Union[TcpTransport, GrpcTransport, "LocalTransport"]:
    """A transport to the task's worker: by default the fastest it offers (memory reads on this host, else
    TCP, else gRPC); ``protocol="tcp"`` never reads its memory, ``"grpc"`` uses gRPC. ``pool`` supplies
    TCP's receive buffers; ``tls`` makes either speak TLS. ``in_process`` (``target_workers="LOCAL"``): a
    worker of this process is read in process (``local_transport``: no RPC, no copy). ``compression`` is ``distribute``'s (None, "AUTO" or a
    codec): each transport decides per connection what to ask the worker for (``frame_compression``); under
    "AUTO", none from a worker on this host (``task.worker_host_id`` is ``host_identity.host_id()``, as for
    ``target_workers``)."""
    same_host = bool(task.worker_host_id) and task.worker_host_id == host_id()
    if in_process:
        # Imported here: local_transport builds on this module (TransientError).
        from dataservice.client.local_transport import in_process
        local = in_process(task)
        if local is not None:
            return local
    if task.data_address and protocol != "grpc":
        return TcpTransport(task.data_address, pool, memory_reads=protocol is None, auth=auth, tls=tls,
                            compression=compression, same_host=same_host)
    return GrpcTransport(task.worker_address, auth, tls, compression, same_host)
