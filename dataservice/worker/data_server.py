"""The TCP data-transfer server: elements straight from numpy buffers to the socket.

gRPC stays the control plane; this is the data plane's fast path (tf.data
service has a pluggable data-transfer protocol for the same reason). A reader
opens one connection per task and sends requests; each answer is sent with
one ``sendmsg`` of the header and the frame's buffers, so an array's bytes go
from its numpy buffer to the kernel without a copy in Python. The messages are
framed as ``dataservice.service.data_transfer`` says.

A reader learns from the prefix how large each out-of-band buffer (a large
array) is and reads each into a buffer of its own (``dataservice.service.wire``).

On one host a reader may instead copy the out-of-band buffers out of the
worker's memory itself (``dataservice.service.cross_memory``): it asks with
``read_memory``, and the answer carries their addresses instead of their
bytes. The worker keeps that answer's arrays alive until the reader's next
request on the connection; a reader that could not copy them says so in that
request (``previous_unread``) and the elements go back to the task. A connection
closed meanwhile (the worker stopping) keeps them ``HELD_AFTER_CLOSE_S`` longer,
and a reader that finds it closed once it copied drops the copy: what it copied may
come from memory already reused.

**Threads and limits.** No connection has a thread of its own. Every connection's socket is
registered, edge-triggered, in one epoll set, and a bounded pool of serving threads (at most
``serving_threads``, started only when all the others are busy) waits on it. The thread that wakes
for a connection claims it, reads what arrived (without blocking), and once a request is whole
answers it itself — no hand-over between threads, and no system call to re-arm the connection
afterwards, on the hot path. Bytes that arrive while a connection is claimed mark it, and its thread
reads on before it lets go. A connection waiting for bytes holds no thread, only its descriptor and a
few hundred bytes. A housekeeping thread closes, about once a second (or a quarter of the shortest
timeout), connections past their deadline:

- idle: no request begun for ``idle_timeout_s`` (readers reconnect on their next request);
- incomplete: a request not whole within ``request_timeout_s`` of its first byte;
- handshakes: the TLS handshake and the token's handshake must be done within
  ``HANDSHAKE_TIMEOUT_S`` (or ``request_timeout_s``, if shorter) of the connection's opening.

A length prefix above ``MAX_REQUEST_BYTES`` closes the connection at once. At most
``max_connections`` connections are served; a connection beyond them is answered at once with a
``TOO_MANY_CONNECTIONS`` error naming the limit and closed (the client retries later). Accept
failures (out of file descriptors: EMFILE, ENFILE; out of kernel memory: ENOBUFS, ENOMEM) are
never fatal: the listener pauses (10 ms, doubling to 1 s) and tries again, and each kind is
logged at most once a minute with the number of failures since; a connection lost before it was
accepted (ECONNABORTED) is logged likewise and accepting goes on at once. With TLS the handshake runs
non-blocking in the same threads, and a connection is let go only once TLS holds no decrypted bytes
(which no epoll event would report). Where there is no epoll (macOS) a portable set
(``_SelectorSet``) gives the same guarantees with a little more work per request.

**Sending.** An answer is sent by the serving thread that prepared it, with one blocking ``sendmsg``
(plaintext sockets stay in blocking mode and are read with ``MSG_DONTWAIT``, so the kernel waits for
room without the GIL). A reader that takes none of its bytes for ``send_timeout_s`` (default
``SEND_STALL_TIMEOUT_S``, 60 s, and never below ``request_timeout_s``; the kernel's ``SO_SNDTIMEO``)
is closed, and the answer's elements go back to the task. The clock runs only while no byte moves:
a slow but live reader (a training loop that drains a large frame slowly) is never cut off; only a
stopped or wedged one is, and it holds a serving thread no longer than that. (A reader's fetcher
thread reads an answer whole as soon as it arrives, whatever its consumer does, so a minute without
progress means the process is stopped.)

A connection that opens with text (the HTTP/2 preface of a gRPC client given this port
as the dispatcher's address, an HTTP request, a person with ``nc``) gets
``endpoint_probe.DATA_TRANSFER_GREETING``, "dataservice data-transfer port", and is
closed: that client's probe can then name the mistake. A connection that sends anything
else is closed; the server goes on.

With the cluster's token (``auth``), a connection must first pass the handshake that
``dataservice.service.data_transfer`` describes: the server reads no request, and answers
no memory-read probe, before the peer proved it holds the token. A peer that does not is
answered with an "Unauthenticated" error header and closed; one that does not finish the
handshake in time is closed. Refusals are logged at most once a minute.

With TLS (``tls``: the worker's ``dataservice.service.tls.TlsSettings``) every connection is TLS
from its first byte; under mutual TLS the client's certificate must verify against the client CA.
The token's handshake, the memory-read probe and the requests then run inside TLS. A peer whose
first byte does not start a TLS handshake (a plaintext client, ``nc``, an HTTP/2 preface) gets a
TLS alert record (``TLS_PLAINTEXT_ALERT``, which a plaintext dataservice client and
``endpoint_probe`` recognise as TLS) and is closed, its bytes never parsed. ``ssl.SSLSocket`` has
no ``sendmsg``: answers go out with one ``sendall`` per buffer, each encrypted from the numpy
buffer into TLS records (one copy, by OpenSSL).

Example::

    >>> server = DataServer(worker, "[::]:0", idle_timeout_s=300, request_timeout_s=10, max_connections=1024)
    >>> server.start()
    >>> server.port
    41234
"""

from __future__ import annotations

import collections
import errno
import hmac
import logging
import os
import select
import selectors
import socket
import ssl
import struct
import threading
import time
from typing import Any, Optional, Union

import numpy as np

from dataservice import errors
from dataservice.dispatcher.request_checks import check_get_elements
from dataservice.proto import worker_pb2
from dataservice.service.auth import TOKEN_ENV, TOKEN_FILE_ENV, ClusterAuth, client_proof, new_nonce, server_proof
from dataservice.service.cross_memory import address_of
from dataservice.service.data_transfer import (HELLO_BYTES, HELLO_MAGIC, MAX_REQUEST_BYTES, PROOF_BYTES,
                                               REQUEST_HEADER, RESPONSE_HEADER, TOO_MANY_CONNECTIONS,
                                               UNAUTHENTICATED)
