"""The dispatcher's client, shared by workers and readers.

Every call retries an unreachable dispatcher with backoff for up to
``timeout_ms`` and raises our own exceptions, never ``grpc.RpcError``.

An address that answers, but not as a dispatcher, raises
``errors.WrongEndpointError`` at once instead, saying what it is:

- a gRPC server that lacks our methods (UNIMPLEMENTED): its health service says
  whether it is a dataservice worker (``create_server`` registers the service names);
- UNAVAILABLE from something that accepts connections: gRPC says the same of a
  dispatcher not up yet, so ``endpoint_probe`` connects once and looks at what comes
  back (a worker's data-transfer port, HTTP/1, TLS, ...). Nobody listening, or a gRPC
  server, keeps the retries: clients may start before the cluster. Something that accepts
  connections and closes them at once, for ``CLOSED_VERDICT_S``, is given up on with
  ``ServiceUnavailableError`` saying so: a dispatcher does that only for a moment while it stops.

Nothing waits in silence: once calls have failed to reach the dispatcher for
``UNREACHABLE_NOTICE_AFTER_S``, the client says so (the address, the cause, and
``dataservice status --dispatcher ADDRESS`` to check it), then again every
``UNREACHABLE_NOTICE_INTERVAL_S`` while they keep failing: a warning on the
``dataservice.client`` logger, or whatever ``on_unreachable`` does (a worker logs its own
wording). The ``ServiceUnavailableError`` at ``timeout_ms`` says how long it tried, and why.

TLS (``tls``: a client's ``dataservice.service.tls.TlsSettings``): a failed handshake is not
retried either. gRPC reports it as UNAVAILABLE, with the TLS error in its details (a server
certificate this client's CA did not sign, a plaintext server); a server that refuses our
certificate (or its lack, under mutual TLS) just closes, and one TLS connection
(``tls.probe_tls``) reads its alert. Both raise ``PermissionDeniedError`` (a certificate
refused either way: a configuration problem, like a wrong token) or ``WrongEndpointError``
(plaintext on one side, TLS on the other), saying how to fix it.

Example::

    >>> client = DispatcherClient("localhost:5050", timeout_ms=5000)
    >>> dataset_id = client.register_dataset(blob, num_splits=8)
    >>> DispatcherClient("localhost:5051").get_status()       # a worker's port
    WrongEndpointError: localhost:5051 is a dataservice worker, not the dispatcher: pass the dispatcher's ...
    >>> DispatcherClient("localhost:5059", timeout_ms=5000).get_status()   # nothing listens there
    WARNING dataservice.client: cannot reach the dispatcher at localhost:5059 for 1.1 s: connection refused ...
    ServiceUnavailableError: GetStatus to dispatcher localhost:5059: unreachable, tried for 5.0 s: connection ...
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Callable, Optional, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dataservice import errors
from dataservice.proto import dispatcher_pb2, dispatcher_pb2_grpc, state_pb2, worker_pb2
from dataservice.service.addresses import channel_address, parse_address
from dataservice.service.auth import NONCE_KEY, ClusterAuth, check_proof, new_nonce
from dataservice.service.endpoint_probe import PROBE_TIMEOUT_S, EndpointKind, Probe, probe_endpoint
from dataservice.service.rpc import RETRYABLE_CODES, call_with_retry, make_channel, transport_cause
from dataservice.service.tls import FIX_CA, TlsSettings, describe_tls_failure, grpc_handshake_error, probe_tls
from dataservice.service.config import MAX_DATASET_DEF_LIMIT_BYTES

__all__ = ["DispatcherClient", "KnownTasks", "DISPATCHER_SERVICE", "WORKER_SERVICE", "UNREACHABLE_NOTICE_AFTER_S",
           "UNREACHABLE_NOTICE_INTERVAL_S", "CLOSED_VERDICT_S", "status_hint"]

log = logging.getLogger("dataservice.client")

#: The names our servers report SERVING in their health service (``rpc.create_server``).
DISPATCHER_SERVICE = dispatcher_pb2.DESCRIPTOR.services_by_name["Dispatcher"].full_name
WORKER_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name

_HINT = "pass the dispatcher's address (the --port of `dataservice dispatcher`)"
#: How long a health check may take: the server just answered, so it is up.
_HEALTH_TIMEOUT_S = 2.0
#: The least time between two probes of an address where nobody listened: a dispatcher not
#: up yet may be refused for a minute, and each probe costs a connection (and a DNS lookup).
_REPROBE_INTERVAL_S = 1.0
#: How long calls fail to reach the dispatcher before the client says so: a dispatcher that
#: restarts, or starts just after its clients, is back within this; a wrong address never is.
UNREACHABLE_NOTICE_AFTER_S = 1.0
#: How often it is said again while the calls keep failing (a worker retries without end).
UNREACHABLE_NOTICE_INTERVAL_S = 30.0
#: How long an address may accept connections and close them at once before the client gives
#: up on it: a dispatcher closes them only while it stops, for well under this.
CLOSED_VERDICT_S = 5.0


def status_hint(address: str) -> str:
    """The command that checks a dispatcher address, for messages that suggest it.

    Example::

        >>> status_hint("localhost:5050")
        'dataservice status --dispatcher localhost:5050'
    """
    return f"dataservice status --dispatcher {address}"


class DispatcherClient:
    """The dispatcher's RPCs, each retried up to ``timeout_ms`` (see the module docstring).

    ``on_unreachable(cause, seconds)`` is told that calls have failed to reach the dispatcher for
    ``seconds`` and why ("connection refused (nothing listens on that port)"); it is called once
    they have for ``UNREACHABLE_NOTICE_AFTER_S``, then at most every ``UNREACHABLE_NOTICE_INTERVAL_S``
    until a call succeeds. Without it, the client logs a warning on ``dataservice.client``. Calls
    given a ``timeout_s`` of their own do not count: they are best-effort, or their caller says
    itself what failed.
    """

    def __init__(self, address: str, timeout_ms: int = 60_000, should_stop: Optional[Callable[[], bool]] = None,
                 auth: Optional[ClusterAuth] = None, tls: Optional[TlsSettings] = None,
                 on_unreachable: Optional[Callable[[str, float], None]] = None):
        self.address = channel_address(address, "dispatcher")
        self._timeout_ms = timeout_ms
        self._timeout_s = timeout_ms / 1000
        self._should_stop = should_stop
        self._auth = auth
        self._tls = tls
        self._channel = make_channel(self.address, auth, tls)
        self._stub = dispatcher_pb2_grpc.DispatcherStub(self._channel)
        self._closed = False
        self._probe_lock = threading.Lock()
        #: Set once the address answered as a gRPC server: UNAVAILABLE from it is then transient.
        self._speaks_grpc = False
        self._last_probe = -float("inf")
        self._last_tls_probe = -float("inf")
        #: Said in the ServiceUnavailableError after the retries, when the address accepted
        #: connections but never answered (not proof enough to stop retrying early).
        self._silent_note = ""
        #: Since when probes found the address accepting connections and closing them at once (None: not).
        self._closing_since: Optional[float] = None
        #: Why the last probe could not connect ("" if it could).
        self._probed_reason = ""
        self._on_unreachable = on_unreachable or self._warn_unreachable
        self._notice_lock = threading.Lock()
        #: Since when calls have failed to reach the dispatcher (None: the last one succeeded), and
        #: when that was last said (None: not yet).
        self._failing_since: Optional[float] = None
        self._noticed_at: Optional[float] = None

    @classmethod
    def from_environment(cls, address: str, timeout_ms: int = 60_000) -> "DispatcherClient":
        """A client with the cluster token and TLS settings of the environment, as ``distribute`` takes them
        (``DATASERVICE_AUTH_TOKEN[_FILE]``, ``DATASERVICE_TLS_CA``, ...): for tools beside a training script."""
        return cls(address, timeout_ms=timeout_ms, auth=ClusterAuth.resolve(None), tls=TlsSettings.resolve())

    def _stopping(self) -> bool:
        """Whether calls should give up: this client was closed, or its owner stops."""
        return self._closed or (self._should_stop is not None and self._should_stop())

    def close(self) -> None:
        """Closes the channel; a call in flight (say a heartbeat's long poll) raises ServiceUnavailableError.
        Idempotent: a second close (say, by a generator finalized at interpreter exit, when grpc's
        modules are already torn down) does nothing."""
        if self._closed:
            return
        self._closed = True
        self._channel.close()

    def _call(self, name: str, request, timeout_s: Optional[float] = None, per_call_s: float = 30.0,
              proven: bool = False):
        method = getattr(self._stub, name)
        what = f"{name} to dispatcher {self.address}"

        def call(remaining: float):
            if not (proven and self._auth is not None):
                return method(request, timeout=min(remaining, per_call_s))
            nonce = new_nonce()
            response, rpc = method.with_call(request, timeout=min(remaining, per_call_s),
                                             metadata=((NONCE_KEY, nonce.hex()),))
            check_proof(self._auth, nonce, rpc.initial_metadata(), what)
            return response

        # A call given its own timeout is quiet: a best-effort one (release_iteration_client), or a command's
        # that prints its own error (`dataservice status`); only the client's timeout_ms is waited on unawares.
        noticed = timeout_s is None
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        try:
            # CANCELLED while this client is open came from the dispatcher, stopping with the call in flight
            # (a restart): retried as UNAVAILABLE is, so that a reader or a worker carries on.
            response = call_with_retry(call, what, timeout_s, self._stopping,
                                       diagnose=lambda exc: self._diagnose(exc, name, deadline, noticed),
                                       cancelled_is_transient=True)
        except errors.ServiceUnavailableError as exc:
            if not str(exc).startswith(what):  # a verdict of _probe's, which says it all
                raise
            note = f" ({self._silent_note})" if self._silent_note else ""
            # Chained from the GrpcFailure, not from exc: a traceback then says it once. The warning
            # suggested `dataservice status`; that command itself raises this error too, so it does not.
            raise errors.ServiceUnavailableError(
                f"{exc}{note}; gave up at timeout_ms={round(timeout_s * 1000)}") from exc.__cause__
        except ValueError:
            if self._closed:  # grpc raises a bare ValueError for a channel closed under the call
                raise errors.ServiceUnavailableError(f"{what}: the client was closed") from None
            raise
        if self._failing_since is not None:
            self._reached()
        return response

    def register_dataset(self, dataset_def: bytes, num_splits: int, dataset_name: str = "") -> int:
        """The pipeline's numeric id; ``dataset_name`` (a dataset id the user chose; "" none) is bound to it,
        or AlreadyExistsError if it names another pipeline."""
        if len(dataset_def) > MAX_DATASET_DEF_LIMIT_BYTES:
            # No dispatcher accepts it, and gRPC would refuse to send it with a message naming neither.
            raise errors.InvalidRequestError(
                f"RegisterDataset: the pipeline's definition is {len(dataset_def):,} bytes, more than any dispatcher "
                f"accepts ({MAX_DATASET_DEF_LIMIT_BYTES:,} bytes). A pipeline this large usually captures a big array "
                f"or object: read it from a file inside the pipeline instead")
        return self._call("RegisterDataset", dispatcher_pb2.RegisterDatasetRequest(
            dataset_def=dataset_def, num_splits=num_splits, dataset_name=dataset_name)).dataset_id

    def get_dataset_id(self, dataset_name: str) -> int:
        """The numeric id of the dataset registered under the user-chosen id ``dataset_name``; NotFoundError
        if there is none."""
        return self._call("GetDatasetId", dispatcher_pb2.GetDatasetIdRequest(dataset_name=dataset_name)).dataset_id

    def get_dataset_def(self, dataset_id: int) -> bytes:
        """A registered pipeline, for a worker to load: with a token, only from a dispatcher that proved it
        holds the token (what it sends is unpickled)."""
        return self._call("GetDatasetDef", dispatcher_pb2.GetDatasetDefRequest(dataset_id=dataset_id),
                          proven=True).dataset_def

    def get_or_create_job(self, dataset_id: int, processing_mode: int, job_name: str, num_consumers: int = 0,
                          cross_trainer_cache: bool = False, target_workers: str = "AUTO",
                          dataset_name: str = "", deterministic: bool = False,
                          resume: Optional[state_pb2.ResumePoint] = None, num_readers: int = 0) -> int:
        """The job's id; ``num_consumers``, ``cross_trainer_cache``, ``target_workers`` and ``deterministic`` are
        its read options (``ReadOptions.job_fields``). ``dataset_name``: the chosen id the reader named ("" the
        numeric id), which scopes ``job_name``. ``resume``: a restored read's start (a new job)."""
        return self._call("GetOrCreateJob", dispatcher_pb2.GetOrCreateJobRequest(
            dataset_id=dataset_id, processing_mode=processing_mode, job_name=job_name or "",
            num_consumers=num_consumers, cross_trainer_cache=cross_trainer_cache,
            target_workers=target_workers, dataset_name=dataset_name, deterministic=deterministic,
            resume=resume, num_readers=num_readers)).job_id

    def get_or_create_iteration(self, job_id: int, repetition: int, consumer_index: Optional[int] = None,
                                reader_index: Optional[int] = None) -> dispatcher_pb2.GetOrCreateIterationResponse:
        """``consumer_index``: coordinated reads, the consumer this reader is (None: not coordinated);
        ``reader_index``: elastic readers, the reader this is (None: not elastic)."""
        # One token per call, repeated by its retries: a retry after a lost answer is still the creator.
        return self._call("GetOrCreateIteration", dispatcher_pb2.GetOrCreateIterationRequest(
            job_id=job_id, repetition=repetition, request_token=secrets.token_bytes(16),
            consumer_index=consumer_index, reader_index=reader_index))

    def client_heartbeat(self, client_id: int, progress: Sequence = (), stopped_tasks: Sequence[int] = (),
                         read_key: bytes = b"", stats: Optional[dispatcher_pb2.ReaderStatsReport] = None,
                         current_round: int = 0, acknowledged_block_round: int = 0,
                         tasks: Optional["KnownTasks"] = None) -> dispatcher_pb2.ClientHeartbeatResponse:
        """``stats``: the reader's counters (``ReaderStats``), for the dispatcher's status and scaling signal.
        ``current_round``, ``acknowledged_block_round``: coordinated reads (dispatcher/coordinated_rounds.py).
        ``tasks``: the reader's ``KnownTasks``; the answer's task lists are complete either way."""
        response = self._call("ClientHeartbeat", dispatcher_pb2.ClientHeartbeatRequest(
            client_id=client_id, progress=progress, stopped_tasks=stopped_tasks, read_key=read_key, stats=stats,
            current_round=current_round, acknowledged_block_round=acknowledged_block_round,
            known_tasks_version=tasks.version if tasks is not None else 0))
        if tasks is not None:
            tasks.fill(response)
        return response


    def release_iteration_client(self, client_id: int, timeout_s: float = 2.0, read_key: bytes = b"") -> None:
        self._call("ReleaseIterationClient", dispatcher_pb2.ReleaseIterationClientRequest(
            client_id=client_id, read_key=read_key), timeout_s=timeout_s)

    def worker_heartbeat(self, request: dispatcher_pb2.WorkerHeartbeatRequest,
                         timeout_s: Optional[float] = None) -> dispatcher_pb2.WorkerHeartbeatResponse:
        return self._call("WorkerHeartbeat", request, timeout_s=timeout_s,
                          per_call_s=request.wait_ms / 1000 + 10.0)

    def get_split(self, iteration_id: int, task_id: int, request_id: int = 0,
                  max_splits: int = 1) -> dispatcher_pb2.GetSplitResponse:
        return self._call("GetSplit", dispatcher_pb2.GetSplitRequest(iteration_id=iteration_id, task_id=task_id,
                                                                     request_id=request_id, max_splits=max_splits))

    def get_status(self, timeout_s: Optional[float] = None) -> dispatcher_pb2.GetStatusResponse:
        return self._call("GetStatus", dispatcher_pb2.GetStatusRequest(), timeout_s=timeout_s)

    def distributed_save(self, dataset_id: int, path: str, compression: str, element_spec: bytes) -> int:
        """Starts a distributed_save; the save's id."""
        # One token per call, repeated by its retries: a retry after a lost answer gets its save back.
        return self._call("DistributedSave", dispatcher_pb2.DistributedSaveRequest(
            dataset_id=dataset_id, path=path, compression=compression, element_spec=element_spec,
            request_token=secrets.token_bytes(16))).save_id

    def lease_save_group(self, save_id: int, worker_address: str) -> dispatcher_pb2.LeaseSaveGroupResponse:
        return self._call("LeaseSaveGroup", dispatcher_pb2.LeaseSaveGroupRequest(save_id=save_id,
                                                                                  worker_address=worker_address))

    def report_save_chunk(self, request: dispatcher_pb2.ReportSaveChunkRequest
                          ) -> dispatcher_pb2.ReportSaveChunkResponse:
        return self._call("ReportSaveChunk", request)

    def get_save_status(self, path: str, timeout_s: Optional[float] = None) -> dispatcher_pb2.GetSaveStatusResponse:
        return self._call("GetSaveStatus", dispatcher_pb2.GetSaveStatusRequest(path=path), timeout_s=timeout_s)

    # --- telling a wrong endpoint from a dispatcher that is not up yet -------------------
    def _diagnose(self, exc: grpc.RpcError, method: str, deadline: float, noticed: bool = True
                  ) -> Optional[errors.ServiceError]:
        """The error to raise instead of retrying or translating ``exc``, if the address is not a dispatcher.
        A probe of the address takes no more than a third of what is left until ``deadline``. ``noticed``:
        the failure counts towards telling ``on_unreachable``."""
        code = exc.code()
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return self._identify_grpc_server(method)
        if code in RETRYABLE_CODES:
            cause = transport_cause(exc.details() or "")
            if noticed:
                # gRPC's wording of the cause varies across versions; our last probe's does not.
                self._failed(cause or self._probed_reason or " ".join((exc.details() or code.name).split()))
            if self._tls is not None:
                tls_error = self._tls_failure(exc)
                if tls_error is not None:
                    return tls_error
            if cause == "the host name does not resolve":
                return None  # nobody to probe; and a second lookup may be as slow as gRPC's was
            return self._probe(min(PROBE_TIMEOUT_S, (deadline - time.monotonic()) / 3))
        return None

    # --- saying that the dispatcher cannot be reached ------------------------------------------
    def _failed(self, cause: str) -> None:
        """Counts a call that did not reach the dispatcher; tells ``on_unreachable`` when it is due."""
        now = time.monotonic()
        with self._notice_lock:
            if self._failing_since is None:
                self._failing_since = now
            seconds = now - self._failing_since
            due = seconds >= UNREACHABLE_NOTICE_AFTER_S if self._noticed_at is None \
                else now - self._noticed_at >= UNREACHABLE_NOTICE_INTERVAL_S
            if not due:
                return
            self._noticed_at = now
        if self._silent_note:
            cause = f"{cause}; {self._silent_note}"
        self._on_unreachable(cause, seconds)

    def _reached(self) -> None:
        with self._notice_lock:
            self._failing_since = self._noticed_at = None
            self._closing_since = None

    def _warn_unreachable(self, cause: str, seconds: float) -> None:
        log.warning("cannot reach the dispatcher at %s for %.1f s: %s. Is a dispatcher running at that address? "
                    "Check with: %s. Still trying, until timeout_ms=%d", self.address, seconds, cause,
                    status_hint(self.address), self._timeout_ms)

    def _tls_failure(self, exc: grpc.RpcError) -> Optional[errors.ServiceError]:
        """The error for a TLS handshake that failed, from gRPC's details or, for a server that just
        closed the connection, from one TLS connection of our own; None if TLS is not the problem."""
        details = exc.details() or ""
        handshake_error = grpc_handshake_error(details)
        if handshake_error is not None:
            why = describe_tls_failure(Exception(handshake_error), self.address)
        elif "socket closed" in details.lower() or "connection reset" in details.lower():
            with self._probe_lock:
                if time.monotonic() - self._last_tls_probe < _REPROBE_INTERVAL_S:
                    return None
                self._last_tls_probe = time.monotonic()
                why = probe_tls(parse_address(self.address), self._tls)
            if why is None:
                return None
        else:
            return None
        kind = errors.WrongEndpointError if "does not speak TLS" in why else errors.PermissionDeniedError
        return kind(f"cannot talk to the dispatcher at {self.address}: {why}")

    def _identify_grpc_server(self, method: str) -> errors.ServiceError:
        health = health_pb2_grpc.HealthStub(self._channel)

        def serving(service: str) -> bool:
            try:
                response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=_HEALTH_TIMEOUT_S)
            except grpc.RpcError:  # NOT_FOUND for a name it does not serve; UNIMPLEMENTED without health
                return False
            return response.status == health_pb2.HealthCheckResponse.SERVING

        if serving(WORKER_SERVICE):
            return errors.WrongEndpointError(f"{self.address} is a dataservice worker, not the dispatcher: {_HINT}")
        if serving(DISPATCHER_SERVICE):
            return errors.ServiceError(
                f"the dispatcher at {self.address} does not know the call {method}: it runs another version of "
                f"dataservice than this process")
        return errors.WrongEndpointError(f"{self.address} is a gRPC server but not a dataservice dispatcher: "
                                         f"{_HINT}")

    def _probe(self, timeout_s: float = PROBE_TIMEOUT_S) -> Optional[errors.ServiceError]:
        with self._probe_lock:
            if self._speaks_grpc or time.monotonic() - self._last_probe < _REPROBE_INTERVAL_S or timeout_s < 0.05:
                return None
            probe = probe_endpoint(self.address, timeout_s)
            # A plaintext probe of a TLS server finds TLS: what this client expects.
            wrong = None if self._tls is not None and probe.kind is EndpointKind.TLS \
                else _wrong_endpoint(self.address, probe) or self._closed_verdict(probe)
            # A wrong endpoint is not remembered: the next call probes again, so an address that
            # becomes the dispatcher (its port handed over) works without a new client.
            self._last_probe = time.monotonic() if wrong is None else -float("inf")
            self._speaks_grpc = probe.kind is EndpointKind.GRPC
            self._silent_note = _SILENT_NOTES.get(probe.kind, "").format(address=self.address)
            self._probed_reason = probe.reason
            return wrong

    def _closed_verdict(self, probe: Probe) -> Optional[errors.ServiceUnavailableError]:
        """The error once the address has accepted connections and closed them at once for CLOSED_VERDICT_S."""
        if probe.kind is not EndpointKind.CLOSED:
            self._closing_since = None
            return None
        now = time.monotonic()
        if self._closing_since is None:
            self._closing_since = now
        if now - self._closing_since < CLOSED_VERDICT_S:
            return None
        return errors.ServiceUnavailableError(
            f"cannot talk to the dispatcher at {self.address}: something there accepts connections and closes "
            f"them at once without a word, and has done so for {CLOSED_VERDICT_S:g} s: not a dataservice "
            f"dispatcher, which answers in gRPC (and closes connections only for a moment while it stops). "
            f"If {self.address} is a proxy or load balancer, nothing behind it answers; else {_HINT}")


