"""The worker's thin gRPC adapter: ``GetElements`` streams a frame of elements in chunks
of at most ``CHUNK_BYTES``, the first carrying the header (see ``responses``).

Example::

    >>> add_worker_service(server, worker)   # worker: anything with find_task() and address
"""

from __future__ import annotations

from typing import Iterator

import grpc

from dataservice.proto import worker_pb2, worker_pb2_grpc
from dataservice.service.rpc import CHUNK_BYTES
from dataservice.service.wire import iter_chunks
from dataservice.worker.responses import ReadKeyError, TaskSource, UnknownTaskError, prepare

__all__ = ["add_worker_service"]


class _WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, worker: TaskSource):
        self._worker = worker

    def GetElements(self, request: worker_pb2.GetElementsRequest, context: grpc.ServicerContext
                    ) -> Iterator[worker_pb2.ElementChunk]:
        try:
            prepared = prepare(self._worker, request)
        except ReadKeyError as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except UnknownTaskError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        if not prepared.parts:
            yield prepared.header
            return
        try:
            first = True
            for data in iter_chunks(prepared.parts, CHUNK_BYTES):
                if first:
                    prepared.header.data = data
                    yield prepared.header
                    first = False
                else:
                    yield worker_pb2.ElementChunk(data=data)
        except GeneratorExit:
            # The reader cancelled or vanished before the whole frame went out: keep the elements.
            prepared.give_back()
            raise


def add_worker_service(server: grpc.Server, worker: TaskSource) -> None:
    worker_pb2_grpc.add_WorkerServicer_to_server(_WorkerServicer(worker), server)