from dataservice.service.config import bind_address
from dataservice.service.endpoint_probe import DATA_TRANSFER_GREETING
from dataservice.service.listening import bind_error
from dataservice.service.log_limits import RateLimitedLog
from dataservice.service.tls import TlsSettings
from dataservice.worker.responses import Prepared, ReadKeyError, TaskSource, UnknownTaskError, prepare
from dataservice.worker.shared_batches import SharedBatches

__all__ = ["DataServer", "HANDSHAKE_TIMEOUT_S", "TLS_PLAINTEXT_ALERT", "SEND_STALL_TIMEOUT_S", "SERVING_THREADS"]

log = logging.getLogger("dataservice.worker")

#: Largest number of buffers handed to one sendmsg call (the kernel's IOV_MAX is 1024).
_MAX_IOV = 512
#: Warnings of one kind at most this often: a gRPC channel pointed at this port reconnects every second or
#: so, a flood of connections fails accept() thousands of times a second; one line a minute is enough.
_LOG_INTERVAL_S = 60.0
#: How long a stranger gets to read the greeting and close before we close on it.
_GREETING_LINGER_S = 1.0
#: How long a new connection has, in all, to complete the TLS handshake and the token's handshake (a
#: peer that connects and sends nothing, or trickles, is closed then; ``request_timeout_s`` if shorter).
HANDSHAKE_TIMEOUT_S = 10.0
#: What a TLS data port answers a peer that speaks plaintext: a TLS record, a fatal
#: protocol_version alert (content type 21, TLS 1.2, length 2, level fatal, description 70).
TLS_PLAINTEXT_ALERT = b"\x15\x03\x03\x00\x02\x02\x46"
#: The first byte of a TLS handshake record (a ClientHello).
_TLS_HANDSHAKE = 0x16
#: What we read, and drop, from a refused peer while it reads our answer: nothing more.
_LINGER_DRAIN_BYTES = 64 * 1024
#: The defaults of ``WorkerConfig.data_idle_timeout_ms``, ``data_request_timeout_ms``, ``data_max_connections``.
DEFAULT_IDLE_TIMEOUT_S = 300.0
DEFAULT_REQUEST_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 1024
#: Most threads serving requests at once. A request may wait for elements (up to 5 s for a first one,
#: and up to 5 s for a task not heard of yet), so a busy worker with many readers wants many; the
#: gRPC port has 32. Threads start only as all others are busy.
SERVING_THREADS = 64
#: How long an answer may go without its reader taking a byte of it before the connection is closed.
SEND_STALL_TIMEOUT_S = 60.0
#: Connections beyond the limit being told so (a TLS handshake, the error, the linger) at once; more
#: than these are closed without a word.
_REFUSING_MAX = 64
#: How long the arrays of an answer by address stay alive after its connection closed (see DataServer._close).
HELD_AFTER_CLOSE_S = 2.0
#: Accept failures for want of resources: the listener pauses this long, doubling up to the maximum.
_ACCEPT_BACKOFF_MIN_S = 0.01
_ACCEPT_BACKOFF_MAX_S = 1.0
#: Connections accepted per wake-up before the thread looks at other events.
_ACCEPT_BATCH = 64
#: The longest the housekeeping thread sleeps between two looks at deadlines.
_HOUSEKEEPING_MAX_S = 1.0
_RESOURCE_ERRORS = {
    errno.EMFILE: "EMFILE: this process is out of file descriptors; raise its limit (ulimit -n, LimitNOFILE=) "
                  "or lower --data-max-connections",
    errno.ENFILE: "ENFILE: the system is out of file descriptors (fs.file-max)",
    errno.ENOBUFS: "ENOBUFS: the kernel is out of memory for sockets",
    errno.ENOMEM: "ENOMEM: the kernel is out of memory for sockets",
}
#: A client gave up before we accepted it (or a protocol error on the new socket): only that one is lost.
_ABORTED_ERRORS = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM}

# What a connection is waiting for.
_TLS_START = "its first byte (TLS)"
_TLS_SHAKE = "the TLS handshake"
_HELLO = "the token's HELLO"
_PROOF = "the token's proof"
_REQUEST = "a request"
_LINGER = "the peer to close"


def _is_text(head: bytes) -> bool:
    # A request's length is at most MAX_REQUEST_BYTES, so its high bytes are zero: printable
    # ASCII here ("PRI " of the HTTP/2 preface, "GET ") is never one of our clients.
    return all(0x20 <= b < 0x7f for b in head)


def _peer(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
    except OSError:
        return "a peer that left"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _wait_writable(sock: socket.socket, timeout_s: float) -> None:
    poller = select.poll()  # not select(): descriptors go past FD_SETSIZE with a thousand connections
    poller.register(sock, select.POLLOUT)
    if not poller.poll(timeout_s * 1000):
        raise TimeoutError(f"the peer took no bytes for {timeout_s:g} s")


def _set_send_timeout(sock: socket.socket, timeout_s: float) -> bool:
    """The kernel's bound on a blocking send that moves no byte (SO_SNDTIMEO); False where it cannot be set."""
    seconds = int(timeout_s)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        struct.pack("@ll", seconds, int((timeout_s - seconds) * 1_000_000)))
    except (OSError, struct.error):
        return False
    return True


