"""The reader of a coordinated job: ``distribute(..., job_name=..., consumer_index=i, num_consumers=n)``.

The n consumers of the job read in rounds. Round ``r`` comes from one task — the same for every
consumer: ``coordinated_rounds.task_of_round`` over the rotation the dispatcher sends — and this
reader gets its element of it (``consumer_index``), the next element of its input is round ``r + 1``'s.
So at each step every consumer reads from the same worker, and gets one of n consecutive elements of
that worker's stream (``dataservice.worker.round_robin``).

One fetcher per task asks for that task's rounds in order, at most ``ROUNDS_AHEAD`` rounds past the
consumer; the consumer takes rounds in order, waiting for the next. Rounds of a revoked task (its
worker was lost) that this reader had not fetched are skipped, with no element: a lost worker never
hangs the job. Those it had fetched are delivered (another consumer may have taken its element of
them already): consumers stay aligned unless the worker died after some of them fetched a round and
before others did.
A round the worker says is over for this consumer (``skip_to_round``: it restarted, say, and the others
went on) is skipped too. The dispatcher may tell the reader not to go past a round (``block_round``) while
a worker joins the rotation there; the reader reports the round it asks for next in every heartbeat.

Coordinated jobs are infinite: no exactly-once bookkeeping (progress reports) is kept. One that ends after all
(a pipeline of unknown cardinality) ends at the first round its task could not fill: the worker answers
end_of_sequence for it (``round_robin``), the same for every consumer, which gets every round before it first.
The dispatcher's ``iteration_finished`` is the end only for a reader that has read no task yet; one that has
learns the end from its workers, as its fetched rounds (and any answer on its way) may still hold elements.

Example::

    >>> reader = CoordinatedReader(dispatcher, job_id, 0, 16, timeout_ms=60_000, job_name="train",
    ...                            read_options=ReadOptions(job_name="train", consumer_index=0, num_consumers=2))
    >>> next(reader)
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

from dataservice import errors
from dataservice.client.read_options import ReadOptions
from dataservice.client.reader import _END, IterationReader, MAX_RESPONSE_BYTES, GET_ELEMENTS_WAIT_MS, \
    FIRST_BACKOFF_S
from dataservice.client.transports import TransientError
from dataservice.dispatcher.coordinated_rounds import Rotation
from dataservice.proto import dispatcher_pb2, worker_pb2
from dataservice.service.auth import ClusterAuth, task_read_key
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.service.remote_errors import remote_failure
from dataservice.service.tls import TlsSettings
from dataservice.service.wire import WireFormatError

__all__ = ["CoordinatedReader", "ROUNDS_AHEAD"]

#: Rounds a reader asks for ahead of its consumer, at most (its fetchers run in parallel, one per task).
ROUNDS_AHEAD = 8
# The end marker is IterationReader's: its _end_on, which __next__ uses, ends the read on that one. (A pipeline of
# unknown cardinality that does end ends a coordinated read.)


class CoordinatedReader(IterationReader):
    """An ``IterationReader`` for a coordinated job (see the module docstring); made by ``distribute``
    when ``num_consumers`` is set."""

    def __init__(self, dispatcher: DispatcherClient, job_id: int, repetition: int, max_outstanding_requests: int,
                 data_transfer_protocol: Optional[str] = None, timeout_ms: int = 60_000, job_name: str = "",
                 auth: Optional[ClusterAuth] = None, tls: Optional[TlsSettings] = None,
                 started_at: Optional[float] = None, read_options: Optional[ReadOptions] = None):
        if read_options is None or not read_options.coordinated:
            raise ValueError("CoordinatedReader reads a coordinated job: read_options must set consumer_index and "
                             "num_consumers")
        # Before the base starts the heartbeat thread, which runs our _heartbeat_loop.
        self._rcond = threading.Condition()
        self._rotation = Rotation()
        self._block = 0              # do not ask for this round or later (0: no block)
        self._next_round = 0         # the consumer's next round
        self._asked = -1             # the highest round asked of any worker
        self._results: dict[int, tuple[Any, int]] = {}   # round -> (element, bytes)
        self._over: dict[int, int] = {}     # task -> rounds below this are over for us there
        self._end_round: Optional[int] = None
        self._iteration_finished = False  # the dispatcher says so: no task joins any more
        self._failure: Optional[BaseException] = None
        self._ahead = max(1, min(ROUNDS_AHEAD, max_outstanding_requests))  # rounds asked ahead of the consumer
        super().__init__(dispatcher, job_id, repetition, max_outstanding_requests, data_transfer_protocol,
                         timeout_ms=timeout_ms, job_name=job_name, auth=auth, tls=tls, started_at=started_at,
                         read_options=read_options)

    # --- consumer side ---------------------------------------------------------------
    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        waited = None
        try:
            with self._rcond:
                while True:
                    item = self._next_locked()
                    if item is not None:
                        break
                    if waited is None:
                        self._waiting_since = waited = time.monotonic()
                    silent = time.monotonic() - max(waited, self._last_answer)
                    if silent > self._timeout_s:
                        item = errors.ServiceUnavailableError(self._no_answer_message())
                        break
                    self._rcond.wait(min(0.5, self._timeout_s - silent + 0.01))
        finally:
            if waited is not None:
                self._waiting_since = None
                self._stall_s += time.monotonic() - waited
        self._end_on(item)
        element, nbytes = item
        self._bytes_taken += nbytes
        self._credits.take_one()  # stats().elements
        return element

    def _next_locked(self) -> Any:
        """The consumer's next element, ``_END``, an error, or None: wait (under _rcond)."""
        while True:
            if self._failure is not None:
                return self._failure
            r = self._next_round
            if self._end_round is not None and r >= self._end_round:
                return _END
            if self._block and r >= self._block:
                return None  # a worker joins the rotation here: wait for the dispatcher
            task = self._rotation.task_of(r)
            if task is None:
                return None
            # Fetched: delivered, even from a revoked task (another consumer may have taken its element).
            if r in self._results:
                self._next_round = r + 1
                self._rcond.notify_all()  # the fetchers' window moves on
                return self._results.pop(r)
            if task in self._revoked or r < self._over.get(task, 0):
                if not any(t not in self._revoked for t in self._rotation.task_ids):
                    if self._iteration_finished:
                        return _END  # no worker joins a finished iteration
                    return None  # every task lost: wait for a worker to join rather than spin
                self._next_round = r + 1  # not fetched: no element this round (nor for others who did not)
                self._rcond.notify_all()
                continue
            return None

    # --- the dispatcher side ----------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        interval = 0.02  # poll fast until the first tasks show up
        while not self._stop.is_set():
            with self._rcond:
                current_round, acknowledged = self._asked + 1, self._block
            with self._lock:
                stopped = sorted(self._revoked)
            try:
                response = self._dispatcher.client_heartbeat(
                    self.client_id, (), stopped, self._read_key, stats=self._stats_report(),
                    current_round=current_round, acknowledged_block_round=acknowledged, tasks=self._known_tasks)
            except errors.DataServiceError as exc:
                self._fail(exc)
                return
            with self._lock:
                reading = bool(self._fetchers)
            if response.iteration_finished and not reading:
                # Finished before this reader read any task: whoever held this consumer_index before took
                # its elements (a task finishes only once its rounds are drained). End of input at once.
                with self._rcond:
                    self._end_round = self._next_round if self._end_round is None \
                        else min(self._end_round, self._next_round)
                    self._rcond.notify_all()
                return
            # Finished while we read: not the end here. Our elements may still be in our fetched rounds, or
            # in an answer on its way (a task counts as finished once its rounds are taken, not received):
            # the fetchers learn the end from the workers, which keep the tasks while we are a client (so we
            # keep heartbeating). A finished iteration gets no new task: no block, and a round of a lost
            # worker's task is skipped (_next_locked) rather than waited for.
            with self._lock:
                self._revoked.update(response.revoked_tasks)
                new = [t for t in response.tasks if t.task_id not in self._fetchers and t.task_id not in self._revoked]
            with self._rcond:
                # The block first: a fetcher must not ask past it with the new rotation.
                block = 0 if response.iteration_finished else response.block_round
                block_changed = block != self._block
                self._block = block
                self._iteration_finished = response.iteration_finished
                # Sorted once here, not at every fetch and next().
                self._rotation = Rotation((s.task_id, s.starting_round) for s in response.rotation)
                self._rcond.notify_all()
            with self._lock:
                self._start_fetchers_locked(new)  # after the rotation: their rounds are known
            if block_changed and block:
                continue  # acknowledge the block at once: the joining worker waits for every consumer
            interval = self._heartbeat_interval(response, interval)
            self._stop.wait(interval)

    def _fail(self, exc: BaseException) -> None:
        if self._stop.is_set():
            return
        with self._rcond:
            if self._failure is None:
                self._failure = exc
            self._rcond.notify_all()

    # --- fetchers -------------------------------------------------------------------
    def _next_round_of(self, task_id: int, after: int) -> Optional[int]:
        """The first round from ``after`` this task serves that the fetcher may ask for now: within the
        consumer's window and short of the block (None: none now). Under _rcond."""
        start = max(after, self._next_round, self._over.get(task_id, 0))
        limit = self._next_round + self._ahead
        if self._block:
            limit = min(limit, self._block)
        for r in range(start, limit):
            if r not in self._results and self._rotation.task_of(r) == task_id:
                return r
        return None

    def _fetch(self, task: dispatcher_pb2.TaskDef) -> None:
        task_id = task.task_id
        transport = self._open_transport(task)
        read_key = task_read_key(self._read_key, task_id)
        backoff = FIRST_BACKOFF_S
        after = 0
        try:
            while not self._stop.is_set() and task_id not in self._revoked:
                with self._rcond:
                    r = self._next_round_of(task_id, after)
                    if r is None:
                        self._rcond.wait(0.5)
                        continue
                    self._asked = max(self._asked, r)  # before asking: the heartbeat reports it
                request = worker_pb2.GetElementsRequest(
                    task_id=task_id, client_id=self.client_id, max_elements=1, max_bytes=MAX_RESPONSE_BYTES,
                    wait_ms=GET_ELEMENTS_WAIT_MS, read_key=read_key, consumer_index=self._options.consumer_index,
                    round_index=r)
                try:
                    head, frame = transport.get(request)
                except TransientError as exc:
                    backoff = self._back_off(task, exc, backoff)
                    continue
                except errors.DataServiceError as exc:
                    self._fail(exc)
                    return
                backoff = FIRST_BACKOFF_S
                self._answered(task_id)
                after = self._deliver_round(task, r, head, frame)
                head = frame = None
                if after is None:
                    return
        finally:
            self._close_transport(task_id, transport)

    def _deliver_round(self, task: dispatcher_pb2.TaskDef, r: int, head: worker_pb2.ElementChunk, frame
                       ) -> Optional[int]:
        """Records the answer for round ``r``; the round to look from next, or None: the task is done."""
        if head.error_type:
            self._fail(remote_failure(head))
            return None
        if head.skip_to_round:
            with self._rcond:
                self._over[task.task_id] = max(self._over.get(task.task_id, 0), head.skip_to_round)
                self._rcond.notify_all()
            return head.skip_to_round
        if head.end_of_sequence:
            # The task's stream ended before a whole round (a dataset that was not infinite after all).
            with self._rcond:
                self._end_round = r if self._end_round is None else min(self._end_round, r)
                self._rcond.notify_all()
            return None
        if not head.num_elements:
            return r  # not ready yet (the pipeline, or another consumer lags): ask again
        try:
            element = frame.decode()[0]
        except WireFormatError as exc:
            self._fail(errors.ServiceError(f"task {task.task_id}: a malformed frame of elements from "
                                           f"{task.worker_address}: {exc}"))
            return None
        self._received_any = True
        with self._rcond:
            if r >= self._next_round:
                self._results[r] = (element, frame.nbytes)
                self._rcond.notify_all()
        return r + 1

    def _no_answer_message(self) -> str:
        with self._rcond:
            r, block = self._next_round, self._block
        base = super()._no_answer_message()
        if block and r >= block:
            return f"{base} (round {r}: waiting for a worker to join the rotation at round {block}; every " \
                   f"consumer of the job must keep reading for it to start)"
        return base
