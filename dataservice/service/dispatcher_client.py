"""The dispatcher's client, shared by workers and readers.

Every call retries an unreachable dispatcher with backoff for up to
``timeout_ms`` and raises our own exceptions, never ``grpc.RpcError``.

Example::

    >>> client = DispatcherClient("localhost:5050", timeout_ms=5000)
    >>> dataset_id = client.register_dataset(blob, num_splits=8)
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from dataservice import errors
from dataservice.proto import dispatcher_pb2, dispatcher_pb2_grpc
from dataservice.service.addresses import channel_address
from dataservice.service.rpc import call_with_retry, make_channel

__all__ = ["DispatcherClient"]


class DispatcherClient:
    def __init__(self, address: str, timeout_ms: int = 60_000, should_stop: Optional[Callable[[], bool]] = None):
        self.address = channel_address(address, "dispatcher")
        self._timeout_s = timeout_ms / 1000
        self._should_stop = should_stop
        self._channel = make_channel(self.address)
        self._stub = dispatcher_pb2_grpc.DispatcherStub(self._channel)
        self._closed = False

    def close(self) -> None:
        """Closes the channel; a call in flight (say a heartbeat's long poll) raises ServiceUnavailableError."""
        self._closed = True
        self._channel.close()

    def _call(self, name: str, request, timeout_s: Optional[float] = None, per_call_s: float = 30.0):
        method = getattr(self._stub, name)
        what = f"{name} to dispatcher {self.address}"
        try:
            return call_with_retry(lambda remaining: method(request, timeout=min(remaining, per_call_s)), what,
                                   self._timeout_s if timeout_s is None else timeout_s, self._should_stop)
        except ValueError:
            if self._closed:  # grpc raises a bare ValueError for a channel closed under the call
                raise errors.ServiceUnavailableError(f"{what}: the client was closed") from None
            raise

    def register_dataset(self, dataset_def: bytes, num_splits: int) -> int:
        return self._call("RegisterDataset", dispatcher_pb2.RegisterDatasetRequest(
            dataset_def=dataset_def, num_splits=num_splits)).dataset_id

    def get_dataset_def(self, dataset_id: int) -> bytes:
        return self._call("GetDatasetDef", dispatcher_pb2.GetDatasetDefRequest(dataset_id=dataset_id)).dataset_def

    def get_or_create_job(self, dataset_id: int, processing_mode: int, job_name: str) -> int:
        return self._call("GetOrCreateJob", dispatcher_pb2.GetOrCreateJobRequest(
            dataset_id=dataset_id, processing_mode=processing_mode, job_name=job_name or "")).job_id

    def get_or_create_iteration(self, job_id: int, repetition: int) -> dispatcher_pb2.GetOrCreateIterationResponse:
        return self._call("GetOrCreateIteration", dispatcher_pb2.GetOrCreateIterationRequest(
            job_id=job_id, repetition=repetition))

    def client_heartbeat(self, client_id: int, progress: Sequence = (), stopped_tasks: Sequence[int] = ()
                         ) -> dispatcher_pb2.ClientHeartbeatResponse:
        return self._call("ClientHeartbeat", dispatcher_pb2.ClientHeartbeatRequest(
            client_id=client_id, progress=progress, stopped_tasks=stopped_tasks))

    def release_iteration_client(self, client_id: int, timeout_s: float = 2.0) -> None:
        self._call("ReleaseIterationClient", dispatcher_pb2.ReleaseIterationClientRequest(client_id=client_id),
                   timeout_s=timeout_s)

    def worker_heartbeat(self, request: dispatcher_pb2.WorkerHeartbeatRequest,
                         timeout_s: Optional[float] = None) -> dispatcher_pb2.WorkerHeartbeatResponse:
        return self._call("WorkerHeartbeat", request, timeout_s=timeout_s,
                          per_call_s=request.wait_ms / 1000 + 10.0)

    def get_split(self, iteration_id: int, task_id: int, request_id: int = 0) -> dispatcher_pb2.GetSplitResponse:
        return self._call("GetSplit", dispatcher_pb2.GetSplitRequest(iteration_id=iteration_id, task_id=task_id,
                                                                     request_id=request_id))

    def get_status(self, timeout_s: Optional[float] = None) -> dispatcher_pb2.GetStatusResponse:
        return self._call("GetStatus", dispatcher_pb2.GetStatusRequest(), timeout_s=timeout_s)
