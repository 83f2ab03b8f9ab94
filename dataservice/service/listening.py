"""What a server says about its ports: why one could not be bound, where it listens, and
that it listens on loopback only.

**Bind failures.** Every port a server opens — the gRPC port (``rpc.create_server``), a
worker's data-transfer port (``worker.data_server``) and the HTTP port
(``service.http_status``) — reports a failed bind through :func:`bind_error`, in one
wording. gRPC's ``add_insecure_port`` says only that it failed, so the reason is found
by binding the address ourselves (:func:`probe_bind`); the stdlib's servers raise an
``OSError`` whose errno says it already. Each reason is told apart:

    cannot bind 127.0.0.1:5050 (the dispatcher's gRPC port): the port is in use
    cannot bind 192.0.2.1:5050 (the dispatcher's gRPC port): the address is not one of this
        machine's: listen on one of its addresses, or on 0.0.0.0 for every interface
    cannot bind nosuch.example:5050 (the dispatcher's gRPC port): the host name does not resolve
        (Name or service not known)
    cannot bind 127.0.0.1:80 (the dispatcher's gRPC port): permission denied: ports below 1024
        need root (or CAP_NET_BIND_SERVICE); use a port from 1024 up

**Listening.** A server logs where it listens once, through :func:`log_listening`, whose
record carries the attribute ``LISTENING_RECORD``: the ``dataservice`` command prints
that line on stdout itself (a parent reads the port from it), and drops the record so
the line is not said twice. :func:`note_loopback_only` says, once per process, that a
server on loopback (the default) cannot be reached from other machines, and which flags
open it up.

Example::

    >>> raise bind_error("127.0.0.1:5050", "the dispatcher's gRPC port")   # after gRPC failed to bind
    dataservice.errors.ServiceUnavailableError: cannot bind 127.0.0.1:5050 (the dispatcher's gRPC port): the port is
    in use
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from typing import Any, Optional

from dataservice import errors
from dataservice.service.config import is_loopback

__all__ = ["bind_error", "probe_bind", "log_listening", "note_loopback_only", "tls_note", "LISTENING_RECORD"]

#: The attribute a server's "listening on" log record carries (True), for the command to drop it.
LISTENING_RECORD = "dataservice_listening"

_REASONS = {
    errno.EADDRINUSE: "the port is in use",
    errno.EADDRNOTAVAIL: "the address is not one of this machine's: listen on one of its addresses, or on "
                         "0.0.0.0 for every interface",
}
#: Ports below this need root (or CAP_NET_BIND_SERVICE) on Linux and the BSDs, unless the system says otherwise.
_FIRST_UNPRIVILEGED_PORT = 1024
_noted_lock = threading.Lock()
_loopback_noted = False


def _split(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` -> (host, port); an empty host or ``::`` is every interface."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def probe_bind(address: str) -> Optional[OSError]:
    """Binds and listens on ``address`` (``host:port``) for a moment, as gRPC would: the error that gives,
    or None if the address can be bound now. SO_REUSEADDR is set as gRPC sets it, so a port held only by
    connections in TIME_WAIT does not count as in use."""
    host, port = _split(address)
    every = host in ("", "::") and socket.has_ipv6
    if every:
        family, sockaddr = socket.AF_INET6, ("::", port)
    elif host in ("", "::"):
        family, sockaddr = socket.AF_INET, ("0.0.0.0", port)
    else:
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        except socket.gaierror as exc:
            return exc
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if every:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack, as gRPC binds [::]
            sock.bind(sockaddr)
            sock.listen()  # two SO_REUSEADDR sockets may bind one port on Linux; only one may listen
    except OSError as exc:
        return exc
    return None


def bind_error(address: str, role: str, error: Optional[BaseException] = None) -> errors.ServiceUnavailableError:
    """The error for a port that could not be bound: ``cannot bind ADDRESS (ROLE): REASON``.

    ``address`` is what was bound (``127.0.0.1:5050``), ``role`` says which port it is ("the worker's
    data-transfer port"). ``error`` is the OSError the bind raised; without one (gRPC's failure, which
    says nothing) the address is bound again here to learn why. Raise it ``from`` the original error.

    Example::

        >>> bind_error("127.0.0.1:5050", "the worker's gRPC port").args[0]    # another process listens there
        "cannot bind 127.0.0.1:5050 (the worker's gRPC port): the port is in use"
    """
    if not isinstance(error, OSError):
        error = probe_bind(address)
    if error is None:
        reason = "it failed, though the address can be bound now (another process held the port for a moment?)"
    elif isinstance(error, socket.gaierror):
        reason = f"the host name does not resolve ({error.strerror or error})"
    elif error.errno == errno.EACCES and 0 < _split(address)[1] < _FIRST_UNPRIVILEGED_PORT:
        reason = (f"permission denied: ports below {_FIRST_UNPRIVILEGED_PORT} need root (or CAP_NET_BIND_SERVICE); "
                  f"use a port from {_FIRST_UNPRIVILEGED_PORT} up")
    else:
        reason = _REASONS.get(error.errno, error.strerror or str(error))
    return errors.ServiceUnavailableError(f"cannot bind {address} ({role}): {reason}")


def tls_note(tls: Any) -> str:
    """What a listening line says of a server's TLS (a server's ``TlsSettings``, or None): "" without it.

    Example::

        >>> tls_note(None), tls_note(TlsSettings(cert, key, client_ca=None))
        ('', 'TLS')
    """
    if tls is None:
        return ""
    return "TLS, client certificates required" if tls.client_ca is not None else "TLS"


def log_listening(logger: logging.Logger, message: str, *args: Any) -> None:
    """Logs a server's one "listening on" line, marked so the ``dataservice`` command, which prints it on
    stdout, can drop it from the log."""
    logger.info(message, *args, extra={LISTENING_RECORD: True})


def note_loopback_only(logger: logging.Logger, what: str, host: str, address: str) -> None:
    """Says at a server's start, once per process, that it listens on loopback only (``host`` is loopback,
    the default) and how to open it up; a server beyond loopback says nothing here (``auth.warn_if_exposed``
    warns when it has no token). Once: a ``dataservice local`` cluster, or a test starting hundreds of
    servers, says it once."""
    global _loopback_noted
    with _noted_lock:
        if not is_loopback(host) or _loopback_noted:
            return
        _loopback_noted = True
    logger.info("the %s listens on loopback only (%s): other machines cannot reach it. To open it up: --host "
                "0.0.0.0 with the cluster's token on every member (--auth-token-file PATH, or DATASERVICE_AUTH_TOKEN "
                "/ DATASERVICE_AUTH_TOKEN_FILE; in Python: host=, auth_token=)", what, address)