#: Said in the ServiceUnavailableError after the retries, by what the last probe found.
_SILENT_NOTES = {
    EndpointKind.SILENT: "something at {address} accepts connections but never answers as a gRPC server",
    EndpointKind.CLOSED: "something at {address} accepts connections and closes them at once without a word",
}


def _wrong_endpoint(address: str, probe: Probe) -> Optional[errors.WrongEndpointError]:
    if probe.kind is EndpointKind.DATA_TRANSFER:
        return errors.WrongEndpointError(
            f"{address} is a dataservice worker's data-transfer port, not the dispatcher: {_HINT}")
    if probe.kind is EndpointKind.TLS:
        return errors.WrongEndpointError(
            f"{address} speaks TLS, and this client speaks plaintext: if it is the cluster's dispatcher, the "
            f"cluster uses TLS: {FIX_CA}; else {_HINT}")
    if probe.kind is EndpointKind.NOT_GRPC:
        return errors.WrongEndpointError(
            f"{address} is not a dataservice dispatcher: it does not speak gRPC (it answered {probe.answer}); "
            f"{_HINT}")
    return None


class KnownTasks:
    """The task lists a reader last got from ClientHeartbeat, and their version: the dispatcher leaves
    out a list that did not change (``tasks_unchanged``) and sends only what changed when the reader is a
    little behind (``tasks_changed_only``: dispatcher/task_lists.py); ``fill`` puts the whole lists back,
    so the reader reads every answer as complete.

    Example::

        >>> known = KnownTasks()
        >>> response = dispatcher.client_heartbeat(client_id, tasks=known)   # response.tasks is complete
    """

    def __init__(self) -> None:
        self.version = 0
        self._tasks: dict = {}      # task id -> TaskDef, in the order the dispatcher listed them
        self._revoked: dict = {}    # task id -> None, in order

    def fill(self, response: dispatcher_pb2.ClientHeartbeatResponse) -> None:
        if response.tasks_unchanged:
            response.tasks.extend(self._tasks.values())
            response.revoked_tasks.extend(self._revoked)
            return
        if not response.tasks_changed_only:
            self._tasks, self._revoked = {}, {}
        for task in response.tasks:
            self._tasks[task.task_id] = task
        for task_id in response.revoked_tasks:
            self._tasks.pop(task_id, None)
            self._revoked[task_id] = None
        self.version = response.tasks_version
        if response.tasks_changed_only:
            del response.tasks[:]
            del response.revoked_tasks[:]
            response.tasks.extend(self._tasks.values())
            response.revoked_tasks.extend(self._revoked)
