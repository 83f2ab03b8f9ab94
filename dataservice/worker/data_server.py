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
request (``previous_unread``) and the elements go back to the task.

A connection that opens with text (the HTTP/2 preface of a gRPC client given this port
as the dispatcher's address, an HTTP request, a person with ``nc``) gets
``endpoint_probe.DATA_TRANSFER_GREETING``, "dataservice data-transfer port", and is
closed: that client's probe can then name the mistake. A connection that sends anything
else is closed; the server goes on.

With the cluster's token (``auth``), a connection must first pass the handshake that
``dataservice.service.data_transfer`` describes: the server reads no request, and answers
no memory-read probe, before the peer proved it holds the token. A peer that does not is
answered with an "Unauthenticated" error header and closed; one that does not finish the
handshake within ``HANDSHAKE_TIMEOUT_S`` is closed. Refusals are logged at most once a minute.

With TLS (``tls``: the worker's ``dataservice.service.tls.TlsSettings``) every connection is TLS
from its first byte: the TLS handshake runs in the connection's own thread, bounded by
``HANDSHAKE_TIMEOUT_S`` per read, so a silent peer holds nothing but its thread; under mutual TLS
the client's certificate must verify against the client CA. The token's handshake, the memory-read
probe and the requests then run inside TLS. A peer whose first byte does not start a TLS handshake
(a plaintext client, ``nc``, an HTTP/2 preface) gets a TLS alert record (``TLS_PLAINTEXT_ALERT``,
which a plaintext dataservice client and ``endpoint_probe`` recognise as TLS) and is closed, its
bytes never parsed. ``ssl.SSLSocket`` has no ``sendmsg``: answers go out with one ``sendall``
per buffer, each encrypted from the numpy buffer into TLS records (one copy, by OpenSSL).

Example::

    >>> server = DataServer(worker, "[::]:0"); server.start()
    >>> server.port
    41234
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import ssl
import threading
import time
from typing import Optional, Union

import numpy as np

from dataservice.proto import worker_pb2
from dataservice.service.auth import TOKEN_ENV, TOKEN_FILE_ENV, ClusterAuth, client_proof, new_nonce, server_proof
from dataservice.service.cross_memory import address_of
from dataservice.service.data_transfer import (HELLO_BYTES, HELLO_MAGIC, MAX_REQUEST_BYTES, PROOF_BYTES,
                                               REQUEST_HEADER, RESPONSE_HEADER, UNAUTHENTICATED, recv_into_exact)
from dataservice.service.endpoint_probe import DATA_TRANSFER_GREETING
from dataservice.service.tls import TlsSettings
from dataservice.worker.responses import Prepared, ReadKeyError, TaskSource, UnknownTaskError, prepare

__all__ = ["DataServer", "HANDSHAKE_TIMEOUT_S", "TLS_PLAINTEXT_ALERT"]

log = logging.getLogger("dataservice.worker")

#: Largest number of buffers handed to one sendmsg call (the kernel's IOV_MAX is 1024).
_MAX_IOV = 512
#: A gRPC channel pointed at this port reconnects every second or so: one warning a minute is enough.
_STRANGER_LOG_INTERVAL_S = 60.0
#: How long a stranger gets to read the greeting and close before we close on it.
_GREETING_LINGER_S = 1.0
#: With a token: how long a new connection has, in all, to complete the handshake (a peer that
#: connects and sends nothing, or trickles, holds its thread no longer than this).
HANDSHAKE_TIMEOUT_S = 10.0
#: What a TLS data port answers a peer that speaks plaintext: a TLS record, a fatal
#: protocol_version alert (content type 21, TLS 1.2, length 2, level fatal, description 70).
TLS_PLAINTEXT_ALERT = b"\x15\x03\x03\x00\x02\x02\x46"
#: The first byte of a TLS handshake record (a ClientHello).
_TLS_HANDSHAKE = 0x16
#: What we read, and drop, from a refused peer while it reads our answer: nothing more.
_LINGER_DRAIN_BYTES = 64 * 1024


def _is_text(head: bytes) -> bool:
    # A request's length is at most MAX_REQUEST_BYTES, so its two high bytes are zero: printable
    # ASCII here ("PRI " of the HTTP/2 preface, "GET ") is never one of our clients.
    return all(0x20 <= b < 0x7f for b in head)


def _recv_exact(sock: socket.socket, n: int) -> Optional[bytearray]:
    buf = bytearray(n)
    return buf if recv_into_exact(sock, memoryview(buf)) else None


def _recv_by(sock: socket.socket, n: int, deadline: float) -> Optional[bytes]:
    """Exactly ``n`` bytes, all received before ``deadline`` (TimeoutError otherwise); None if the peer
    closed the connection first."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        sock.settimeout(remaining)
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def _peer(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
    except OSError:
        return "a peer that left"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _send_all(sock: socket.socket, parts: list) -> None:
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg: each buffer is encrypted straight from its memory
        for view in views:
            sock.sendall(view)
        return
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i:i + _MAX_IOV])
        while i < len(views) and sent >= views[i].nbytes:
            sent -= views[i].nbytes
            i += 1
        if sent:
            views[i] = views[i][sent:]


def _error_response(kind: str, message: str) -> worker_pb2.ElementChunk:
    return worker_pb2.ElementChunk(end_of_sequence=True, error_type=kind, error_message=message)


class DataServer:
    """Serves ``GetElements`` over plain TCP for ``worker``; see the module docstring."""

    def __init__(self, worker: TaskSource, host: str = "", port: int = 0, auth: Optional[ClusterAuth] = None,
                 tls: Optional[TlsSettings] = None):
        self._worker = worker
        self._auth = auth
        self._tls_context = tls.server_context() if tls is not None else None
        host = host.strip("[]")
        if host == "localhost":
            host = "127.0.0.1"  # one listener; clients resolving "localhost" fall back to it
        self._listener = socket.create_server((host, port), family=socket.AF_INET6, dualstack_ipv6=True) \
            if socket.has_dualstack_ipv6() and host in ("", "::") else socket.create_server((host, port))
        self.port = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        #: What a memory-read probe reads: random, so a reader cannot mistake another process for us.
        self._token = np.frombuffer(os.urandom(16), np.uint8).copy()
        self._connections: set = set()
        self._lock = threading.Lock()
        self._last_stranger_log = -_STRANGER_LOG_INTERVAL_S
        self._last_refusal_log = -_STRANGER_LOG_INTERVAL_S
        self._refusals_unlogged = 0
        self._thread = threading.Thread(target=self._accept_loop, name="dataservice-data-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed by stop()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="dataservice-data-conn", daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        held: Optional[Prepared] = None  # an answer by address: its arrays stay alive until the next request
        # With a token, the handshake deals with strangers; with TLS, the TLS handshake.
        first = self._auth is None and self._tls_context is None
        conn = raw
        try:
            if self._tls_context is not None:
                tls_conn = self._start_tls(raw)
                if tls_conn is None:
                    return
                conn = tls_conn
                with self._lock:
                    self._connections.discard(raw)
                    self._connections.add(conn)
            if self._auth is not None and not self._authenticate(conn, self._auth):
                return
            while not self._stopped.is_set():
                head = _recv_exact(conn, REQUEST_HEADER.size)
                if head is None:
                    return
                if first and _is_text(head):
                    self._greet_stranger(conn, bytes(head))
                    return
                first = False
                (length,) = REQUEST_HEADER.unpack(head)
                if length > MAX_REQUEST_BYTES:
                    log.warning("data connection sent a %d-byte request: not a dataservice client; closing", length)
                    return
                body = _recv_exact(conn, length)
                if body is None:
                    return
                try:
                    request = worker_pb2.GetElementsRequest.FromString(bytes(body))
                except Exception:
                    log.warning("data connection sent an unreadable request; closing")
                    return
                if held is not None and request.previous_unread:
                    held.give_back()  # the reader could not copy them: nothing is lost
                held = None
                if request.probe_memory:
                    # The token's bytes follow, for the reader to compare with what it copies.
                    probe = worker_pb2.ElementChunk(worker_pid=os.getpid(), buffer_addresses=[address_of(self._token)],
                                                    buffer_lengths=[self._token.nbytes])
                    _send_all(conn, [self._framed(probe, self._token.nbytes, self._token.nbytes),
                                     self._token.tobytes()])
                    continue
                held = self._answer(conn, request)
        except OSError:
            return  # the reader went away
        finally:
            with self._lock:
                self._connections.discard(raw)
                self._connections.discard(conn)
            conn.close()
            raw.close()

    def _start_tls(self, raw: socket.socket) -> Optional[ssl.SSLSocket]:
        """The connection with TLS on, or None (the peer was refused, and the caller closes it)."""
        peer = _peer(raw)
        raw.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            first = raw.recv(1, socket.MSG_PEEK)
            if not first:
                return None
            if first[0] != _TLS_HANDSHAKE:
                self._log_refusal(peer, "it spoke plaintext to this TLS port: does it lack the cluster's TLS CA "
                                        "(DATASERVICE_TLS_CA, --tls-ca)?")
                raw.sendall(TLS_PLAINTEXT_ALERT)
                self._linger(raw)
                return None
        except TimeoutError:  # silent
            self._log_refusal(peer, f"no TLS handshake within {HANDSHAKE_TIMEOUT_S:g} s")
            return None
        except OSError:
            return None  # gone
        try:
            conn = self._tls_context.wrap_socket(raw, server_side=True)
        except ssl.SSLError as exc:  # a certificate refused, a protocol error: the peer got OpenSSL's alert
            self._log_refusal(peer, f"the TLS handshake failed: {exc.reason or exc}")
            return None
        except TimeoutError:
            self._log_refusal(peer, f"no TLS handshake within {HANDSHAKE_TIMEOUT_S:g} s")
            return None
        except OSError:
            return None  # gone mid-handshake
        conn.settimeout(None)  # requests may be minutes apart; the token's handshake sets its own deadline
        return conn

    def _authenticate(self, conn: socket.socket, auth: ClusterAuth) -> bool:
        """The handshake (``dataservice.service.data_transfer``): True once the peer proved it holds the
        token; otherwise the peer was answered as it deserves, and the caller closes the connection.
        Reads at most the handshake's fixed sizes, within HANDSHAKE_TIMEOUT_S."""
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        try:
            head = _recv_by(conn, REQUEST_HEADER.size, deadline)
            if head is None:
                return False
            if head != HELLO_MAGIC[:REQUEST_HEADER.size]:
                if _is_text(head):
                    self._greet_stranger(conn, head)
                else:  # a request (never parsed): a client without the token
                    self._refuse(conn, "no auth token (it sent a request without the handshake)",
                                 f"this worker requires the cluster's auth token: set {TOKEN_ENV} or "
                                 f"{TOKEN_FILE_ENV} (or pass auth_token=) on this client to the cluster's token")
                return False
            rest = _recv_by(conn, HELLO_BYTES - REQUEST_HEADER.size, deadline)
            if rest is None:
                return False
            magic_rest = len(HELLO_MAGIC) - REQUEST_HEADER.size
            if rest[:magic_rest] != HELLO_MAGIC[REQUEST_HEADER.size:]:
                self._refuse(conn, "an unknown handshake (another dataservice version?)",
                             "this worker does not know this client's handshake: is it another dataservice version?")
                return False
            client_nonce = rest[magic_rest:]
            server_nonce = new_nonce()
            conn.sendall(server_nonce + server_proof(auth, client_nonce, server_nonce))
            proof = _recv_by(conn, PROOF_BYTES, deadline)
            if proof is None:  # a client that found our proof wrong (another token) closes here
                self._log_refusal(conn, "it closed the connection after our proof: does it have another token?")
                return False
            if not hmac.compare_digest(proof, client_proof(auth, client_nonce, server_nonce)):
                self._refuse(conn, "a wrong auth token",
                             "this worker refused the connection: wrong auth token (this client's token is not "
                             "the cluster's)")
                return False
        except TimeoutError:
            self._log_refusal(conn, f"no handshake within {HANDSHAKE_TIMEOUT_S:g} s")
            return False
        conn.settimeout(None)  # authenticated: requests may be minutes apart, as without a token
        return True

    def _log_refusal(self, conn: Union[socket.socket, str], why: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last_refusal_log < _STRANGER_LOG_INTERVAL_S:
                self._refusals_unlogged += 1
                return
            self._last_refusal_log, unlogged, self._refusals_unlogged = now, self._refusals_unlogged, 0
        more = f"; {unlogged} more refused since the last such message" if unlogged else ""
        log.warning("data-transfer port %d refused %s: %s%s (said at most once a minute)", self.port,
                    conn if isinstance(conn, str) else _peer(conn), why, more)

    def _refuse(self, conn: socket.socket, why: str, message: str) -> None:
        """Tells an unauthenticated peer why (an error header: a protobuf, never a pickle), then lets it close."""
        self._log_refusal(conn, why)
        try:
            conn.settimeout(_GREETING_LINGER_S)
            _send_all(conn, [self._framed(_error_response(UNAUTHENTICATED, message), 0, 0)])
        except OSError:
            return  # gone, or not reading: it is closed all the same
        self._linger(conn)

    def _greet_stranger(self, conn: socket.socket, head: bytes) -> None:
        """Tells a client that is not a dataservice reader where it is, then lets it close."""
        now = time.monotonic()
        if now - self._last_stranger_log >= _STRANGER_LOG_INTERVAL_S:
            self._last_stranger_log = now
            peer = _peer(conn)
            if head == HELLO_MAGIC[:REQUEST_HEADER.size]:
                log.warning("data-transfer port %d: a client with an auth token connected from %s, but this worker "
                            "runs without one: give every member of the cluster the same token (said at most once "
                            "a minute)", self.port, peer)
            else:
                protocol = "a gRPC client" if head == b"PRI " else "a text protocol (HTTP?)"
                log.warning("data-transfer port %d: %s connected from %s; was this port given as the dispatcher's "
                            "or a worker's gRPC address? (said at most once a minute)", self.port, protocol, peer)
        conn.settimeout(_GREETING_LINGER_S)
        conn.sendall(DATA_TRANSFER_GREETING)
        self._linger(conn)

    @staticmethod
    def _linger(conn: socket.socket) -> None:
        """Closing with the rest of a peer's bytes unread would send a reset, which may destroy our
        answer before the peer reads it: half-close, and drop what it sends until it closes (or for
        a second, and at most _LINGER_DRAIN_BYTES)."""
        try:
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(_GREETING_LINGER_S)
            deadline = time.monotonic() + _GREETING_LINGER_S
            scratch = bytearray(4096)
            dropped = 0
            while time.monotonic() < deadline and dropped < _LINGER_DRAIN_BYTES:
                k = conn.recv_into(scratch)
                if not k:
                    return
                dropped += k
        except OSError:
            pass

    def _answer(self, conn: socket.socket, request: worker_pb2.GetElementsRequest) -> Optional[Prepared]:
        """Sends the answer; returns it if the reader is to copy its arrays from our memory."""
        try:
            prepared = prepare(self._worker, request)
        except UnknownTaskError as exc:
            # Not an error of the reader's pipeline: the task may not have arrived yet, or was revoked.
            _send_all(conn, [self._framed(_error_response("NotFound", str(exc)), 0, 0)])
            return None
        except ReadKeyError as exc:
            # Caught here: it is an OSError, which _serve takes for a reader gone away (a silent close).
            _send_all(conn, [self._framed(_error_response("PermissionDenied", str(exc)), 0, 0)])
            return None
        except ValueError as exc:
            _send_all(conn, [self._framed(_error_response("InvalidArgument", str(exc)), 0, 0)])
            return None
        frame = prepared.frame
        if frame is None:
            _send_all(conn, [self._framed(prepared.header, 0, 0)])
            return None
        by_address = request.read_memory and bool(frame.arrays)
        if by_address:
            prepared.header.buffer_addresses.extend(address_of(data) for data in frame.arrays)
            prepared.header.buffer_lengths.extend(data.nbytes for data in frame.arrays)
        # The prefix's parts are small (in-band values): one copy into the header's buffer saves
        # the kernel an iovec for each; the out-of-band buffers go from their numpy memory.
        head = self._framed(prepared.header, frame.prefix_nbytes,
                            frame.prefix_nbytes if by_address else frame.nbytes) + b"".join(frame.prefix)
        try:
            _send_all(conn, [head] if by_address else [head] + frame.buffers)
        except OSError:
            prepared.give_back()
            raise
        return prepared if by_address else None

    @staticmethod
    def _framed(header: worker_pb2.ElementChunk, prefix_len: int, frame_len: int) -> bytes:
        raw = header.SerializeToString()
        return RESPONSE_HEADER.pack(len(raw), prefix_len, frame_len) + raw

    def stop(self) -> None:
        self._stopped.set()
        try:
            # shutdown() wakes a thread blocked in accept(); close() alone does not on Linux.
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                socket.socket.shutdown(conn, socket.SHUT_RDWR)  # an SSLSocket's own would drop its TLS state
            except OSError:
                pass
        self._thread.join(timeout=5)
