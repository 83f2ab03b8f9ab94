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
from dataservice.service.auto_compression import ReaderReport
from dataservice.service.frame_compression import compress_frame, requested_codec
from dataservice.service.remote_errors import failure_header
from dataservice.service.rpc import CHUNK_BYTES
from dataservice.service.wire import EncodedFrame, encode_elements
from dataservice.worker import round_robin
from dataservice.worker.task_runner import TaskRunner

__all__ = ["prepare", "find_runner", "take", "Prepared", "TaskSource", "UnknownTaskError", "ReadKeyError"]

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


def find_runner(worker: TaskSource, request: worker_pb2.GetElementsRequest) -> TaskRunner:
    """The task a request reads, once its read key is checked: UnknownTaskError, ValueError on a bad
    request, ReadKeyError (before anything is taken, and before the task starts) for a request without
    the task's read key. Every way of reading a task (``prepare``, an in-process reader) starts here."""
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
    return runner


def take(runner: TaskRunner, request: worker_pb2.GetElementsRequest
         ) -> tuple[list, list, bool, Optional[BaseException]]:
    """What the request takes from its task, as ``TaskRunner.take`` returns it: the one place where the
    way a task serves its readers is chosen (first come first served by default). UnknownTaskError for
    a task deleted while the request waited."""
    wait_s = min(max(request.wait_ms, 0) / 1000, MAX_WAIT_S)
    if runner.rounds is not None:
        # Coordinated reads: the consumer's element of its round (round_robin.RoundOver: see prepare).
        elements, runs, ended, error = runner.rounds.take(request, wait_s)
    elif runner.trainer_cache is not None:
        # Cross-trainer cache: the request reads for its trainer, from the task's window (trainer_cache).
        elements, runs, ended, error = runner.trainer_cache.take(
            request.trainer_id, request.client_id, request.max_elements, request.max_bytes or CHUNK_BYTES, wait_s)
    else:
        elements, runs, ended, error = runner.take(request.max_elements, request.max_bytes or CHUNK_BYTES, wait_s)
    if runner.stopped and not elements and not runs:
        # Deleted by the dispatcher (or the worker is stopping) while the request waited: its buffer
        # is gone, so an empty answer must not read as the task's end.
        raise UnknownTaskError(f"task {request.task_id} was deleted from worker {runner.worker_address}")
    return elements, runs, ended, error


def prepare(worker: TaskSource, request: worker_pb2.GetElementsRequest) -> Prepared:
    """Takes and encodes up to ``request.max_elements`` elements (the first request for a task starts
    its pipeline), compressed as the request asks (``frame_compression``); the errors of ``find_runner``
    and ``take``, and ValueError for a compression this worker cannot do (before anything is taken)."""
    # Memory reads copy the arrays from our memory: never compressed.
    codec = requested_codec(request.compression) if request.compression and not request.read_memory else ""
    runner = find_runner(worker, request)
    try:
        elements, runs, ended, error = take(runner, request)
    except round_robin.RoundOver as over:  # coordinated reads: the reader asks for a later round
        return Prepared(worker_pb2.ElementChunk(skip_to_round=over.skip_to, worker_address=worker.address),
                        encode_elements([]))
    if error is not None and not elements:
        return Prepared(failure_header(error, worker.address), None)
    try:
        frame = encode_elements(elements)
    except Exception as exc:  # an element with no wire form: report it like a user error
        exc = runner.unencodable(exc)
        log.warning("task %d: cannot encode an element: %s", request.task_id, exc)
        return Prepared(failure_header(exc, worker.address), None)
    header = worker_pb2.ElementChunk(
        num_elements=len(elements), end_of_sequence=ended and error is None, worker_address=worker.address,
        runs=[worker_pb2.ElementRun(stream_id=r[0], split_index=r[1], first_offset=r[2], count=r[3],
                                    split_total=r[4]) for r in runs])
    for i, offset, state in runner.marks_for(runs):  # where a restored read's worker may seek to
        header.runs[i].mark_offset = offset
        header.runs[i].mark = state
    if codec:
        try:
            # Under "AUTO", compressed when it pays on the reader's connection (auto_compression).
            frame = compress_frame(header, frame, codec, ReaderReport.of(request) if codec == "AUTO" else None)
        except Exception as exc:  # the codec's library failed: the elements still go out, as they are
            log.warning("task %d: cannot compress a frame with %s (%s): sending it uncompressed", request.task_id,
                        codec, exc)
            del header.compressed_lengths[:], header.uncompressed_lengths[:]
            header.compression = ""
    return Prepared(header, frame, _returns_to(runner, request), elements, runs)


def _returns_to(runner: TaskRunner, request: worker_pb2.GetElementsRequest):
    """What an answer that does not reach its reader is given back to: the task; under the cross-trainer
    cache the request's reader of its trainer (which reads those elements again, not the other readers);
    for coordinated reads the consumer's slot in its round."""
    if runner.rounds is not None:
        return runner.rounds.returns_to(request)
    if runner.trainer_cache is not None:
        return runner.trainer_cache.view(request.trainer_id, request.client_id)
    return runner
