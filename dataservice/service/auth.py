"""The cluster token: only the cluster's own members talk to the dispatcher and the workers.

Dispatcher, workers, clients and ``dataservice status`` share one secret. Each
resolves it the same way (:func:`resolve_token`): an explicit ``auth_token``
argument, else ``DATASERVICE_AUTH_TOKEN``, else the file named by
``DATASERVICE_AUTH_TOKEN_FILE`` — so a training script's ``distribute(...)``
needs no new argument.

The token itself never crosses the wire:

- every gRPC call carries a credential derived from it (an HMAC of a fixed
  label), which the servers' :class:`AuthInterceptor` checks in constant time
  before the call's handler runs — a call without it is refused with
  UNAUTHENTICATED (the health service stays open, for probes). Without TLS the
  credential can be read on the network path and replayed, like any bearer
  secret: use TLS on networks you do not trust;
- a server also proves it holds the token, answering a fresh nonce the client
  sends (``x-dataservice-nonce``) with an HMAC over it in its initial metadata
  (``x-dataservice-proof``): a client checks it before it unpickles anything the
  server sent (a pipeline from the dispatcher, elements from a worker);
- the TCP data-transfer port runs a mutual challenge–response handshake
  (:func:`server_proof`, :func:`client_proof`) before it reads a single request.

Example::

    >>> auth = ClusterAuth.resolve("s3cret-token-of-the-cluster")
    >>> auth.check_credential(auth.credential)
    True
    >>> channel = make_channel("localhost:5050", auth)      # dataservice.service.rpc
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from typing import Callable, Optional, Sequence

import grpc

from dataservice import errors

__all__ = ["ClusterAuth", "resolve_token", "read_token_file", "AuthInterceptor", "AioAuthInterceptor", "TOKEN_ENV", "TOKEN_FILE_ENV",
           "CREDENTIAL_KEY", "NONCE_KEY", "PROOF_KEY", "NONCE_BYTES", "MIN_TOKEN_CHARS", "credential_metadata",
           "check_proof", "new_nonce", "task_read_key", "server_proof", "client_proof", "warn_if_exposed"]

TOKEN_ENV = "DATASERVICE_AUTH_TOKEN"
TOKEN_FILE_ENV = "DATASERVICE_AUTH_TOKEN_FILE"
#: gRPC metadata keys (lower case, as gRPC requires).
CREDENTIAL_KEY = "x-dataservice-credential"
NONCE_KEY = "x-dataservice-nonce"
PROOF_KEY = "x-dataservice-proof"
NONCE_BYTES = 32
#: A token shorter than this is a password someone could guess: refuse it.
MIN_TOKEN_CHARS = 16

_HEALTH_PREFIX = "/grpc.health.v1.Health/"

log = logging.getLogger("dataservice")


def read_token_file(path: str) -> str:
    """The token in ``path`` (surrounding whitespace dropped); ValueError naming the file if it is unusable."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the auth token file {path}: {exc.strerror or exc}") from exc
    if not token:
        raise ValueError(f"the auth token file {path} is empty")
    return token


def resolve_token(explicit: Optional[str] = None) -> Optional[str]:
    """The cluster token in force: ``explicit``, else ``$DATASERVICE_AUTH_TOKEN``, else the contents of
    ``$DATASERVICE_AUTH_TOKEN_FILE``; None if none is set. ValueError for a token too short to be secret.

    Example::

        >>> resolve_token(None)            # nothing set: no authentication
        >>> os.environ["DATASERVICE_AUTH_TOKEN_FILE"] = "/run/secrets/dataservice_token"
        >>> resolve_token(None)            # read from the file
        'c2VjcmV0...'
    """
    if explicit is not None:
        if not isinstance(explicit, str):
            raise TypeError(f"auth_token must be a str, got {type(explicit).__name__}")
        token, source = explicit.strip(), "auth_token"
    elif os.environ.get(TOKEN_ENV):
        token, source = os.environ[TOKEN_ENV].strip(), TOKEN_ENV
    elif os.environ.get(TOKEN_FILE_ENV):
        token, source = read_token_file(os.environ[TOKEN_FILE_ENV]), os.environ[TOKEN_FILE_ENV]
    else:
        return None
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the auth token from {source} has {len(token)} characters; use at least "
                         f"{MIN_TOKEN_CHARS} random ones, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    return token


def warn_if_exposed(config, what: str, port: int) -> None:
    """Said on every start of a server that listens beyond loopback without a token (``insecure``)."""
    from dataservice.service.config import is_loopback  # config imports this module

    if config.auth_token is None and not is_loopback(config.host):
        log.warning("the %s on port %d listens on %r WITHOUT an auth token (insecure): anyone who can reach it "
                    "can run code on the workers. Set DATASERVICE_AUTH_TOKEN_FILE (--auth-token-file) on every "
                    "member of the cluster", what, port, config.host or "every interface")


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"\0".join(parts), hashlib.sha256).digest()


class ClusterAuth:
    """What a process derives from the cluster token; see the module docstring."""

    def __init__(self, token: str):
        self._key = hashlib.sha256(b"dataservice cluster token\0" + token.encode()).digest()
        #: What every gRPC call carries (hex): derived from the token, so the token itself stays home.
        self.credential = _mac(self._key, b"grpc credential v1").hex()

    @classmethod
    def resolve(cls, explicit: Optional[str] = None) -> Optional["ClusterAuth"]:
        """From :func:`resolve_token`; None when no token is configured."""
        token = resolve_token(explicit)
        return None if token is None else cls(token)

    @classmethod
    def of(cls, config) -> Optional["ClusterAuth"]:
        """A server config's auth (its ``auth_token`` is already resolved); None without a token."""
        return None if config.auth_token is None else cls(config.auth_token)

    def check_credential(self, value: Optional[str]) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.credential.encode())

    def proof(self, role: bytes, *nonces: bytes) -> bytes:
        """HMAC over fresh nonces: proves holding the token without sending it, bound to the role
        ("server"/"client") so one side's answer cannot be replayed as the other's."""
        return _mac(self._key, role, *nonces)


