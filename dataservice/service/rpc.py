"""gRPC plumbing shared by every process: servers, channels, and error translation.

``create_server(address, services)`` returns ``(server, port)`` so tests can bind port 0;
every server carries the standard health service, which reports the names of the
services it serves (``dataservice.Dispatcher``, ``dataservice.Worker``) SERVING: a
client that reached the wrong one asks it which it is. Our exceptions become gRPC
status codes at the server boundary (``abort_with``), and status codes become
our exceptions again at the client boundary (``translate``): no bare
``grpc.RpcError`` reaches a user.

Services are registered with ``add_service``, whose handlers parse their own requests: a
request that is not a valid protobuf of its type is answered INVALID_ARGUMENT with one
rate-limited log line, where gRPC's generated code would answer INTERNAL and log a traceback
per call.

Example::

    >>> server, port = create_server("127.0.0.1:0", services=("dataservice.Dispatcher",))
    >>> add_service(server, dispatcher_pb2.DESCRIPTOR.services_by_name["Dispatcher"],
    ...             {"GetStatus": core.get_status, ...}, logging.getLogger("dataservice.dispatcher"))
    >>> server.start()
    >>> channel = make_channel(f"127.0.0.1:{port}")
"""

from __future__ import annotations

import logging
import random
import time
from concurrent import futures
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, TypeVar

import grpc
from google.protobuf import message as protobuf_message
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dataservice import errors
from dataservice.service.auth import AuthInterceptor, ClusterAuth, credential_metadata
from dataservice.service.listening import bind_error
from dataservice.service.log_limits import RateLimitedLog
from dataservice.service.tls import TlsSettings

__all__ = ["create_server", "add_service", "register_handlers", "make_channel", "translate", "abort_with", "call_with_retry",
           "GrpcFailure", "transport_cause", "MAX_MESSAGE_BYTES", "CHUNK_BYTES", "RETRYABLE_CODES"]

#: Largest gRPC message either side accepts. Elements larger than a message
#: travel in several chunks, so this never caps an element's size.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Size of the chunks a frame of elements is cut into.
CHUNK_BYTES = 4 * 1024 * 1024

_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),
    # Reconnect quickly after a restart instead of grpc's default backoff of up to 2 minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 100),
]

T = TypeVar("T")


def create_server(address: str, services: Sequence[str] = (), max_workers: int = 32,
                  auth: Optional[ClusterAuth] = None, what: str = "the server",
                  tls: Optional[TlsSettings] = None) -> tuple[grpc.Server, int]:
    """A gRPC server bound to ``address`` (port 0 picks one) with the health service; not started.

    ``services`` are the full names (``package.Service``) the health service reports SERVING,
    besides the server as a whole (""). With ``auth`` every other call must carry the cluster
    credential (``dataservice.service.auth``); ``what`` names the server in refusals. With ``tls``
    (a server's ``TlsSettings``) the port speaks TLS only, requiring client certificates under mutual TLS.
    """
    interceptors = [AuthInterceptor(auth, what)] if auth is not None else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dataservice-rpc"),
                         options=_CHANNEL_OPTIONS[:2] + [("grpc.so_reuseport", 0)], interceptors=interceptors)
    try:
        port = server.add_secure_port(address, tls.server_credentials()) if tls is not None \
            else server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc's way of saying the bind failed, without saying why
        raise bind_error(address, f"{what}'s gRPC port") from exc
    if port == 0:  # older grpc's way of saying the same
        raise bind_error(address, f"{what}'s gRPC port")
    servicer = health.HealthServicer()
    for name in ("", *services):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return server, port


def add_service(server: grpc.Server, service: ServiceDescriptor, implementations: Mapping[str, Callable[[Any], Any]],
                logger: logging.Logger, record: Optional[Callable[[str, float], None]] = None) -> None:
    """Serves ``service`` on ``server`` under its usual paths (``/dataservice.Dispatcher/GetSplit``):
    method ``name`` by ``implementations[name](request)``, which returns the response, or for a
    server-streaming method an iterator of responses.

    Each handler gets the request's raw bytes and parses them itself: bytes that are not a valid
    request answer INVALID_ARGUMENT ("GetSplit: the request is not a valid dataservice.GetSplitRequest
    (17 bytes): Wire format was corrupt"). An implementation's ``errors.DataServiceError`` becomes its
    status code (``abort_with``); any other exception is a bug: INTERNAL. Refusals as INVALID_ARGUMENT
    are logged as one line without a traceback, and bugs with their traceback, each at most once a minute
    per method and kind (``RateLimitedLog``), so a flood of bad requests cannot flood the log.
    ``record(method, seconds)`` is told how long each call took.
    """
    limited = RateLimitedLog(logger)
    handlers = {}
    for method, impl, request_type, serialize in _service_methods(service, implementations, streaming=True):
        # No request_deserializer: grpc hands the handler the raw bytes.
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _stream_handler(method.name, request_type, impl, limited, record), response_serializer=serialize)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _unary_handler(method.name, request_type, impl, limited, record), response_serializer=serialize)
    register_handlers(server, service.full_name, handlers)


