"""What listens at an address that does not answer as a gRPC server should.

gRPC reports a peer that does not speak HTTP/2 (an HTTP/1 server, a worker's
data-transfer port) with UNAVAILABLE, the same status as a dispatcher that is
not up yet, and a client retrying it would only give up at its timeout. One raw
TCP connection tells the cases apart in a few milliseconds: it sends the HTTP/2
client preface and an empty SETTINGS frame, as gRPC does, and looks at the
first bytes that come back.

- nobody listens (refused, unresolvable, unroutable): ``UNREACHABLE``, perhaps not up yet, with
  ``reason`` saying which ("connection refused", "the host name does not resolve", ...);
- an HTTP/2 SETTINGS frame: ``GRPC``, a gRPC server that failed for another reason;
- ``DATA_TRANSFER_GREETING``: ``DATA_TRANSFER``, a dataservice worker's data-transfer
  port (its server says so when it sees the preface);
- a TLS record, or (a server that closes on plaintext without a byte, as gRPC's TLS servers do)
  a TLS handshake that succeeds on a second connection: ``TLS``;
- any other bytes: ``NOT_GRPC``, with the first line in ``answer``;
- the connection accepted, then closed without a byte: ``CLOSED``. Once is no proof (a gRPC
  server closes connections while it stops), but a dispatcher does it only for a moment: an
  address that keeps doing it is something else (a proxy with nothing behind it, another
  service), and ``DispatcherClient`` gives up on it after ``dispatcher_client.CLOSED_VERDICT_S``;
- the connection accepted, then left silent: ``SILENT``. That is not proof either: the kernel
  accepts connections for a process that is paused, so callers keep retrying on it.

Example::

    >>> probe_endpoint("localhost:8000")
    Probe(kind=<EndpointKind.NOT_GRPC: 'not gRPC'>, answer="'HTTP/1.1 400 Bad Request'")
    >>> probe_endpoint("localhost:1")
    Probe(kind=<EndpointKind.UNREACHABLE: 'unreachable'>, answer='', reason='connection refused')
"""

from __future__ import annotations

import dataclasses
import enum
import re
import socket
import ssl
import time

from dataservice.service.addresses import parse_address

__all__ = ["EndpointKind", "Probe", "probe_endpoint", "HTTP2_PREFACE", "GRPC_CLIENT_OPENING", "DATA_TRANSFER_GREETING",
           "PROBE_TIMEOUT_S"]

#: What every HTTP/2 client sends first (RFC 9113, section 3.4).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: An empty SETTINGS frame: length 0, type 4, no flags, stream 0. gRPC's client sends one after the
#: preface, and some HTTP/2 servers wait for it before they answer.
_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
#: What a gRPC client sends first: the preface, then its SETTINGS.
GRPC_CLIENT_OPENING = HTTP2_PREFACE + _EMPTY_SETTINGS
#: What a worker's data-transfer server answers to an HTTP/2 preface (or any text) before it closes.
DATA_TRANSFER_GREETING = b"dataservice data-transfer port\n"
#: Bound on connecting and on waiting for the first bytes. A server on a LAN answers in
#: milliseconds; one slower than this is called UNREACHABLE or SILENT, on which callers keep
#: retrying, so a slow network costs a clear message, never a wrong verdict.
PROBE_TIMEOUT_S = 1.0
#: Enough for an HTTP/1 status line or an HTML page's title.
_MAX_ANSWER_BYTES = 1024


class EndpointKind(enum.Enum):
    """What a probe found at an address; see the module docstring."""

    UNREACHABLE = "unreachable"
    GRPC = "gRPC"
    DATA_TRANSFER = "data-transfer port"
    TLS = "TLS"
    NOT_GRPC = "not gRPC"
    CLOSED = "closed"
    SILENT = "silent"


@dataclasses.dataclass(frozen=True)
class Probe:
    """The outcome of ``probe_endpoint``."""

    kind: EndpointKind
    #: For NOT_GRPC, what the peer sent, to follow "it answered": its HTTP status line quoted, say.
    answer: str = ""
    #: For UNREACHABLE, why the connection failed, in plain words ("connection refused").
    reason: str = ""


