"""The dispatcher's thin gRPC adapter: each RPC checks its request's bounds
(``request_checks``), calls the core, and waits until what it changed is durable.

``rpc.add_service`` does the rest: it parses each request itself (bytes that are not a
valid request: INVALID_ARGUMENT, never INTERNAL), maps our exceptions to status codes,
logs refusals and bugs at most once a minute per method and kind, and times every call
into ``core.rpc_stats`` (what ``GetStatus`` reports as per-RPC latency).

Example::

    >>> server, port = create_server("[::]:0")
    >>> add_dispatcher_service(server, DispatcherCore(DispatcherConfig()))
"""

from __future__ import annotations

import logging
from typing import Callable

import grpc

from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.request_checks import check_request
from dataservice.proto import dispatcher_pb2
from dataservice.service.rpc import add_service

__all__ = ["add_dispatcher_service"]

log = logging.getLogger("dataservice.dispatcher")

_METHODS = {
    "RegisterDataset": "register_dataset",
    "GetDatasetDef": "get_dataset_def",
    "GetDatasetId": "get_dataset_id",
    "GetOrCreateJob": "get_or_create_job",
    "GetOrCreateIteration": "get_or_create_iteration",
    "ClientHeartbeat": "client_heartbeat",
    "ReleaseIterationClient": "release_iteration_client",
    "WorkerHeartbeat": "worker_heartbeat",
    "GetSplit": "get_split",
    "GetStatus": "get_status",
    "DistributedSave": "distributed_save",
    "LeaseSaveGroup": "lease_save_group",
    "ReportSaveChunk": "report_save_chunk",
    "GetSaveStatus": "get_save_status",
}

_SERVICE = dispatcher_pb2.DESCRIPTOR.services_by_name["Dispatcher"]


def _adapt(core: DispatcherCore, rpc: str, method: str) -> Callable:
    handler = getattr(core, method)

    def call(request):
        check_request(rpc, request, core.config)
        response = handler(request)
        core.wait_durable()
        return response

    call.__name__ = rpc
    return call


def add_dispatcher_service(server: grpc.Server, core: DispatcherCore) -> None:
    add_service(server, _SERVICE, {rpc: _adapt(core, rpc, method) for rpc, method in _METHODS.items()}, log,
                record=core.rpc_stats.record)