def _service_methods(service: ServiceDescriptor, implementations: Mapping[str, Callable], streaming: bool):
    """(method, implementation, request class, response serializer) for each method of ``service``;
    ValueError for one without an implementation, or streaming where it is not served."""
    for method in service.methods:
        if method.client_streaming or (method.server_streaming and not streaming):
            raise ValueError(f"{method.full_name}: {'client-' if method.client_streaming else ''}streaming methods "
                             "are not supported")
        impl = implementations.get(method.name)
        if impl is None:
            raise ValueError(f"{method.full_name}: no implementation given")
        yield (method, impl, message_factory.GetMessageClass(method.input_type),
               message_factory.GetMessageClass(method.output_type).SerializeToString)


def register_handlers(server, service_name: str, handlers: dict) -> None:
    """Serves ``handlers`` under ``service_name`` on a threaded or an asyncio server."""
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, handlers),))
    # As generated code does: stubs call these paths as registered methods.
    server.add_registered_method_handlers(service_name, handlers)


def _parse(method: str, request_type, raw: bytes, context: grpc.ServicerContext, limited: RateLimitedLog):
    """The request, or None after aborting the call with INVALID_ARGUMENT."""
    try:
        return request_type.FromString(raw)
    except protobuf_message.DecodeError as exc:
        message = _undecodable(method, request_type, raw, exc, context.peer(), limited)
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
    return None  # not reached: abort raises


def _undecodable(method: str, request_type, raw: bytes, exc: Exception, peer: str, limited: RateLimitedLog) -> str:
    """What INVALID_ARGUMENT says of a request that is not one (logged, rate-limited)."""
    # "Error parsing message with type 'X': Wire format was corrupt": the type is said already.
    reason = str(exc).rpartition("': ")[2] or type(exc).__name__
    message = (f"{method}: the request is not a valid {request_type.DESCRIPTOR.full_name} ({len(raw):,} bytes): "
               f"{reason}")
    limited.warning((method, "parse"), "%s; from %s, answered INVALID_ARGUMENT (a client of another protocol, or "
                    "another version of dataservice?)", message, peer)
    return message


def _failure(method: str, exc: Exception, context: grpc.ServicerContext, limited: RateLimitedLog) -> None:
    """Ends the call with ``exc``'s status code, logging what an operator needs to see."""
    context.abort(*_failure_status(method, exc, context.peer(), limited))


