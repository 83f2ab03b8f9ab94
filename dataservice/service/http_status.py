"""A server's HTTP side: ``/metrics`` (Prometheus), ``/status.json`` and a status page ``/``.

Every dispatcher and worker serves it when its config has ``http_port`` (``--http-port``):
a stdlib ``ThreadingHTTPServer`` on a daemon thread, bound to the same host as the server's
gRPC port, started and stopped with the server. It is read-only and unauthenticated (as
Prometheus endpoints usually are): it shows counts, ids, addresses and timings, never a
pipeline, a read key or the auth token.

* ``/metrics``: the text format of ``prometheus_client`` from the server's own registry; the
  collectors (``dispatcher/metrics.py``, ``worker/metrics.py``) read the server's state when
  scraped, so a metric costs nothing between scrapes.
* ``/status.json``: what the server knows now, as JSON (``status()`` of the server's collector).
* ``/``: ``status_page.html``, which renders that JSON and polls ``/status.json`` every few seconds.
  The page arrives with the current status in it, so it shows the tables without waiting for a poll.

Anything else is a 404 naming the paths there are; methods other than GET and HEAD get a 405.
At most ``MAX_CONNECTIONS`` requests are served at once; more get a 503 at once.

Example::

    >>> registry = CollectorRegistry()
    >>> registry.register(WorkerMetrics(worker))          # dataservice.worker.metrics
    >>> server = HttpStatusServer("localhost", 0, registry, status=lambda: {"server": "worker"})
    >>> server.start()
    >>> urllib.request.urlopen(f"http://localhost:{server.port}/metrics").read()[:33]
    b'# HELP dataservice_worker_info Th'
    >>> server.stop()
"""

from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
from importlib import resources
from typing import Callable, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dataservice.service.config import bind_address
from dataservice.service.listening import bind_error

__all__ = ["HttpStatusServer", "MAX_CONNECTIONS", "status_page"]

log = logging.getLogger("dataservice.http")

#: Requests served at once; a scraper or browser beyond this gets a 503 instead of another thread.
MAX_CONNECTIONS = 32
#: A request must arrive whole within this long, or its connection is closed.
REQUEST_TIMEOUT_S = 10.0
_PAGE_PLACEHOLDER = "/*INITIAL_STATUS*/null"
_PATHS = ("/", "/metrics", "/status.json")
_BUSY_BODY = f"more than {MAX_CONNECTIONS} requests at once: try again\n".encode()
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: "
         + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY)


def status_page(initial: Optional[dict] = None) -> bytes:
    """The status page, with ``initial`` (a status dict) built in so it renders before its first poll."""
    page = resources.files("dataservice.service").joinpath("status_page.html").read_text(encoding="utf-8")
    # "</" inside a <script> would end it: JSON allows "<\/" for "</".
    data = json.dumps(initial).replace("</", "<\\/") if initial is not None else "null"
    return page.replace(_PAGE_PLACEHOLDER, data, 1).encode("utf-8")


def _listen_family(host: str, port: int) -> tuple[int, str]:
    """The socket family and address to bind for ``host`` (as ``config.bind_address`` reads it)."""
    if host in ("", "::", "[::]"):
        return socket.AF_INET6, "::"  # every interface, IPv4 too (dual stack: see _Server.server_bind)
    if host == "localhost":
        return socket.AF_INET, "127.0.0.1"
    host = host.strip("[]")
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, _, _, _, address = infos[0]
    return family, address[0]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # Not SO_REUSEADDR's Linux meaning only: a stopped server's port is free again at once.
    allow_reuse_address = True

    def __init__(self, address: tuple, family: int, owner: "HttpStatusServer"):
        self.address_family = family
        self.owner = owner
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            try:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            except OSError:  # an IPv6-only host: IPv6 it is
                pass
        super().server_bind()

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    server_version = "dataservice"

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self._answer(send_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(send_body=False)

    def _refuse(self) -> None:
        self._send(405, "text/plain; charset=utf-8", f"{self.command} is not allowed: this server is read-only "
                   f"(GET {', '.join(_PATHS)})\n".encode(), True, allow="GET, HEAD")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def _answer(self, send_body: bool) -> None:
        owner = self.server.owner
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                body, kind = generate_latest(owner.registry), CONTENT_TYPE_LATEST
            elif path == "/status.json":
                body, kind = json.dumps(owner.status(), indent=1).encode(), "application/json"
            elif path in ("/", "/index.html"):
                body, kind = status_page(owner.status()), "text/html; charset=utf-8"
            else:
                self._send(404, "text/plain; charset=utf-8",
                           f"no such page: {path[:200]} (there are {', '.join(_PATHS)})\n".encode(), send_body)
                return
        except Exception as exc:  # a bug in a collector must not kill the thread silently
            log.exception("HTTP %s failed", path)
            self._send(500, "text/plain; charset=utf-8", f"internal error: {type(exc).__name__}: {exc}\n".encode(),
                       send_body)
            return
        self._send(200, kind, body, send_body)

    def _send(self, code: int, kind: str, body: bytes, send_body: bool, allow: Optional[str] = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if allow:
            self.send_header("Allow", allow)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the stdlib's signature)
        log.debug("%s %s", self.address_string(), format % args)


class HttpStatusServer:
    """Serves ``registry`` at ``/metrics`` and ``status()`` at ``/status.json`` and ``/``; see the module
    docstring. ``start`` binds (``errors.ServiceUnavailableError`` saying why it cannot: ``listening.bind_error``)
    and serves on a daemon thread."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, status: Callable[[], dict],
                 what: str = "the server"):
        self.host = host
        self.registry = registry
        self.status = status
        self._port = port
        self._what = what
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        """The bound port (the one picked, for port 0)."""
        if self._server is None:
            raise RuntimeError("the HTTP server has not been started")
        return self._server.server_address[1]

    def start(self) -> None:
        if self._server is not None:
            return
        try:
            family, address = _listen_family(self.host, self._port)
            server = _Server((address, self._port), family, self)
        except OSError as exc:
            raise bind_error(bind_address(self.host, self._port), f"{self._what}'s HTTP port", exc) from exc
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="dataservice-http", daemon=True)
        self._thread.start()
        log.info("%s serves /metrics, /status.json and its status page on http://%s:%d/", self._what,
                 self.host or "[::]", self.port)

    def stop(self) -> None:
        """Stops serving and closes the port; idempotent. Requests in flight finish on their own threads."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