def _is_settings_frame(data: bytes) -> bool:
    # An HTTP/2 server's first frame must be SETTINGS: a 9-byte header with type 4 on stream 0,
    # and a payload of 6-byte entries. No text protocol's first bytes look like that.
    if len(data) < 9:
        return False
    length = int.from_bytes(data[:3], "big")
    return data[3] == 0x04 and data[5:9] == b"\x00\x00\x00\x00" and length % 6 == 0


def _complete(data: bytes) -> bool:
    """Whether ``data`` already says enough to classify the peer."""
    return (_is_settings_frame(data) or _is_tls(data) or data.startswith(DATA_TRANSFER_GREETING)
            or b"</title>" in data.lower() or (b"\n" in data and not data.lstrip().startswith(b"<")))


def _is_tls(data: bytes) -> bool:
    # A TLS record: content type 21 (alert) or 22 (handshake), then version 3.x.
    return len(data) >= 2 and data[0] in (0x15, 0x16) and data[1] == 0x03


def _summary(data: bytes) -> str:
    """What an answer was, to follow "it answered": its HTTP status line, an HTML page's title,
    its first line, or its first bytes."""
    text = data.decode("latin-1")
    status = re.search(r"^HTTP/\d(?:\.\d)? [^\r\n]*", text, re.M)
    if status:
        return repr(status.group(0).strip())
    title = re.search(r"<title>\s*([^<]*?)\s*</title>", text, re.I)
    if title:
        return f"an HTML page titled {title.group(1)[:60]!r}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first and first.isprintable():
        return repr(first[:80])
    return repr(data[:24])  # binary: its first bytes, escaped


def _read_answer(sock: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """What the peer sent by ``deadline``, and whether it closed the connection (or reset it)."""
    data = b""
    while len(data) < _MAX_ANSWER_BYTES and not _complete(data):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(_MAX_ANSWER_BYTES - len(data))
        except socket.timeout:  # what arrived before still counts
            break
        except OSError:  # reset: closed, too
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def _unreachable_reason(exc: OSError, timeout_s: float) -> str:
    """Why ``socket.create_connection`` failed, as a user would put it."""
    if isinstance(exc, socket.gaierror):
        return f"the host name does not resolve ({exc.strerror or exc})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.timeout):
        return f"no answer to a connection attempt within {timeout_s:g} s"
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


def _speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    """Whether a TLS handshake with ``host:port`` succeeds. Nothing is verified, and nothing sent over it:
    this only tells a TLS server (which closes on plaintext without a word) from one that is silent."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            with context.wrap_socket(sock, server_hostname=host or None):
                return True
    except (OSError, ValueError):
        return False


def probe_endpoint(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """Connects to ``address`` (``host:port`` or ``grpc://host:port``) once and says what answers there.

    Takes at most about ``3 * timeout_s`` (connecting, waiting for the first bytes, and for a peer
    that closed without a word one TLS handshake), plus the time to resolve the host name.
    """
    host, port = parse_address(address)
    host = host.strip("[]")  # an IPv6 literal's brackets belong to the address syntax, not the host
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:  # refused, unresolvable, unroutable, or no answer to the SYN
        return Probe(EndpointKind.UNREACHABLE, reason=_unreachable_reason(exc, timeout_s))
    with sock:
        try:
            sock.sendall(GRPC_CLIENT_OPENING)
        except OSError:
            pass  # it may have spoken and closed first: read what it said
        data, closed = _read_answer(sock, time.monotonic() + timeout_s)
    if not data:
        if _speaks_tls(host, port, timeout_s):
            return Probe(EndpointKind.TLS)
        return Probe(EndpointKind.CLOSED if closed else EndpointKind.SILENT)
    if _is_settings_frame(data):
        return Probe(EndpointKind.GRPC)
    if data.startswith(DATA_TRANSFER_GREETING.rstrip(b"\n")):
        return Probe(EndpointKind.DATA_TRANSFER)
    if _is_tls(data):
        return Probe(EndpointKind.TLS)
    return Probe(EndpointKind.NOT_GRPC, _summary(data))