def _failure_status(method: str, exc: Exception, peer: str, limited: RateLimitedLog) -> tuple:
    """(status code, details) that end a call failed with ``exc``; logs what an operator needs to see."""
    code = _code_for(exc)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        limited.warning((method, "invalid"), "%s from %s refused as INVALID_ARGUMENT: %s", method, peer, exc)
    elif code is None:
        limited.error((method, type(exc)), "%s failed with %s (a bug; the caller got INTERNAL): %s", method,
                      type(exc).__name__, exc, exc_info=exc)
    # Other codes (NOT_FOUND, PERMISSION_DENIED, ...) are ordinary answers: the caller is told, not the log.
    return (code, str(exc)) if code is not None else (grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")


def _unary_handler(method: str, request_type, impl: Callable, limited: RateLimitedLog,
                   record: Optional[Callable[[str, float], None]]):
    def handle(raw: bytes, context: grpc.ServicerContext):
        start = time.perf_counter()
        try:
            request = _parse(method, request_type, raw, context, limited)
            try:
                return impl(request)
            except Exception as exc:  # noqa: BLE001 - every failure gets a status code, bugs INTERNAL
                failure = exc
            _failure(method, failure, context, limited)  # outside the try: abort raises
        finally:
            if record is not None:
                record(method, time.perf_counter() - start)

    handle.__name__ = method
    return handle


def _stream_handler(method: str, request_type, impl: Callable, limited: RateLimitedLog,
                    record: Optional[Callable[[str, float], None]]):
    def handle(raw: bytes, context: grpc.ServicerContext) -> Iterator:
        start = time.perf_counter()
        try:
            request = _parse(method, request_type, raw, context, limited)
            try:
                # A reader that goes away closes this generator: GeneratorExit reaches the implementation.
                yield from impl(request)
                return
            except Exception as exc:  # noqa: BLE001 - as in _unary_handler
                failure = exc
            _failure(method, failure, context, limited)
        finally:
            if record is not None:
                record(method, time.perf_counter() - start)

    handle.__name__ = method
    return handle


class _CredentialInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the cluster credential to every call of a channel."""

    def __init__(self, auth: ClusterAuth):
        self._metadata = tuple(credential_metadata(auth))

    def _details(self, details):
        return details._replace(metadata=tuple(details.metadata or ()) + self._metadata)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)


def make_channel(address: str, auth: Optional[ClusterAuth] = None, tls: Optional[TlsSettings] = None
                 ) -> grpc.Channel:
    """A channel to ``address``; with ``auth`` every call on it carries the cluster credential; with
    ``tls`` (a client's ``TlsSettings``) it speaks TLS, verifying the server against the CA."""
    channel = grpc.secure_channel(address, tls.channel_credentials(), options=_CHANNEL_OPTIONS) \
        if tls is not None else grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
    return grpc.intercept_channel(channel, _CredentialInterceptor(auth)) if auth is not None else channel


_TO_CODE = [
    (errors.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (errors.InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotSplittableError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    # Includes the journal's JournalError: the change was rolled back, and once the
    # dispatcher's disk recovers a retry succeeds.
    (errors.ServiceUnavailableError, grpc.StatusCode.UNAVAILABLE),
]

_FROM_CODE = {
    grpc.StatusCode.UNAUTHENTICATED: errors.PermissionDeniedError,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDeniedError,
    grpc.StatusCode.NOT_FOUND: errors.NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExistsError,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidRequestError,
    grpc.StatusCode.FAILED_PRECONDITION: errors.NotSplittableError,
    grpc.StatusCode.UNAVAILABLE: errors.ServiceUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.ServiceUnavailableError,
}

#: The failures ``call_with_retry`` retries: the server may be restarting, or not up yet.
RETRYABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _code_for(exc: Exception) -> Optional[grpc.StatusCode]:
    """The status code that stands for ``exc``; None for INTERNAL (a bug)."""
    for kind, code in _TO_CODE:
        if isinstance(exc, kind):
            return code
    return None


def abort_with(context: grpc.ServicerContext, exc: Exception) -> None:
    """Ends an RPC with the status code that stands for ``exc``."""
    code = _code_for(exc)
    if code is not None:
        context.abort(code, str(exc))
    context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")


class GrpcFailure(grpc.RpcError):
    """A failed call's status code and details in one line: what our errors are chained from.

    gRPC's own exception prints as a multi-line dump (status, details, debug_error_string) under
    the frames of gRPC's internals, which would sit in every traceback of ours; this keeps what
    a reader of the traceback needs, and ``original`` keeps gRPC's exception for debugging.

    Example::

        >>> raise errors.ServiceUnavailableError("...") from GrpcFailure(exc)
        dataservice.service.rpc.GrpcFailure: UNAVAILABLE: failed to connect to all addresses; ...
    """

    def __init__(self, exc: grpc.RpcError):
        self.original = exc
        self._code = exc.code() if hasattr(exc, "code") else None
        self._details = exc.details() if hasattr(exc, "details") else str(exc)
        name = self._code.name if self._code is not None else type(exc).__name__
        super().__init__(f"{name}: {' '.join(str(self._details).split())}")

    def code(self) -> Optional[grpc.StatusCode]:
        return self._code

    def details(self) -> str:
        return self._details


#: What gRPC's details say for the failures of connecting, as a user would put it. gRPC's wording
#: differs between versions and resolvers (c-ares, the system's), hence several phrasings each.
_TRANSPORT_CAUSES = (
    (("connection refused",), "connection refused (nothing listens on that port)"),
    (("errors resolving", "dns resolution failed", "domain name not found", "name or service not known",
      "hostname lookup", "nodename nor servname", "could not resolve"), "the host name does not resolve"),
    (("socket closed", "connection reset", "end of tcp stream", "broken pipe"),
     "the connection was closed by the other side before any answer"),
    (("timed out",), "the connection attempt timed out"),
    (("no route to host", "network is unreachable", "host is unreachable"), "no route to that host"),
)


def transport_cause(details: str) -> Optional[str]:
    """Why a call did not reach a server, in plain words, from gRPC's ``details`` of an UNAVAILABLE
    failure; None if they do not say (a server that answered UNAVAILABLE itself, say).

    Example::

        >>> transport_cause("failed to connect to all addresses; last error: ... Connection refused")
        'connection refused (nothing listens on that port)'
    """
    lowered = (details or "").lower()
    for phrases, cause in _TRANSPORT_CAUSES:
        if any(phrase in lowered for phrase in phrases):
            return cause
    return None


def translate(exc: grpc.RpcError, what: str, tried_s: Optional[float] = None) -> errors.DataServiceError:
    """Our exception for a failed RPC; ``what`` says which call to whom. ``tried_s``: how long the call
    was retried, said in the message of an unreachable server."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    kind = _FROM_CODE.get(code, errors.ServiceError)
    if kind is errors.ServiceUnavailableError:
        tried = f", tried for {tried_s:.1f} s" if tried_s is not None else ""
        cause = transport_cause(details)
        # gRPC's own words stay in the GrpcFailure the error is chained from.
        return kind(f"{what}: unreachable{tried}: {cause}" if cause else f"{what}: unreachable{tried} ({details})")
    return kind(f"{what}: {details}")


def call_with_retry(fn: Callable[[float], T], what: str, timeout_s: float,
                    should_stop: Optional[Callable[[], bool]] = None,
                    diagnose: Optional[Callable[[grpc.RpcError], Optional[Exception]]] = None,
                    cancelled_is_transient: bool = False) -> T:
    """Calls ``fn(per_call_timeout_s)`` until it succeeds, retrying UNAVAILABLE with
    jittered backoff for up to ``timeout_s`` in all. With ``cancelled_is_transient``, CANCELLED
    too, unless ``should_stop`` says the caller stopped: a caller that did not cancel the call
    itself (by closing its channel) was cancelled by the server, as a server that stops does
    to the calls in flight; the server that comes back answers the retry.

    Other failures are translated and raised at once; the last UNAVAILABLE is
    raised as ServiceUnavailableError when the time is up, saying how long it was tried.
    The last try is made at the deadline and no sleep runs past it, so the call gives up
    ``timeout_s`` after it started (plus that last try's 50 ms at most, and ``diagnose``'s
    time), neither early nor late. ``diagnose`` sees every failure first: an exception it
    returns (say, "that address is not a dispatcher") is raised instead, and nothing is
    retried. Raised errors are chained from a ``GrpcFailure``, never gRPC's own exception.

    Example::

        >>> call_with_retry(lambda remaining: stub.GetStatus(request, timeout=remaining),
        ...                 "GetStatus to dispatcher localhost:5050", timeout_s=60)
    """
    start = time.monotonic()
    deadline = start + timeout_s
    backoff = 0.05
    while True:
        try:
            return fn(max(0.05, deadline - time.monotonic()))
        except grpc.RpcError as exc:
            stopping = should_stop is not None and should_stop()
            diagnosis = diagnose(exc) if diagnose is not None and not stopping else None
            if diagnosis is not None:
                raise diagnosis from GrpcFailure(exc)
            retryable = exc.code() in RETRYABLE_CODES or (
                cancelled_is_transient and exc.code() == grpc.StatusCode.CANCELLED)
            if not retryable or stopping or time.monotonic() >= deadline:
                raise translate(exc, what, time.monotonic() - start if retryable else None) from GrpcFailure(exc)
            last = exc
        time.sleep(min(backoff * (0.5 + random.random()), max(0.0, deadline - time.monotonic())))
        backoff = min(backoff * 2, 1.0)
        if should_stop is not None and should_stop():
            # The owner stopped while we slept and may have closed the channel: calling
            # again would raise a bare ValueError ("closed channel") instead of our error.
            raise translate(last, what, time.monotonic() - start) from GrpcFailure(last)