def server_proof(auth: ClusterAuth, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return auth.proof(b"data-transfer server", client_nonce, server_nonce)


def client_proof(auth: ClusterAuth, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return auth.proof(b"data-transfer client", client_nonce, server_nonce)


def task_read_key(iteration_key: bytes, task_id: int) -> bytes:
    """The key a ``GetElements`` for task ``task_id`` must carry: an HMAC of the task id under its
    iteration's read key. The dispatcher gives a worker the keys of its own tasks only, and
    readers (who hold the iteration's key) derive them: a worker learns nothing that opens
    another worker's tasks. An empty iteration key (an iteration from a journal written before
    read keys existed) gives an empty key, which workers do not check."""
    if not iteration_key:
        return b""
    return hmac.new(iteration_key, b"dataservice task read key %d" % task_id, hashlib.sha256).digest()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def credential_metadata(auth: Optional[ClusterAuth], nonce: Optional[bytes] = None) -> list[tuple[str, str]]:
    """The metadata a call carries: the credential, and a nonce for the server to prove itself with."""
    if auth is None:
        return []
    metadata = [(CREDENTIAL_KEY, auth.credential)]
    if nonce is not None:
        metadata.append((NONCE_KEY, nonce.hex()))
    return metadata


def check_proof(auth: Optional[ClusterAuth], nonce: bytes, metadata: Optional[Sequence], what: str) -> None:
    """Raises PermissionDeniedError unless ``metadata`` (a server's initial metadata) proves that the
    server holds the token: checked before anything it sent is unpickled."""
    if auth is None:
        return
    proof = dict(metadata or ()).get(PROOF_KEY, "")
    expected = auth.proof(b"grpc server", nonce).hex()
    if not hmac.compare_digest(proof.encode(), expected.encode()):
        raise errors.PermissionDeniedError(
            f"{what}: the server did not prove it holds the cluster token ({'a wrong proof' if proof else 'no proof'}):"
            f" it is not a member of this cluster, or runs without a token; nothing it sent was loaded")


class AuthInterceptor(grpc.ServerInterceptor):
    """Refuses every call but the health service's unless it carries the cluster credential, and
    answers a client's nonce with a proof of holding the token."""

    def __init__(self, auth: ClusterAuth, what: str):
        self._auth = auth
        self._what = what

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails):
        verdict = self.check(details)
        if verdict is None:
            return continuation(details)
        refusal, proof = verdict
        if refusal is not None:
            return _refuse(refusal)
        handler = continuation(details)
        return _with_initial_metadata(handler, proof) if handler is not None else None

    def check(self, details: grpc.HandlerCallDetails) -> Optional[tuple[Optional[str], tuple]]:
        """None: let the call through as it is; else (why it is refused, or None; the proof to send
        first). Shared by this interceptor and the asyncio server's (``AioAuthInterceptor``)."""
        if details.method.startswith(_HEALTH_PREFIX):
            return None
        metadata = dict(details.invocation_metadata or ())
        credential = metadata.get(CREDENTIAL_KEY)
        if not self._auth.check_credential(credential):
            why = ("the call carries no auth token: set DATASERVICE_AUTH_TOKEN or DATASERVICE_AUTH_TOKEN_FILE "
                   "(or pass auth_token=, --auth-token-file) to the cluster's token" if credential is None
                   else "the call carries a different auth token than this cluster's")
            return f"{self._what} refused {details.method.rsplit('/', 1)[-1]}: {why}", ()
        nonce = metadata.get(NONCE_KEY)
        if not nonce:
            return None
        try:
            proof = self._auth.proof(b"grpc server", bytes.fromhex(nonce)).hex()
        except ValueError:
            return f"{self._what}: a malformed {NONCE_KEY}", ()
        return None, ((PROOF_KEY, proof),)


class AioAuthInterceptor(grpc.aio.ServerInterceptor):
    """``AuthInterceptor`` for the asyncio gRPC server (the dispatcher's): the same checks and proof."""

    def __init__(self, auth: ClusterAuth, what: str):
        self._sync = AuthInterceptor(auth, what)

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails):
        verdict = self._sync.check(details)
        if verdict is None:
            return await continuation(details)
        refusal, proof = verdict
        if refusal is not None:
            async def deny(request, context):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)

            return grpc.unary_unary_rpc_method_handler(deny)
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler  # the dispatcher serves unary methods only
        inner = handler.unary_unary

        async def unary_unary(request, context):
            await context.send_initial_metadata(proof)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, handler.request_deserializer,
                                                   handler.response_serializer)


def _refuse(message: str) -> grpc.RpcMethodHandler:
    # Nothing of the request is looked at: its bytes are never even parsed.
    def deny(request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(deny)


def _with_initial_metadata(handler: grpc.RpcMethodHandler, metadata: tuple) -> grpc.RpcMethodHandler:
    """The handler, sending ``metadata`` first (the proof a client checks before it loads what follows)."""
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        def unary_unary(request, context):
            context.send_initial_metadata(metadata)
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, handler.request_deserializer,
                                                   handler.response_serializer)
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        def unary_stream(request, context):
            context.send_initial_metadata(metadata)
            yield from inner_stream(request, context)

        return grpc.unary_stream_rpc_method_handler(unary_stream, handler.request_deserializer,
                                                    handler.response_serializer)
    return handler  # no streaming-request methods here