def _send_all(sock: socket.socket, parts: list, timeout_s: float, blocking: bool = False) -> None:
    """Sends ``parts``; TimeoutError when the peer takes no byte for ``timeout_s``. ``blocking``: the
    socket is in blocking mode with SO_SNDTIMEO at ``timeout_s`` (else it is non-blocking)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg: each buffer is encrypted straight from its memory
        sock.settimeout(timeout_s)  # per write: a clock of no progress, as below
        try:
            for view in views:
                sock.sendall(view)
        finally:
            sock.setblocking(False)
        return
    i = 0
    while i < len(views):
        try:
            # Blocking: the kernel waits for room without the GIL, in one system call for the whole answer
            # when the reader keeps up. SO_SNDTIMEO ends a wait in which no byte moves.
            sent = sock.sendmsg(views[i:i + _MAX_IOV])
        except BlockingIOError:
            if blocking:
                raise TimeoutError(f"the peer took no bytes for {timeout_s:g} s") from None
            _wait_writable(sock, timeout_s)
            continue
        while i < len(views) and sent >= views[i].nbytes:
            sent -= views[i].nbytes
            i += 1
        if sent:
            views[i] = views[i][sent:]


def _error_response(kind: str, message: str) -> worker_pb2.ElementChunk:
    return worker_pb2.ElementChunk(end_of_sequence=True, error_type=kind, error_message=message)


def _framed(header: worker_pb2.ElementChunk, prefix_len: int, frame_len: int) -> bytes:
    raw = header.SerializeToString()
    return RESPONSE_HEADER.pack(len(raw), prefix_len, frame_len) + raw


class _PeerClosed(Exception):
    """The peer closed its side of the connection."""


class _Connection:
    """One data-transfer connection: its socket, what it waits for, and until when."""

    __slots__ = ("sock", "fd", "phase", "buf", "view", "got", "drained", "started", "deadline", "held", "first",
                 "busy", "event", "closed", "refused", "nonces", "dropped", "blocking", "read_flags", "held_segments")

    #: Room for the largest message read before a request is whole: a HELLO, or a request.
    BUFFER_BYTES = max(HELLO_BYTES, REQUEST_HEADER.size + MAX_REQUEST_BYTES)

    def __init__(self, sock: socket.socket, phase: str, deadline: float):
        self.sock: Union[socket.socket, ssl.SSLSocket] = sock
        self.fd = sock.fileno()
        self.phase = phase
        self.buf = bytearray(self.BUFFER_BYTES)
        self.view = memoryview(self.buf)
        self.got = 0  # bytes received and not consumed: the current message (and any after it)
        self.drained = False  # the last read found the kernel's buffer empty (a short read)
        self.started = 0.0  # when its first byte came
        self.deadline = deadline
        self.held: Optional[Prepared] = None  # an answer by address: its arrays stay alive until the next request
        self.held_segments: list = []  # the shared segments (ids) that answer lent, one per buffer
        self.first = False  # the first request of a plaintext connection without a token: text is a stranger
        self.busy = True  # owned by a thread (else waiting in the epoll set)
        self.event = False  # bytes arrived while busy: its owner reads on before letting go
        self.closed = False
        self.refused = False  # beyond max_connections: told so, then closed
        self.nonces: Optional[tuple[bytes, bytes]] = None
        self.dropped = 0
        #: Plaintext: a blocking socket (reads with MSG_DONTWAIT, sends bounded by SO_SNDTIMEO); TLS needs
        #: a non-blocking one.
        self.blocking = False
        self.read_flags = 0


class _Epoll:
    """The epoll set (Linux). Connections are edge-triggered: each arrival of bytes is one event for one
    waiting thread, and nothing needs re-arming after an answer (a system call that would let another
    thread take the GIL). The listener is one-shot, re-armed after each batch of accepts or a pause."""

    def __init__(self):
        self._epoll = select.epoll()

    def add(self, fd: int) -> None:
        self._epoll.register(fd, select.EPOLLIN | select.EPOLLET)

    def release(self, fd: int) -> None:
        pass  # edge-triggered: armed all along

    def add_oneshot(self, fd: int) -> None:
        self._epoll.register(fd, select.EPOLLONESHOT)  # disarmed until rearm_oneshot()

    def rearm_oneshot(self, fd: int) -> None:
        self._epoll.modify(fd, select.EPOLLIN | select.EPOLLONESHOT)

    def add_level(self, fd: int) -> None:
        """Wakes every waiting thread while readable (the stop signal)."""
        self._epoll.register(fd, select.EPOLLIN)

    def remove(self, fd: int) -> None:
        self._epoll.unregister(fd)

    def wait(self) -> list[int]:
        # One event per wake-up: the kernel wakes another waiting thread for each other ready fd.
        return [fd for fd, _ in self._epoll.poll(-1, 1)]

    def close(self) -> None:
        self._epoll.close()


class _SelectorSet:
    """Where there is no epoll (macOS): one thread at a time waits on a selector (the others queue for
    that), a ready fd is unregistered before it is handed out and registered again, level-triggered,
    when its owner lets it go; changes from other threads are applied by the waiting thread, which a
    byte on a pipe wakes."""

    def __init__(self):
        self._selector = selectors.DefaultSelector()
        self._waiter = threading.Lock()
        self._changes: collections.deque = collections.deque()
        self._ready: collections.deque = collections.deque()
        self._level: set[int] = set()
        self._nudge_r, self._nudge_w = os.pipe()
        os.set_blocking(self._nudge_r, False)
        os.set_blocking(self._nudge_w, False)
        self._selector.register(self._nudge_r, selectors.EVENT_READ)

    def _nudge(self) -> None:
        try:
            os.write(self._nudge_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # full: the waiting thread is going to look anyway

    def add(self, fd: int) -> None:
        pass  # registered when released

    def release(self, fd: int) -> None:
        self._changes.append((fd, selectors.EVENT_READ))
        self._nudge()

    add_oneshot = add
    rearm_oneshot = release

    def add_level(self, fd: int) -> None:
        self._level.add(fd)
        self.release(fd)

    def remove(self, fd: int) -> None:
        self._changes.append((fd, 0))
        self._nudge()

    def _apply(self) -> None:
        while self._changes:
            fd, events = self._changes.popleft()
            try:
                self._selector.unregister(fd)
            except (KeyError, ValueError, OSError):
                pass
            if events:
                try:
                    self._selector.register(fd, events)
                except (KeyError, ValueError, OSError):
                    pass  # closed meanwhile

    def wait(self) -> list[int]:
        with self._waiter:
            while not self._ready:
                self._apply()
                for key, _ in self._selector.select():
                    if key.fd == self._nudge_r:
                        try:
                            while os.read(self._nudge_r, 4096):
                                pass
                        except BlockingIOError:
                            pass
                    elif key.fd in self._level:
                        self._ready.append(key.fd)
                    else:
                        self._selector.unregister(key.fd)
                        self._ready.append(key.fd)
            return [self._ready.popleft()]

    def close(self) -> None:
        self._selector.close()
        os.close(self._nudge_r)
        os.close(self._nudge_w)


#: The set the serving threads wait on: epoll where there is one (Linux).
_new_poller = _Epoll if hasattr(select, "epoll") else _SelectorSet


class _RateLimitedLog:
    """Warnings said at most once per ``interval_s`` per kind (``log_limits.RateLimitedLog``); the
    next one says how many were held back since."""

    def __init__(self, interval_s: float = _LOG_INTERVAL_S):
        self._limited = RateLimitedLog(log, interval_s)

    def __call__(self, kind: str, message: str) -> None:
        self._limited.warning(kind, "%s (said at most once a minute)", message)


class DataServer:
    """Serves ``GetElements`` over plain TCP for ``worker``; see the module docstring.

    ``idle_timeout_s``, ``request_timeout_s`` and ``max_connections`` are the worker's
    ``data_idle_timeout_ms``, ``data_request_timeout_ms`` (in seconds) and ``data_max_connections``;
    ``serving_threads`` bounds the threads that serve requests, ``send_timeout_s`` how long an answer
    may go without its reader taking a byte (default ``SEND_STALL_TIMEOUT_S``, at least
    ``request_timeout_s``).
    """

    def __init__(self, worker: TaskSource, host: str = "", port: int = 0, auth: Optional[ClusterAuth] = None,
                 tls: Optional[TlsSettings] = None, *, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, serving_threads: int = SERVING_THREADS,
                 send_timeout_s: Optional[float] = None, shared_batches: Optional[SharedBatches] = None):
        for name, value in (("idle_timeout_s", idle_timeout_s), ("request_timeout_s", request_timeout_s),
                            ("max_connections", max_connections), ("serving_threads", serving_threads)):
            if not value > 0:
                raise ValueError(f"DataServer: {name} must be positive, got {value!r}")
        self._worker = worker
        self._auth = auth
        # Large batches in shared segments, which readers on this host map (worker.shared_batches); None: off.
        self._shared_batches = shared_batches
        self._tls_context = tls.server_context() if tls is not None else None
        self._idle_timeout_s = float(idle_timeout_s)
        self._request_timeout_s = float(request_timeout_s)
        self._max_connections = int(max_connections)
        self._max_threads = int(serving_threads)
        self._send_timeout_s = max(SEND_STALL_TIMEOUT_S if send_timeout_s is None else send_timeout_s,
                                   self._request_timeout_s)
        host = host.strip("[]")
        if host == "localhost":
            host = "127.0.0.1"  # one listener; clients resolving "localhost" fall back to it
        # Room in the kernel's queue for a burst of readers connecting at once (the kernel caps it at somaxconn).
        backlog = min(max(self._max_connections, 128), 4096)
        try:
            self._listener = socket.create_server((host, port), family=socket.AF_INET6, dualstack_ipv6=True,
                                                  backlog=backlog) \
                if socket.has_dualstack_ipv6() and host in ("", "::") else socket.create_server((host, port),
                                                                                               backlog=backlog)
        except OSError as exc:
            raise bind_error(bind_address(host, port), "the worker's data-transfer port", exc) from exc
        self._listener.setblocking(False)
        self._listener_fd = self._listener.fileno()
        self.port = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        #: What a memory-read probe reads: random, so a reader cannot mistake another process for us.
        self._token = np.frombuffer(os.urandom(16), np.uint8).copy()
        self._lock = threading.Lock()
        self._conns: dict[int, _Connection] = {}
        self._admitted = 0  # connections within max_connections
        self._refusing = 0  # connections beyond it, being told so
        self._threads = 0  # serving threads alive
        self._idle_threads = 0  # of which waiting for events
        self._serving_threads: list[threading.Thread] = []
        self._accept_backoff_s = _ACCEPT_BACKOFF_MIN_S
        self._accept_resume_at: Optional[float] = None
        self._scratch = bytearray(16 * 1024)  # what lingering peers send, dropped
        #: Answers by address of closed connections, with when they may be freed (see _close).
        self._retired: collections.deque = collections.deque()
        self._warn = _RateLimitedLog()
        self._poller: Union[_Epoll, _SelectorSet] = _new_poller()
        self._stop_r, self._stop_w = os.pipe()
        self._poller.add_level(self._stop_r)
        self._poller.add_oneshot(self._listener_fd)
        self._housekeeping = threading.Event()  # wakes the housekeeping thread early
        self._housekeeper = threading.Thread(target=self._housekeeping_loop, name="dataservice-data-housekeeping",
                                             daemon=True)

    @property
    def connections(self) -> int:
        """Connections open now (served, or being refused)."""
        with self._lock:
            return len(self._conns)

    @property
    def serving_threads(self) -> int:
        """Serving threads alive now."""
        with self._lock:
            return self._threads

    def start(self) -> None:
        with self._lock:
            self._threads += 1
            self._idle_threads += 1
        self._start_serving_thread()
        self._housekeeper.start()
        self._poller.rearm_oneshot(self._listener_fd)

    # --- threads ------------------------------------------------------------------------------------
    def _start_serving_thread(self) -> None:
        """Starts one serving thread (already counted in _threads and _idle_threads)."""
        thread = threading.Thread(target=self._serve_loop, name="dataservice-data-serve", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # out of threads (ulimit -u, memory): the others serve on
            with self._lock:
                self._threads -= 1
                self._idle_threads -= 1
            self._warn("thread", f"data-transfer port {self.port}: cannot start a serving thread ({exc}); "
                                 f"serving with the {self._threads} there are")
            return
        with self._lock:
            self._serving_threads = [t for t in self._serving_threads if t.is_alive()] + [thread]

    def _serve_loop(self) -> None:
        try:
            while not self._stopped.is_set():
                try:
                    fds = self._poller.wait()
                except InterruptedError:
                    continue
                except (OSError, ValueError):
                    return  # closed by stop()
                for fd in fds:
                    if fd == self._listener_fd:
                        self._accept_ready()
                        continue
                    if fd == self._stop_r:
                        return
                    spare = False
                    with self._lock:
                        conn = self._conns.get(fd)
                        if conn is None:
                            continue  # closed since
                        if conn.busy:
                            conn.event = True  # its owner reads on before it lets go
                            continue
                        conn.busy = True
                        self._idle_threads -= 1
                        if self._idle_threads == 0 and self._threads < self._max_threads:
                            # A request may wait seconds for elements: keep one thread waiting for the others.
                            self._threads += 1
                            self._idle_threads += 1
                            spare = True
                    if spare:
                        self._start_serving_thread()
                    try:
                        self._handle(conn)
                    finally:
                        with self._lock:
                            self._idle_threads += 1
        finally:
            with self._lock:
                self._threads -= 1
                self._idle_threads -= 1

    def _housekeeping_loop(self) -> None:
        while not self._stopped.is_set():
            now = time.monotonic()
            expired = []
            with self._lock:
                for conn in self._conns.values():
                    if not conn.busy and conn.deadline <= now:
                        conn.busy = True  # ours now: no serving thread takes it
                        expired.append(conn)
                resume = self._accept_resume_at
                if resume is not None and resume <= now:
                    self._accept_resume_at = resume = None
                    try:
                        self._poller.rearm_oneshot(self._listener_fd)
                    except (OSError, ValueError):
                        pass  # closed by stop()
            for conn in expired:
                self._expire(conn)
            with self._lock:
                while self._retired and self._retired[0][0] <= now:
                    self._retired.popleft()
            sleep = min(_HOUSEKEEPING_MAX_S, self._idle_timeout_s / 4, self._request_timeout_s / 4,
                        self._handshake_timeout_s() / 4)
            if resume is not None:
                sleep = min(sleep, resume - now)
            self._housekeeping.wait(max(sleep, 0.001))
            self._housekeeping.clear()

    def _handshake_timeout_s(self) -> float:
        return min(HANDSHAKE_TIMEOUT_S, self._request_timeout_s)

    def _expire(self, conn: _Connection) -> None:
        """Closes a connection past its deadline (claimed by the caller), saying why when it matters."""
        if conn.phase is _REQUEST and conn.got:
            self._warn("incomplete", f"data-transfer port {self.port} closed the connection of {_peer(conn.sock)}: "
                                     f"a request did not arrive whole within {self._request_timeout_s:g} s of its "
                                     f"first byte (data_request_timeout_ms)")
        elif conn.phase in (_TLS_START, _TLS_SHAKE):
            self._log_refusal(conn.sock, f"no TLS handshake within {self._handshake_timeout_s():g} s")
        elif conn.phase in (_HELLO, _PROOF):
            self._log_refusal(conn.sock, f"no handshake within {self._handshake_timeout_s():g} s")
        elif conn.phase is _REQUEST:
            log.debug("data-transfer port %d: closed the connection of %s, idle for %g s", self.port,
                      _peer(conn.sock), self._idle_timeout_s)
        self._close(conn)

    # --- connections ----------------------------------------------------------------------------------
    def _accept_ready(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if self._stopped.is_set():
                    return
                if exc.errno in _ABORTED_ERRORS:
                    self._warn(f"accept-{exc.errno}", f"data-transfer port {self.port}: a connection was lost "
                                                      f"before it was accepted ({exc})")
                    continue
                # Out of descriptors or memory (or anything else): never fatal. The listener pauses, with the
                # waiting connections left in the kernel's queue, and tries again.
                delay = self._accept_backoff_s
                self._accept_backoff_s = min(delay * 2, _ACCEPT_BACKOFF_MAX_S)
                why = _RESOURCE_ERRORS.get(exc.errno, "")
                self._warn(f"accept-{exc.errno}",
                           f"data-transfer port {self.port} cannot accept connections: {exc}"
                           f"{' (' + why + ')' if why else ''}; trying again in {delay * 1000:.0f} ms, then "
                           f"less often (up to every {_ACCEPT_BACKOFF_MAX_S:g} s) while it lasts")
                with self._lock:
                    self._accept_resume_at = time.monotonic() + delay
                self._housekeeping.set()
                return  # the listener stays disarmed: the housekeeping thread re-arms it
            self._accept_backoff_s = _ACCEPT_BACKOFF_MIN_S
            self._admit(sock)
        try:
            self._poller.rearm_oneshot(self._listener_fd)
        except (OSError, ValueError):
            pass  # closed by stop()

    def _admit(self, sock: socket.socket) -> None:
        try:
            blocking = self._tls_context is None and _set_send_timeout(sock, self._send_timeout_s)
            sock.setblocking(blocking)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            return
        now = time.monotonic()
        if self._tls_context is not None:
            conn = _Connection(sock, _TLS_START, now + self._handshake_timeout_s())
        elif self._auth is not None:
            conn = _Connection(sock, _HELLO, now + self._handshake_timeout_s())
        else:
            conn = _Connection(sock, _REQUEST, now + self._idle_timeout_s)
            conn.first = True
        conn.blocking = blocking
        conn.read_flags = socket.MSG_DONTWAIT if blocking else 0
        with self._lock:
            refuse = self._admitted >= self._max_connections
            drop = self._stopped.is_set() or (refuse and self._refusing >= _REFUSING_MAX)
            if not drop:
                if refuse:
                    conn.refused = True
                    self._refusing += 1
                else:
                    self._admitted += 1
                self._conns[conn.fd] = conn
        if refuse:
            self._warn("limit", f"data-transfer port {self.port} refused a connection from {_peer(sock)}: it "
                                f"serves at most {self._max_connections} connections at once "
                                f"(data_max_connections, --data-max-connections) and all are in use")
        if drop:
            sock.close()
            return
        if conn.refused and self._tls_context is None:
            try:
                told = self._refuse_over_limit(conn)  # at once: it learns before it sends anything
            except OSError:
                told = False
            if not told:
                self._close(conn)
                return
        with self._lock:
            if self._stopped.is_set():
                drop = True
            else:
                # Registered last, and free: what it sent already is an event (epoll reports the bytes
                # present when an fd is added) for a serving thread, not for this one, which accepts.
                conn.busy = False
                try:
                    self._poller.add(conn.fd)
                    self._poller.release(conn.fd)
                except (OSError, ValueError):
                    conn.busy = drop = True
        if drop:
            self._close(conn)

    def _release(self, conn: _Connection) -> bool:
        """Hands ``conn`` back to the epoll set with the deadline of what it waits for; True (still ours)
        when bytes arrived meanwhile, False when it is released or closed."""
        if conn.phase is _REQUEST:
            conn.deadline = conn.started + self._request_timeout_s if conn.got \
                else time.monotonic() + self._idle_timeout_s
        with self._lock:
            if not self._stopped.is_set() and not conn.closed:
                if conn.event:
                    conn.event = False
                    return True
                conn.busy = False
                try:
                    self._poller.release(conn.fd)
                    return False
                except (OSError, ValueError):
                    conn.busy = True
        self._close(conn)
        return False

    def _close(self, conn: _Connection) -> None:
        with self._lock:
            if conn.closed:
                return
            conn.closed = True
            if self._conns.get(conn.fd) is conn:
                del self._conns[conn.fd]
            if conn.refused:
                self._refusing -= 1
            else:
                self._admitted -= 1
            try:
                self._poller.remove(conn.fd)
            except (OSError, ValueError, KeyError):
                pass
        held, conn.held = conn.held, None
        try:
            conn.sock.close()
        except OSError:
            pass
        if self._shared_batches is not None:
            # Its reader may still hold arrays of the segments lent to it: never written again.
            self._shared_batches.drop_connection(conn)
        if held is not None:
            # The reader may be copying its arrays out of our memory right now. Freed at once, their memory
            # could be reused (another element, in this process) under the copy, which would then read
            # the wrong bytes. Closed first, kept a while: a reader that finds the connection closed after
            # its copy drops what it copied (see transports.TcpTransport.get), one that does not copied
            # before the close, so before they are freed.
            with self._lock:
                self._retired.append((time.monotonic() + HELD_AFTER_CLOSE_S, held))

    def _handle(self, conn: _Connection) -> None:
        """Runs ``conn``'s protocol (claimed by this thread) as far as what arrived allows, then lets it go."""
        while True:
            keep = False
            try:
                keep = self._advance(conn)
            except _PeerClosed:
                pass
            except TimeoutError as exc:  # a send that made no progress
                self._warn("stalled", f"data-transfer port {self.port} closed the connection of "
                                      f"{_peer(conn.sock)} ({conn.phase}): {exc} (a stopped or stuck reader?); "
                                      f"what it was sent went back to the task")
            except OSError:
                pass  # the peer went away (a reset, a TLS error mid-stream)
            except Exception:  # a bug: this connection ends, the server goes on
                log.exception("data-transfer port %d: serving %s failed", self.port, _peer(conn.sock))
            if not keep:
                self._close(conn)
                return
            if not self._release(conn):
                return

    def _fill(self, conn: _Connection, n: int) -> bool:
        """Reads until ``n`` bytes are in: False if more must arrive first (the kernel's buffer is empty, so
        their arrival is an event). Reads what is there, up to the buffer's end: a request's header and
        body (or a proof and the request behind it) in one system call."""
        while conn.got < n:
            room = _Connection.BUFFER_BYTES - conn.got
            try:
                k = conn.sock.recv_into(conn.view[conn.got:], room, conn.read_flags)
            except (BlockingIOError, ssl.SSLWantReadError):
                conn.drained = True
                return False
            except ssl.SSLWantWriteError:  # TLS must write first (rare): wait for room, within the deadline
                _wait_writable(conn.sock, max(conn.deadline - time.monotonic(), 0.001))
                continue
            if k == 0:
                raise _PeerClosed
            if conn.got == 0:
                conn.started = time.monotonic()
            conn.got += k
            conn.drained = k < room
        return True

    @staticmethod
    def _consume(conn: _Connection, n: int) -> None:
        """Drops the first ``n`` bytes (a message dealt with); what came after it moves to the front."""
        rest = conn.got - n
        if rest:
            conn.buf[:rest] = conn.buf[n:conn.got]
            conn.started = time.monotonic()
        conn.got = rest

    def _advance(self, conn: _Connection) -> bool:
        """True: ``conn`` waits for more bytes (the caller lets it go); False: it is over."""
        while True:
            phase = conn.phase
            if phase is _REQUEST:
                if not self._fill(conn, REQUEST_HEADER.size):
                    return True
                (length,) = REQUEST_HEADER.unpack_from(conn.buf)
                if conn.first:
                    head = bytes(conn.view[:REQUEST_HEADER.size])
                    if _is_text(head):
                        if not self._greet_stranger(conn, head):
                            return False
                        continue  # drains what it sent: no further event reports it
                    conn.first = False
                if length > MAX_REQUEST_BYTES:
                    self._warn("oversized", f"data-transfer port {self.port} closed the connection of "
                                            f"{_peer(conn.sock)}: it sent a {length}-byte request (at most "
                                            f"{MAX_REQUEST_BYTES}): not a dataservice client")
                    return False
                end = REQUEST_HEADER.size + length
                if not self._fill(conn, end):
                    return True
                body = bytes(conn.view[REQUEST_HEADER.size:end])
                self._consume(conn, end)
                try:
                    request = worker_pb2.GetElementsRequest.FromString(body)
                except Exception:
                    self._warn("unreadable", f"data-transfer port {self.port} closed the connection of "
                                             f"{_peer(conn.sock)}: it sent an unreadable request")
                    return False
                self._serve(conn, request)
                # Back to the epoll set only when the kernel had no more bytes at the last read (any since
                # are an event) and none wait in our buffer or TLS's (which no event reports): else read on.
                if conn.drained and not conn.got and not isinstance(conn.sock, ssl.SSLSocket):
                    return True
            elif phase is _LINGER:
                try:
                    # The plain socket's recv: TLS is shut down (see _linger), and a blocking socket must not wait.
                    k = socket.socket.recv_into(conn.sock, self._scratch, 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return True
                conn.dropped += k
                if not k or conn.dropped >= _LINGER_DRAIN_BYTES:
                    return False
            elif phase is _HELLO:
                if not self._fill(conn, REQUEST_HEADER.size):
                    return True
                head = bytes(conn.view[:REQUEST_HEADER.size])
                if head != HELLO_MAGIC[:REQUEST_HEADER.size]:
                    if _is_text(head):
                        if not self._greet_stranger(conn, head):
                            return False
                        continue  # drains what it sent: no further event reports it
                    # A request (never parsed): a client without the token.
                    if not self._refuse(conn, "no auth token (it sent a request without the handshake)",
                                        f"this worker requires the cluster's auth token: set {TOKEN_ENV} or "
                                        f"{TOKEN_FILE_ENV} (or pass auth_token=) on this client to the cluster's "
                                        f"token"):
                        return False
                    continue  # drains what it sent: no further event reports it
                if not self._fill(conn, HELLO_BYTES):
                    return True
                if conn.view[REQUEST_HEADER.size:len(HELLO_MAGIC)] != HELLO_MAGIC[REQUEST_HEADER.size:]:
                    if not self._refuse(conn, "an unknown handshake (another dataservice version?)",
                                        "this worker does not know this client's handshake: is it another "
                                        "dataservice version?"):
                        return False
                    continue  # drains what it sent: no further event reports it
                client_nonce = bytes(conn.view[len(HELLO_MAGIC):HELLO_BYTES])
                server_nonce = new_nonce()
                conn.nonces = (client_nonce, server_nonce)
                _send_all(conn.sock, [server_nonce + server_proof(self._auth, client_nonce, server_nonce)],
                          max(conn.deadline - time.monotonic(), 0.001), conn.blocking)
                self._consume(conn, HELLO_BYTES)
                conn.phase = _PROOF
            elif phase is _PROOF:
                try:
                    if not self._fill(conn, PROOF_BYTES):
                        return True
                except _PeerClosed:  # a client that found our proof wrong (another token) closes here
                    self._log_refusal(conn.sock, "it closed the connection after our proof: does it have another "
                                                 "token?")
                    return False
                client_nonce, server_nonce = conn.nonces
                if not hmac.compare_digest(bytes(conn.view[:PROOF_BYTES]),
                                           client_proof(self._auth, client_nonce, server_nonce)):
                    if not self._refuse(conn, "a wrong auth token",
                                        "this worker refused the connection: wrong auth token (this client's token "
                                        "is not the cluster's)"):
                        return False
                    continue  # drains what it sent: no further event reports it
                # Authenticated: requests may be minutes apart (the idle timeout). The first may be here already.
                conn.nonces = None
                self._consume(conn, PROOF_BYTES)
                conn.phase = _REQUEST
            elif phase is _TLS_START:
                try:
                    first = conn.sock.recv(1, socket.MSG_PEEK)
                except BlockingIOError:
                    return True
                if not first:
                    return False
                if first[0] != _TLS_HANDSHAKE:
                    self._log_refusal(conn.sock, "it spoke plaintext to this TLS port: does it lack the cluster's "
                                                 "TLS CA (DATASERVICE_TLS_CA, --tls-ca)?")
                    _send_all(conn.sock, [TLS_PLAINTEXT_ALERT], _GREETING_LINGER_S, conn.blocking)
                    if not self._linger(conn):
                        return False
                    continue  # drains what it sent: no further event reports it
                conn.sock = self._tls_context.wrap_socket(conn.sock, server_side=True,
                                                          do_handshake_on_connect=False)
                conn.phase = _TLS_SHAKE
            elif phase is _TLS_SHAKE:
                try:
                    conn.sock.do_handshake()
                except ssl.SSLWantReadError:
                    return True
                except ssl.SSLWantWriteError:  # rare (the kernel's buffer full): wait for room, within the deadline
                    _wait_writable(conn.sock, max(conn.deadline - time.monotonic(), 0.001))
                    continue
                except ssl.SSLError as exc:  # a certificate refused, a protocol error: the peer got OpenSSL's alert
                    self._log_refusal(conn.sock, f"the TLS handshake failed: {exc.reason or exc}")
                    return False
                if conn.refused:
                    if not self._refuse_over_limit(conn):
                        return False
                    continue  # drains what it sent: no further event reports it
                conn.phase = _HELLO if self._auth is not None else _REQUEST
            else:
                raise AssertionError(f"a connection in an unknown phase: {phase!r}")

    # --- answers ----------------------------------------------------------------------------------
    def _serve(self, conn: _Connection, request: worker_pb2.GetElementsRequest) -> None:
        held = conn.held
        if held is not None and request.previous_unread:
            held.give_back()  # the reader could not copy them: nothing is lost
            self._return_segments(conn, conn.held_segments)  # nor map them
        conn.held = None
        conn.held_segments = []
        if request.returned_segments:
            self._return_segments(conn, request.returned_segments)
        if request.probe_memory:
            # The token's bytes follow, for the reader to compare with what it copies.
            probe = worker_pb2.ElementChunk(worker_pid=os.getpid(), buffer_addresses=[address_of(self._token)],
                                            buffer_lengths=[self._token.nbytes])
            self._send(conn, [_framed(probe, self._token.nbytes, self._token.nbytes), self._token.tobytes()])
            return
        conn.held = self._answer(conn, request)

    def _send(self, conn: _Connection, parts: list) -> None:
        _send_all(conn.sock, parts, self._send_timeout_s, conn.blocking)

    def _answer(self, conn: _Connection, request: worker_pb2.GetElementsRequest) -> Optional[Prepared]:
        """Sends the answer; returns it if the reader is to copy its arrays from our memory."""
        try:
            check_get_elements(request)  # the same bounds as on the gRPC port
            prepared = prepare(self._worker, request)
        except errors.InvalidRequestError as exc:
            self._send(conn, [_framed(_error_response("InvalidArgument", str(exc)), 0, 0)])
            return None
        except UnknownTaskError as exc:
            # Not an error of the reader's pipeline: the task may not have arrived yet, or was revoked.
            self._send(conn, [_framed(_error_response("NotFound", str(exc)), 0, 0)])
            return None
        except ReadKeyError as exc:
            # Caught here: it is an OSError, which _handle takes for a reader gone away (a silent close).
            self._send(conn, [_framed(_error_response("PermissionDenied", str(exc)), 0, 0)])
            return None
        except ValueError as exc:
            self._send(conn, [_framed(_error_response("InvalidArgument", str(exc)), 0, 0)])
            return None
        frame = prepared.frame
        if frame is None:
            self._send(conn, [_framed(prepared.header, 0, 0)])
            return None
        by_address = request.read_memory and bool(frame.arrays)
        lent: list = []
        if by_address:
            header = prepared.header
            header.buffer_addresses.extend(address_of(data) for data in frame.arrays)
            header.buffer_lengths.extend(data.nbytes for data in frame.arrays)
            if request.shared_memory and self._shared_batches is not None:
                lent = self._lend_segments(conn, header, frame)
        # The prefix's parts are small (in-band values): one copy into the header's buffer saves
        # the kernel an iovec for each; the out-of-band buffers go from their numpy memory.
        head = _framed(prepared.header, frame.prefix_nbytes,
                       frame.prefix_nbytes if by_address else frame.nbytes) + b"".join(frame.prefix)
        try:
            self._send(conn, [head] if by_address else [head] + frame.buffers)
        except OSError:
            prepared.give_back()
            self._return_segments(conn, lent)
            raise
        conn.held_segments = lent
        return prepared if by_address else None

    def _lend_segments(self, conn: _Connection, header: worker_pb2.ElementChunk, frame: Any) -> list:
        """Names, in ``header``, the shared segment each of ``frame``'s out-of-band buffers lies in (0: none,
        the reader copies it by address), lent to ``conn`` until its reader returns it; the ids lent."""
        lent = []
        pool = self._shared_batches
        for address, size in zip(header.buffer_addresses, frame.buffer_sizes):
            # The reader maps the buffer with its padding: the segment must hold that too (it does: pages).
            segment = pool.find(address, size)
            fd = pool.lend(segment, conn) if segment is not None else -1
            if fd >= 0:
                lent.append(segment.id)
                header.buffer_segments.append(segment.id)
                header.segment_fds.append(fd)
                header.segment_inodes.append(segment.inode)
                header.segment_offsets.append(address - segment.address)
            else:
                header.buffer_segments.append(0)
                header.segment_fds.append(-1)
                header.segment_inodes.append(0)
                header.segment_offsets.append(0)
        if not lent:
            for field in ("buffer_segments", "segment_fds", "segment_inodes", "segment_offsets"):
                header.ClearField(field)
        return lent

    def _return_segments(self, conn: _Connection, ids: Any) -> None:
        if self._shared_batches is not None and ids:
            self._shared_batches.give_back(ids, conn)

    # --- refusals -----------------------------------------------------------------------------------
    def _linger(self, conn: _Connection) -> bool:
        """Closing with the rest of a peer's bytes unread would send a reset, which may destroy our
        answer before the peer reads it: half-close, and drop what it sends until it closes (or for
        a second, and at most _LINGER_DRAIN_BYTES), in the epoll set like any connection."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return False
        conn.phase = _LINGER
        conn.deadline = time.monotonic() + _GREETING_LINGER_S
        return True

    def _refuse_over_limit(self, conn: _Connection) -> bool:
        message = (f"worker data-transfer port {self.port} serves at most {self._max_connections} connections at "
                   f"once and all are in use (data_max_connections; dataservice worker --data-max-connections)")
        _send_all(conn.sock, [_framed(_error_response(TOO_MANY_CONNECTIONS, message), 0, 0)], _GREETING_LINGER_S,
                  conn.blocking)
        return self._linger(conn)

    def _log_refusal(self, conn: Union[socket.socket, str], why: str) -> None:
        self._warn("refusal", f"data-transfer port {self.port} refused "
                              f"{conn if isinstance(conn, str) else _peer(conn)}: {why}")

    def _refuse(self, conn: _Connection, why: str, message: str) -> bool:
        """Tells an unauthenticated peer why (an error header: a protobuf, never a pickle), then lets it close."""
        self._log_refusal(conn.sock, why)
        _send_all(conn.sock, [_framed(_error_response(UNAUTHENTICATED, message), 0, 0)], _GREETING_LINGER_S,
                  conn.blocking)
        return self._linger(conn)

    def _greet_stranger(self, conn: _Connection, head: bytes) -> bool:
        """Tells a client that is not a dataservice reader where it is, then lets it close."""
        peer = _peer(conn.sock)
        if head == HELLO_MAGIC[:REQUEST_HEADER.size]:
            self._warn("stranger", f"data-transfer port {self.port}: a client with an auth token connected from "
                                   f"{peer}, but this worker runs without one: give every member of the cluster "
                                   f"the same token")
        else:
            protocol = "a gRPC client" if head == b"PRI " else "a text protocol (HTTP?)"
            self._warn("stranger", f"data-transfer port {self.port}: {protocol} connected from {peer}; was this "
                                   f"port given as the dispatcher's or a worker's gRPC address?")
        _send_all(conn.sock, [DATA_TRANSFER_GREETING], _GREETING_LINGER_S, conn.blocking)
        return self._linger(conn)

    # --- stopping ------------------------------------------------------------------------------------
    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        os.write(self._stop_w, b"x")  # readable from now on: every waiting serving thread returns
        self._housekeeping.set()
        try:
            self._poller.remove(self._listener_fd)
        except (OSError, ValueError, KeyError):
            pass
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns.values())
            idle = [c for c in conns if not c.busy]
            for conn in idle:
                conn.busy = True
        for conn in idle:
            self._close(conn)
        for conn in conns:
            if conn not in idle:
                try:
                    # Wakes a send in progress; its thread closes the connection. The plain socket's shutdown:
                    # an SSLSocket's own would drop its TLS state under that thread.
                    socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        with self._lock:
            threads = list(self._serving_threads)
        for thread in [self._housekeeper, *threads]:
            if thread.ident is not None:
                thread.join(timeout=max(deadline - time.monotonic(), 0))
        with self._lock:
            left = list(self._conns.values())
        for conn in left:  # a thread stuck past the deadline: its connection goes all the same
            self._close(conn)
        self._poller.close()  # a thread still serving finds it closed and ends
        with self._lock:
            retired, self._retired = self._retired, collections.deque()
        if retired:  # kept for their readers' copies, as _close says, by a timer now that housekeeping ended
            timer = threading.Timer(HELD_AFTER_CLOSE_S, retired.clear)
            timer.daemon = True
            timer.start()
        for fd in (self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
