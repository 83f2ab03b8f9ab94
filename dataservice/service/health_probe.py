"""``dataservice health``: ask a dispatcher or a worker whether it is serving (for container healthchecks).

Every server carries the standard gRPC health service (``grpc.health.v1.Health``, see
``rpc.create_server``), which reports the server as a whole ("") and the names of the services it
serves (``dataservice.Dispatcher``, ``dataservice.Worker``) SERVING. This command makes one ``Check``
call and exits 0 when the answer is SERVING, so a Docker ``HEALTHCHECK`` or a compose
``healthcheck:`` can run it inside the container; Kubernetes asks the same service with its native
``grpc:`` probes (``deploy/k8s/``).

The health service needs no cluster token (the servers keep it open for probes, which cannot send
one). ``--check-auth`` also checks that the server accepts this process's cluster token
(``--auth-token-file``, ``DATASERVICE_AUTH_TOKEN[_FILE]``): it makes a call to a method no server has,
which a server's ``AuthInterceptor`` refuses with UNAUTHENTICATED before looking for the method when
the token differs, and answers UNIMPLEMENTED when it is accepted. A container whose token file was
rotated while its server kept the old token then turns unhealthy. TLS flags are those of ``status``.

Exit codes: 0 serving; 1 not serving, unreachable, or (``--check-auth``) the token is missing or
refused, each with a one-line message on stderr; 2 a malformed command line (argparse's usage error).
Docker reserves exit code 2 for itself, so every verdict about the server is 0 or 1.

Example::

    $ dataservice health localhost:5050 --service dispatcher
    grpc://localhost:5050: SERVING (dataservice.Dispatcher)
    $ dataservice health localhost:1 --timeout-ms 500
    dataservice health: error: nothing listens at localhost:1 (connection refused)
    $ echo $?
    1
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any, Callable, Optional

import grpc

from dataservice.service.addresses import channel_address, parse_address, target
from dataservice.service.auth import TOKEN_ENV, TOKEN_FILE_ENV, ClusterAuth, read_token_file
from dataservice.service.tls import TlsSettings, probe_tls

__all__ = ["add_parser", "run", "check_health", "HealthResult", "SERVICE_ALIASES", "HEALTH_TIMEOUT_MS",
           "AUTH_PROBE_METHOD"]

#: Default of ``--timeout-ms``, for all the command's calls together: a server answers a health check in
#: milliseconds even when busy, so seconds mean trouble; with the process start (under a second) it stays
#: inside the compose healthchecks' 8 s timeout.
HEALTH_TIMEOUT_MS = 3000
#: Short names ``--service`` accepts for our services' full names.
SERVICE_ALIASES = {"dispatcher": "dataservice.Dispatcher", "worker": "dataservice.Worker", "any": ""}
#: A method no server has: the auth interceptor judges the credential before it looks the method up.
AUTH_PROBE_METHOD = "/dataservice.HealthProbe/CheckAuth"

EXIT_UNHEALTHY = 1


@dataclasses.dataclass(frozen=True)
class HealthResult:
    """The verdict of :func:`check_health`: ``healthy``, and a one-line ``message`` saying why."""

    healthy: bool
    message: str


def _service_name(text: str) -> str:
    """``--service``: an alias (dispatcher, worker, any) or a full service name such as ``dataservice.Worker``."""
    name = SERVICE_ALIASES.get(text.strip().lower(), text.strip())
    if name and not all(part.isidentifier() for part in name.split(".")):
        raise argparse.ArgumentTypeError(f"expected dispatcher, worker, any or a gRPC service name such as "
                                         f"dataservice.Worker, got {text!r}")
    return name


def _address(text: str) -> str:
    try:
        return channel_address(text, "server")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(commands: Any, positive_ms: Callable[[str], int], add_auth_token_file: Callable,
               add_client_tls_flags: Callable) -> argparse.ArgumentParser:
    """Adds ``health`` to the ``dataservice`` command's subparsers (flag helpers are the CLI's own)."""
    health = commands.add_parser(
        "health", help="check that a dispatcher or worker is serving (for healthchecks)",
        description="Ask a dispatcher or a worker's standard gRPC health service whether it is serving: "
                    "exit 0 if so, 1 (with a one-line reason) if not. For Docker/compose healthchecks.")
    health.add_argument("address", type=_address, metavar="HOST:PORT",
                        help="the server's gRPC address (a dispatcher's or a worker's --port), host:port or "
                             "grpc://host:port")
    health.add_argument("--service", type=_service_name, default="", metavar="NAME",
                        help="the service that must be SERVING: dispatcher, worker, or a full name such as "
                             "dataservice.Worker (default: the server as a whole)")
    health.add_argument("--timeout-ms", type=positive_ms, metavar="N", default=HEALTH_TIMEOUT_MS,
                        help=f"give up after this long, exit code 1 (default: {HEALTH_TIMEOUT_MS})")
    health.add_argument("--check-auth", action="store_true",
                        help="also check that the server accepts this process's cluster token (the health "
                             "service itself needs none)")
    add_auth_token_file(health)
    add_client_tls_flags(health)
    health.set_defaults(_parser=health)
    return health


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _unreachable(address: str, exc: grpc.RpcError, tls: Optional[TlsSettings]) -> str:
    """Why a Check call found no gRPC server: one raw connection tells what is there (endpoint_probe)."""
    from dataservice.service.endpoint_probe import EndpointKind, probe_endpoint

    probe = probe_endpoint(address)
    if tls is not None and probe.kind is EndpointKind.TLS:
        # A TLS server that refused the handshake: a CA that did not sign its certificate, or (mutual
        # TLS) this client's certificate refused. One TLS connection of our own says which.
        why = probe_tls(parse_address(address), tls)
        if why is not None:
            return f"the TLS handshake with {address} failed: {why}"
    if probe.kind is EndpointKind.UNREACHABLE:
        return f"nothing listens at {address} ({probe.reason})"
    if probe.kind is EndpointKind.CLOSED:
        return f"{address} accepts connections and closes them at once without a word: not a dataservice server"
    if probe.kind is EndpointKind.DATA_TRANSFER:
        return f"{address} is a worker's data-transfer port: pass its gRPC port (the worker's --port)"
    if probe.kind is EndpointKind.NOT_GRPC:
        return f"{address} does not speak gRPC (it answered {probe.answer})"
    if probe.kind is EndpointKind.TLS:
        return f"{address} speaks TLS: pass --tls-ca (or set DATASERVICE_TLS_CA) to the CA of its certificate"
    return f"{address} did not answer within the timeout ({_one_line(exc.details() or exc.code().name)})"


def _check_auth(channel: grpc.Channel, plain: grpc.Channel, address: str, deadline: float) -> Optional[str]:
    """None if the server accepts the credential ``channel`` carries, else why not."""
    def code(on: grpc.Channel) -> grpc.StatusCode:
        try:
            on.unary_unary(AUTH_PROBE_METHOD)(b"", timeout=max(0.05, deadline - time.monotonic()))
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK  # not expected: no server has the method

    with_token = code(channel)
    if with_token is grpc.StatusCode.UNAUTHENTICATED:
        return f"{address} refused this cluster token: it runs with another one (restart it after rotating the " \
               f"token file, or fix {TOKEN_FILE_ENV} here)"
    if with_token is not grpc.StatusCode.UNIMPLEMENTED:
        return f"{address} did not answer the token check ({with_token.name})"
    if code(plain) is grpc.StatusCode.UNIMPLEMENTED:
        return f"{address} accepts calls without any token: it does not run with the cluster token"
    return None


def check_health(address: str, service: str = "", timeout_s: float = HEALTH_TIMEOUT_MS / 1000,
                 auth: Optional[ClusterAuth] = None, tls: Optional[TlsSettings] = None,
                 check_auth: bool = False) -> HealthResult:
    """Asks the health service at ``address`` whether ``service`` ("" for the whole server) is SERVING.

    With ``check_auth`` (which needs ``auth``) the server must also accept the cluster token. ``timeout_s``
    bounds the calls together.

    Example::

        >>> check_health("localhost:5050", "dataservice.Dispatcher")
        HealthResult(healthy=True, message='grpc://localhost:5050: SERVING (dataservice.Dispatcher)')
    """
    # Imported here: building the ``dataservice`` command's parser imports this module, and the commands
    # other than ``health`` (``--version``) need neither protobuf nor our channel code.
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from dataservice.service.rpc import make_channel

    if check_auth and auth is None:
        return HealthResult(False, f"--check-auth needs the cluster token: pass --auth-token-file or set "
                                   f"{TOKEN_ENV} or {TOKEN_FILE_ENV}")
    deadline = time.monotonic() + timeout_s
    channel = make_channel(address, auth, tls)
    plain = make_channel(address, None, tls) if check_auth else None
    try:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                                  timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return HealthResult(False, f"{address} does not serve {service} (is it the right kind of server?)")
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                return HealthResult(False, f"{address} is a gRPC server without the health service: not a "
                                           f"dataservice server")
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return HealthResult(False, _unreachable(address, exc, tls))
            return HealthResult(False, f"{address}: health check failed: {exc.code().name} "
                                       f"({_one_line(exc.details() or '')})")
        names = {value: name for name, value in health_pb2.HealthCheckResponse.ServingStatus.items()}
        status = names.get(response.status, str(response.status))
        label = f"{target(address, 'server')}: {status}" + (f" ({service})" if service else "")
        if response.status != health_pb2.HealthCheckResponse.SERVING:
            return HealthResult(False, label)
        if check_auth:
            refused = _check_auth(channel, plain, address, deadline)
            if refused is not None:
                return HealthResult(False, refused)
            label += "; the cluster token is accepted"
        return HealthResult(True, label)
    finally:
        channel.close()
        if plain is not None:
            plain.close()


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Runs ``dataservice health``; returns the exit code (0 serving, 1 not, 2 from argparse)."""
    prog = "dataservice health"
    try:
        auth = ClusterAuth.resolve(read_token_file(args.auth_token_file) if args.auth_token_file else None)
        tls = TlsSettings.resolve(args.tls_ca, args.tls_cert, args.tls_key)
    except ValueError as exc:
        # A token file that vanished or a CA that cannot be read: the probe fails, it does not misuse argv.
        print(f"{prog}: error: {_one_line(str(exc))}", file=sys.stderr, flush=True)
        return EXIT_UNHEALTHY
    result = check_health(args.address, args.service, args.timeout_ms / 1000, auth, tls, args.check_auth)
    if result.healthy:
        print(result.message, flush=True)
        return 0
    print(f"{prog}: error: {result.message}", file=sys.stderr, flush=True)
    return EXIT_UNHEALTHY

