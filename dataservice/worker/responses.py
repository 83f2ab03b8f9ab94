"""What a worker answers to a request for elements, whatever carries it.

``prepare`` takes elements from a task and encodes them into a frame plus a
header (an ``ElementChunk`` without data: element count, where each element
comes from, end of sequence, or a user error). The gRPC adapter and the TCP
data-transfer server both send what it returns; if sending fails, ``give_back``
returns the elements to the task so that nothing is lost with the response.

Example::

    >>> prepared = prepare(worker, worker_pb2.GetElementsRequest(task_id=7, max_elements=64))
    >>> prepared.header.num_elements, prepared.frame.nbytes
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
from typing import Optional, Protocol

from dataservice.proto import worker_pb2
from dataservice.service.remote_errors import failure_header
from dataservice.service.rpc import CHUNK_BYTES
from dataservice.service.wire import EncodedFrame, encode_elements
from dataservice.worker.task_runner import TaskRunner

__all__ = ["prepare", "Prepared", "TaskSource", "UnknownTaskError", "ReadKeyError"]

log = logging.getLogger("dataservice.worker")

#: The longest a reader is kept waiting for a task the dispatcher has announced but
#: this worker has not heard of yet.
TASK_ARRIVAL_WAIT_S = 5.0
#: The longest a request waits for a first element.
MAX_WAIT_S = 5.0


class TaskSource(Protocol):
    address: str

    def find_task(self, task_id: int, wait_s: float) -> Optional[TaskRunner]: ...


class UnknownTaskError(LookupError):
    """The worker does not run the task asked for."""


class ReadKeyError(PermissionError):
    """The request does not carry its task's read key: it does not come from a reader of the
    task's iteration. Nothing was taken from the task. The gRPC adapter answers
    PERMISSION_DENIED; the TCP data-transfer server an error header "PermissionDenied"."""


@dataclasses.dataclass
class Prepared:
    header: worker_pb2.ElementChunk
    #: The frame of elements (None for an error); see ``dataservice.service.wire``.
    frame: Optional[EncodedFrame]
    _runner: Optional[TaskRunner] = None
    _elements: Optional[list] = None
    _runs: Optional[list] = None

    @property
    def parts(self) -> list:
        """The frame's buffers, prefix first; none for an error."""
        return self.frame.parts if self.frame is not None else []

    def give_back(self) -> None:
        """The response did not reach the reader: return its elements to the task."""
        if self._runner is not None and (self._elements or self._runs):
            self._runner.untake(self._elements, self._runs)
            self._elements = self._runs = None


def prepare(worker: TaskSource, request: worker_pb2.GetElementsRequest) -> Prepared:
    """Takes and encodes up to ``request.max_elements`` elements (the first request for a task starts
    its pipeline); UnknownTaskError (also for a task deleted meanwhile), ValueError on a bad request,
    ReadKeyError (before anything is taken, and before the task starts) for a request without the
    task's read key."""
    if request.max_elements <= 0:
        raise ValueError("GetElements: max_elements must be positive")
    runner = worker.find_task(request.task_id, TASK_ARRIVAL_WAIT_S)
    if runner is None:
        raise UnknownTaskError(f"task {request.task_id} is not running on worker {worker.address}")
    expected = runner.read_key
    # An empty key: a task of an iteration created before read keys existed (replayed from an old
    # journal), whose readers have no key to send. The worker warned when it started the task.
    if expected and not hmac.compare_digest(request.read_key, expected):
        raise ReadKeyError(
            f"GetElements for task {request.task_id} on worker {worker.address}: the request does not carry the "
            f"task's read key, so it does not come from a reader of the task's iteration. Only the readers of an "
            f"iteration read its elements: those that created it or joined it (GetOrCreateIteration) — for an "
            f"anonymous job its creator alone, for a named job every reader of that job_name")
    wait_s = min(max(request.wait_ms, 0) / 1000, MAX_WAIT_S)
    elements, runs, ended, error = runner.take(request.max_elements, request.max_bytes or CHUNK_BYTES, wait_s)
    if runner.stopped and not elements and not runs:
        # Deleted by the dispatcher (or the worker is stopping) while the request waited: its buffer
        # is gone, so an empty answer must not read as the task's end.
        raise UnknownTaskError(f"task {request.task_id} was deleted from worker {worker.address}")
    if error is not None and not elements:
        return Prepared(failure_header(error, worker.address), None)
    try:
        frame = encode_elements(elements)
    except Exception as exc:  # an element with no wire form: report it like a user error
        log.warning("task %d: cannot encode an element: %s", request.task_id, exc)
        return Prepared(failure_header(exc, worker.address), None)
    header = worker_pb2.ElementChunk(
        num_elements=len(elements), end_of_sequence=ended and error is None, worker_address=worker.address,
        runs=[worker_pb2.ElementRun(stream_id=r[0], split_index=r[1], first_offset=r[2], count=r[3],
                                    split_total=r[4]) for r in runs])
    return Prepared(header, frame, runner, elements, runs)
