"""A gRPC server on asyncio, for a server whose calls mostly wait: the dispatcher's.

The dispatcher answers thousands of workers' long polls (a heartbeat waits until there is news
for its worker). A thread-per-call server holds a thread per waiting call, so it could let only a
dozen wait. Here every call is a coroutine on one event loop: a waiting call costs a future. A
handler runs short work on the loop itself and hands slow work (a huge heartbeat, a status page) to
the server's small thread pool (``AioServer.run``), so that it never stalls the loop.

Everything else is as ``rpc.create_server``/``rpc.add_service`` give a threaded server: the health
service, the cluster token (``AioAuthInterceptor``), TLS, requests parsed by the handler
(INVALID_ARGUMENT for bytes that are not one, never INTERNAL), our exceptions mapped to status
codes, rate-limited logs, and per-call timing.

The loop runs in one daemon thread per process (``event_loop()``), shared by every asyncio server
of the process (tests run several dispatchers in one).

Example::

    >>> server, port = create_aio_server("127.0.0.1:0", services=("dataservice.Dispatcher",))
    >>> async def get_status(request):
    ...     return await server.run(core.get_status, request)   # the core's work, off the loop
    >>> add_aio_service(server, descriptor, {"GetStatus": get_status, ...}, log)
    >>> server.start()
    >>> server.stop(0.5)
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent import futures
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence

import grpc
from google.protobuf import message as protobuf_message
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dataservice.service.auth import AioAuthInterceptor, ClusterAuth
from dataservice.service.listening import bind_error
from dataservice.service.log_limits import RateLimitedLog
from dataservice.service.rpc import _CHANNEL_OPTIONS, _failure_status, _service_methods, _undecodable, register_handlers
from dataservice.service.tls import TlsSettings

__all__ = ["AioServer", "create_aio_server", "add_aio_service", "event_loop", "CORE_THREADS", "MAX_PENDING_CALLS"]

#: Calls gRPC holds for the server while it is busy. gRPC's defaults (1,000, and 3,000 at most) cancel
#: the rest: a fleet's burst (ten thousand readers starting at once, or every worker's heartbeat after a
#: pause) would see CANCELLED. These are queued instead, and answered as the server gets to them.
MAX_PENDING_CALLS = 100_000

#: Threads that run the calls' work. The core serializes on one lock, so more would only queue on
#: it; a few let a huge heartbeat or a pool call's fsync (fault-tolerant mode) overlap the others.
CORE_THREADS = 8

_loop: Optional[asyncio.AbstractEventLoop] = None
_loop_lock = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's asyncio loop for gRPC servers, running in a daemon thread (started on first use)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=run, name="dataservice-aio", daemon=True).start()
            started.wait()
            _loop = loop
        return _loop


def _on_loop(coroutine: Awaitable, timeout_s: Optional[float] = None) -> Any:
    return asyncio.run_coroutine_threadsafe(coroutine, event_loop()).result(timeout_s)


class AioServer:
    """A ``grpc.aio`` server driven from ordinary threads: ``start()``, ``stop(grace)``,
    ``wait_for_termination()`` block as a threaded server's do; ``run(fn, *args)`` is how a handler
    runs blocking work on the server's thread pool."""

    def __init__(self, server: grpc.aio.Server):
        self._server = server
        self._pool = futures.ThreadPoolExecutor(max_workers=CORE_THREADS, thread_name_prefix="dataservice-core")
        self._stopped = threading.Event()

    @property
    def aio(self) -> grpc.aio.Server:
        return self._server

    def run(self, fn: Callable, *args) -> Awaitable:
        """``fn(*args)`` on the server's thread pool, awaitable from a handler."""
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def start(self) -> None:
        _on_loop(self._server.start())

    def stop(self, grace_s: Optional[float]) -> threading.Event:
        """Stops accepting calls; those in flight get ``grace_s`` seconds. Returns an event that is set
        once stopped (as a threaded server's ``stop`` does), already set when this returns."""
        if not self._stopped.is_set():
            try:
                _on_loop(self._server.stop(grace_s), timeout_s=(grace_s or 0) + 10)
            finally:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._stopped.set()
        return self._stopped

    def wait_for_termination(self, timeout_s: Optional[float] = None) -> bool:
        return self._stopped.wait(timeout_s)


def create_aio_server(address: str, services: Sequence[str] = (), auth: Optional[ClusterAuth] = None,
                      what: str = "the server", tls: Optional[TlsSettings] = None) -> tuple[AioServer, int]:
    """As ``rpc.create_server``, an asyncio server: bound to ``address`` (port 0 picks one), with the
    health service reporting ``services`` SERVING; not started."""

    async def build() -> tuple[grpc.aio.Server, int]:
        interceptors = [AioAuthInterceptor(auth, what)] if auth is not None else []
        server = grpc.aio.server(options=_CHANNEL_OPTIONS[:2] + [
            ("grpc.so_reuseport", 0), ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS)], interceptors=interceptors)
        try:
            port = server.add_secure_port(address, tls.server_credentials()) if tls is not None \
                else server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc's way of saying the bind failed, without saying why
            raise bind_error(address, f"{what}'s gRPC port") from exc
        if port == 0:
            raise bind_error(address, f"{what}'s gRPC port")
        servicer = health.aio.HealthServicer()
        for name in ("", *services):
            await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        return server, port

    server, port = _on_loop(build())
    return AioServer(server), port


def add_aio_service(server: AioServer, service: ServiceDescriptor,
                    implementations: Mapping[str, Callable[[Any], Awaitable[Any]]], logger: logging.Logger,
                    record: Optional[Callable[[str, float], None]] = None) -> None:
    """As ``rpc.add_service``, for unary methods implemented by coroutines ``implementations[name](request)``."""
    limited = RateLimitedLog(logger)
    handlers = {method.name: grpc.unary_unary_rpc_method_handler(
        _handler(method.name, request_type, impl, limited, record), response_serializer=serialize)
        for method, impl, request_type, serialize in _service_methods(service, implementations, streaming=False)}
    register_handlers(server.aio, service.full_name, handlers)


def _handler(method: str, request_type, impl: Callable, limited: RateLimitedLog,
             record: Optional[Callable[[str, float], None]]):
    async def handle(raw: bytes, context: grpc.aio.ServicerContext):
        start = time.perf_counter()
        try:
            try:
                request = request_type.FromString(raw)
            except protobuf_message.DecodeError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    _undecodable(method, request_type, raw, exc, context.peer(), limited))
            try:
                return await impl(request)
            except Exception as exc:  # noqa: BLE001 - every failure gets a status code, bugs INTERNAL
                failure = exc
            await context.abort(*_failure_status(method, failure, context.peer(), limited))
        finally:
            if record is not None:
                record(method, time.perf_counter() - start)

    handle.__name__ = method
    return handle
