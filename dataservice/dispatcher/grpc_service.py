"""The dispatcher's thin gRPC adapter: each RPC checks its request's bounds
(``request_checks``), calls the core (on the event loop when the work is short, ``_ON_LOOP``; on the
server's thread pool otherwise), and waits until what it changed is durable. The two long polls, a
worker's heartbeat and a task's GetSplit, wait *here*, on the asyncio loop (``long_polls.Wakeups``),
not in the core: a waiting poll holds no thread, so every worker of a fleet can wait at once.

``aio_rpc.add_aio_service`` does the rest: it parses each request itself (bytes that are not a
valid request: INVALID_ARGUMENT, never INTERNAL), maps our exceptions to status codes, logs
refusals and bugs at most once a minute per method and kind, and times every call into
``core.rpc_stats`` (what ``GetStatus`` reports as per-RPC latency).

Example::

    >>> server, port = create_aio_server("[::]:0")
    >>> add_dispatcher_service(server, DispatcherCore(DispatcherConfig()))
"""

from __future__ import annotations

import logging
import random
import time
from typing import Callable

from dataservice.dispatcher.core import SMALL_PROGRESS_RANGES, SPLIT_WAIT_S, DispatcherCore, heartbeat_has_news, \
    heartbeat_wait_s
from dataservice.dispatcher.durable_waits import DurableWaits
from dataservice.dispatcher.fleet_intervals import PollsAfterNews
from dataservice.dispatcher.request_checks import check_request
from dataservice.proto import dispatcher_pb2
from dataservice.service.aio_rpc import AioServer, add_aio_service

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


#: Calls whose work runs on the event loop itself: short work under the core's lock, which any
#: other call would wait for anyway. Handing them to a pool thread would cost a thread switch and a
#: wakeup of the loop each. The others (status pages, saves' file system work, registering a
#: pipeline) and a heartbeat carrying many ranges run on the pool, and wait for their fsync there; a call
#: on the loop waits for its fsync on the loop (``durable_waits``).
_ON_LOOP = frozenset({"GetDatasetId", "GetOrCreateJob", "GetOrCreateIteration", "ClientHeartbeat",
                      "ReleaseIterationClient", "WorkerHeartbeat", "GetSplit"})


def _call(core: DispatcherCore, rpc: str, handler: Callable, request, *args):
    """One pass of an RPC's work, on a pool thread: bounds, the core, durability."""
    check_request(rpc, request, core.config)
    response = handler(request, *args)
    core.wait_durable()
    return response


def _on_loop(rpc: str, request) -> bool:
    if rpc != "ClientHeartbeat":
        return rpc in _ON_LOOP
    return sum(len(p.ranges) for p in request.progress) <= 2 * SMALL_PROGRESS_RANGES


async def _run(server: AioServer, core: DispatcherCore, durable: DurableWaits, rpc: str, handler: Callable,
               request, *args, checked: bool = False):
    """One pass of an RPC's work: on the loop if it is short (``_ON_LOOP``), else on the pool.
    ``checked``: the request's bounds were checked already (a long poll's later passes)."""
    if not _on_loop(rpc, request):
        return await server.run(_call, core, rpc, handler, request, *args)
    if not checked:
        check_request(rpc, request, core.config)
    response = handler(request, *args)
    wait = core.durability()  # fault-tolerant mode: what this call committed must be fsynced first
    if wait is not None:
        await durable.wait(wait)  # on the loop: one wake-up per fsync, not a pool thread per call
    return response


def _adapt(server: AioServer, core: DispatcherCore, durable: DurableWaits, rpc: str, method: str) -> Callable:
    handler = getattr(core, method)

    async def call(request):
        return await _run(server, core, durable, rpc, handler, request)

    call.__name__ = rpc
    return call


def _worker_heartbeat(server: AioServer, core: DispatcherCore, durable: DurableWaits) -> Callable:
    after_news = PollsAfterNews()

    async def call(request: dispatcher_pb2.WorkerHeartbeatRequest):
        check_request("WorkerHeartbeat", request, core.config)  # the request as sent: its wait_ms too
        # What it asked, stretched for a large fleet and spread so that polls answered together (a new job)
        # do not all end together again; well before the worker could look lost (worker_timeout_ms).
        now = time.monotonic()
        workers = len(core.state.workers)
        wait_s = heartbeat_wait_s(request, core.config, workers, random.random(),
                                  after_news.follows_news(request.worker_address, now))
        deadline = now + wait_s
        key = ("worker", request.worker_address)
        since = core.wakeups.generation(key)  # before the pass: a change during it wakes us at once
        response = await _run(server, core, durable, "WorkerHeartbeat", core.worker_heartbeat, request, False,
                              checked=True)
        while True:
            remaining = deadline - time.monotonic()
            news = heartbeat_has_news(request, response)
            if remaining <= 0 or news:
                response.poll_wait_ms = int(wait_s * 1000)
                after_news.answered(request.worker_address, news, time.monotonic(), workers)
                return response
            await core.wakeups.wait(key, since, remaining)
            since = core.wakeups.generation(key)
            response = await _run(server, core, durable, "WorkerHeartbeat", core.worker_heartbeat_again, request,
                                  checked=True)

    return call


def _get_split(server: AioServer, core: DispatcherCore, durable: DurableWaits) -> Callable:
    async def call(request: dispatcher_pb2.GetSplitRequest):
        deadline = time.monotonic() + SPLIT_WAIT_S
        key = ("iteration", request.iteration_id)
        passes = 0
        while True:
            since = core.wakeups.generation(key)
            response = await _run(server, core, durable, "GetSplit", core.get_split, request, False, checked=passes > 0)
            passes += 1
            remaining = deadline - time.monotonic()
            if not response.wait or remaining <= 0:
                return response
            # No split free now, but leased ones may come back: wait for a change to the iteration.
            await core.wakeups.wait(key, since, remaining)

    return call


def add_dispatcher_service(server: AioServer, core: DispatcherCore) -> None:
    durable = DurableWaits(server.run)
    implementations = {rpc: _adapt(server, core, durable, rpc, method) for rpc, method in _METHODS.items()}
    implementations["WorkerHeartbeat"] = _worker_heartbeat(server, core, durable)
    implementations["GetSplit"] = _get_split(server, core, durable)
    add_aio_service(server, _SERVICE, implementations, log, record=core.rpc_stats.record)
