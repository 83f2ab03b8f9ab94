"""The client's reader: streams elements from every task of an iteration.

One fetcher thread per task pulls frames of elements straight from the
worker. No read waits without bound: a worker that cannot be reached (a wrong
``--worker-address``) is named in a warning after a few seconds, and when no
worker has answered for ``timeout_ms`` the read raises
``ServiceUnavailableError`` naming the workers tried and what went wrong with
each. ``max_outstanding_requests`` is a pool of element credits: a fetcher
asks for as many elements as it holds credits, and a credit returns to the
pool only when the consumer takes the element, so no more than that many
elements are ever requested or buffered at once. Of that pool the reader uses
only its read-ahead (``read_ahead.ReadAhead``): a few elements at first, growing
with what its consumer takes while an answer is in flight, so that readers of
a shared job take its elements at the rates their consumers do. A byte budget
additionally bounds what is buffered when elements are large.

Example::

    >>> reader = IterationReader(dispatcher, job_id=3, repetition=0, max_outstanding_requests=256, timeout_ms=60000)
    >>> next(reader)
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import threading
import time
from typing import Any, Callable, Optional


from dataservice import errors
from dataservice.client.buffer_pool import BufferPool
from dataservice.data.read_stats import ReaderStats, ReaderStatsRecorder  # re-exported: the client's names
from dataservice.client.read_ahead import ReadAhead
from dataservice.client.group_order import GroupOrder, ReaderShare
from dataservice.client.read_options import ReadOptions
from dataservice.client.read_position import ReadPosition
from dataservice.client.target_workers import WorkerTargeting
from dataservice.client.transports import TransientError, connect
from dataservice.proto import dispatcher_pb2, state_pb2, worker_pb2
from dataservice.service.auth import ClusterAuth, task_read_key
from dataservice.service.dispatcher_client import DispatcherClient, KnownTasks
from dataservice.service.tls import TlsSettings
from dataservice.service.intervals import OffsetSet
from dataservice.service.lifecycle import Stage, stop_at_exit
from dataservice.service.remote_errors import remote_failure
from dataservice.service.wire import WireFormatError

__all__ = ["IterationReader", "ReaderStats", "ReaderStatsRecorder", "DEFAULT_MAX_OUTSTANDING_REQUESTS",
           "MAX_BUFFERED_BYTES"]

log = logging.getLogger("dataservice.client")

#: Element credits when ``max_outstanding_requests`` is None.
DEFAULT_MAX_OUTSTANDING_REQUESTS = 1024
#: Bytes buffered on the client beyond which fetchers pause.
MAX_BUFFERED_BYTES = 64 * 1024 * 1024
#: Bytes one response carries at most (at least one element).
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
#: How long a GetElements call waits at the worker for a first element.
GET_ELEMENTS_WAIT_MS = 500
#: The same, when there are fewer credits than tasks: a fetcher holding the only credits must not
#: sit on a worker that has nothing (say, no split left) while another worker has elements ready.
SCARCE_CREDITS_WAIT_MS = 20
#: How often the client tells the dispatcher it is alive (and learns of new tasks), unless the dispatcher
#: says otherwise (it stretches the interval for thousands of readers: dispatcher/fleet_intervals.py).
CLIENT_HEARTBEAT_INTERVAL_S = 1.0
#: The longest interval a reader accepts from a dispatcher (a quarter of the default client_timeout_ms).
MAX_CLIENT_HEARTBEAT_INTERVAL_S = 15.0
#: Heartbeats a client sends at most, when split ends make it report early (until every split is leased:
#: then each at once).
MAX_HEARTBEATS_PER_S = 50
#: The same while the dispatcher says many splits are left to lease (``many_splits_left``): a report per
#: split end cost a 2,000-image epoch of 63 one-batch splits 6% of its CPU, and only the epoch's end
#: waits on them. At 5 a second the reader still hears that the end nears within 0.2 s, well inside the
#: dispatcher's ``REPORT_SLOWLY_LEFT_S``; each report costs 1-2 ms of CPU on each side at this pace.
SLOW_HEARTBEATS_PER_S = 5
#: How long a worker may stay unreachable before the reader warns (once per task).
UNREACHABLE_WARNING_S = 2.0
#: Marks (ElementRun.mark) kept per split group: the consumer is rarely further behind the fetchers.
MARKS_PER_GROUP = 8
#: A fetcher's first wait before asking an unreachable worker again (doubling up to 1 s).
FIRST_BACKOFF_S = 0.05

_END = object()


class _Credits:
    """A counting pool shared by the fetchers, first come first served, within an adaptive read-ahead.

    A credit is an element requested and not yet taken by the consumer. ``total``
    (``max_outstanding_requests``) bounds them for good; ``read_ahead`` decides how many of them the
    reader uses now (at least one per fetcher, as a tf.data service reader holds about one element per
    task). ``acquire`` waits its turn, then takes up to ``most`` credits but no more than a fair share
    of the read-ahead, so that a fetcher whose worker has nothing ready cannot keep every credit (and
    starve the fetchers whose workers do).
    """

    def __init__(self, total: int):
        self.total = total
        self.read_ahead = ReadAhead(total)
        self._free = total  # of ``total``: in use are ``total - _free``
        self._cond = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self.buffered_bytes = 0
        self.fetchers = 1
        self.taken = 0  # elements the consumer has taken

    def _window(self) -> int:
        """How many credits may be in use now (under the lock)."""
        return min(self.total, max(self.read_ahead.limit, self.fetchers))

    def _room(self) -> int:
        return self._window() - (self.total - self._free)

    def acquire(self, most: int, timeout_s: float, privileged: Optional[Callable[[], bool]] = None) -> int:
        """Up to ``most`` credits (0 after ``timeout_s``). ``privileged``: a deterministic read's fetcher that
        may hold the group the consumer waits for asks it (under this lock) and, while it says so, takes its
        share even past the window and the byte budget: the elements held back for their turn must never
        starve the one the order waits for. That exceeds the bound by one request per such fetcher."""
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            try:
                if not self._cond.wait_for(lambda: (self._queue[0] is ticket and self._room() > 0
                                                    and self.buffered_bytes < MAX_BUFFERED_BYTES)
                                           or (privileged is not None and privileged()), timeout=timeout_s):
                    return 0
                share = max(1, self._window() // max(1, self.fetchers))
                n = min(most, self._room(), share) if self._room() > 0 else min(most, share)
                self._free -= n
                return n
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()

    def release(self, n: int, nbytes: int = 0) -> None:
        with self._cond:
            self._free += n
            self.buffered_bytes += nbytes
            self._cond.notify_all()

    def wake(self) -> None:
        """Something a ``privileged`` callable reads changed: waiting fetchers look again."""
        with self._cond:
            self._cond.notify_all()

    def take_one(self) -> None:
        """The consumer took an element: its credit comes back."""
        with self._cond:
            self._free += 1
            self.taken += 1
            self._cond.notify_all()

    def answered(self, round_trip_s: float, carried_elements: bool) -> None:
        """A worker answered a request after ``round_trip_s``."""
        with self._cond:
            before = self.read_ahead.limit
            if self.read_ahead.answered(round_trip_s, carried_elements, self.taken, time.monotonic()) > before:
                self._cond.notify_all()

    def waited(self) -> None:
        """The consumer found nothing buffered."""
        with self._cond:
            before = self.read_ahead.limit
            if self.read_ahead.waited(time.monotonic()) > before:
                self._cond.notify_all()


def report_pause_s(sent_at: float, now: float, all_splits_leased: bool = False,
                   many_splits_left: bool = False) -> float:
    """How long a reader woken at ``now`` (monotonic) by a split end waits before it reports, its last
    heartbeat having been sent at ``sent_at``: no more than ``MAX_HEARTBEATS_PER_S`` heartbeats a second
    (``SLOW_HEARTBEATS_PER_S`` while the dispatcher says ``many_splits_left``), counted from the last one,
    so that a split end after a quiet while (an epoch's last) is reported at once. Not at all once the
    dispatcher said every split is leased (``all_splits_leased``): any split end may then be the epoch's
    last, which ends the epoch when the dispatcher hears of it, and no more split ends are left than
    splits leased.

    Example::

        >>> report_pause_s(10.0, 12.0), round(report_pause_s(10.0, 10.005), 3), report_pause_s(10.0, 10.005, True)
        (0.0, 0.015, 0.0)
        >>> round(report_pause_s(10.0, 10.005, many_splits_left=True), 3)
        0.095
    """
    if all_splits_leased:
        return 0.0
    rate = SLOW_HEARTBEATS_PER_S if many_splits_left else MAX_HEARTBEATS_PER_S
    return max(0.0, sent_at + 1 / rate - now)


class IterationReader:
    """An iterator over one iteration of a job, as one client of it."""

    def __init__(self, dispatcher: DispatcherClient, job_id: int, repetition: int, max_outstanding_requests: int,
                 data_transfer_protocol: Optional[str] = None, timeout_ms: int = 60_000, job_name: str = "",
                 auth: Optional[ClusterAuth] = None, tls: Optional[TlsSettings] = None,
                 started_at: Optional[float] = None, read_options: Optional[ReadOptions] = None,
                 position: Optional[ReadPosition] = None, start_index: int = 0):
        #: When the consumer first asked for an element (monotonic): ``stats().elapsed_s`` counts from here,
        #: and the wait until this reader exists (the dispatcher's calls) counts as stall.
        self.started_at = time.monotonic() if started_at is None else started_at
        self._dispatcher = dispatcher
        self._auth = auth
        self._tls = tls
        self._protocol = data_transfer_protocol
        #: coordinated reads, cross-trainer cache, target_workers, compression (distribute's arguments)
        self._options = read_options if read_options is not None else ReadOptions(job_name=job_name)
        self._timeout_s = timeout_ms / 1000
        self._job_name = job_name
        self._repetition = repetition
        # Which workers this reader reads (target_workers); LOCAL without any worker here fails now. A
        # deterministic read reads every worker: each holds groups of the one order.
        self._targeting = WorkerTargeting("ANY" if self._options.deterministic else self._options.target_workers,
                                          dispatcher.address, coordinated=self._options.coordinated)
        self._targeting.check_before_reading()
        response = dispatcher.get_or_create_iteration(job_id, repetition,
                                                      consumer_index=self._options.consumer_index,
                                                      reader_index=self._options.reader_index)
        self.iteration_id = response.iteration_id
        self.client_id = response.client_id
        self._joined_existing = response.existing
        # The iteration's secret: each GetElements carries the task's key derived from it.
        self._read_key = response.read_key
        self._known_tasks = KnownTasks()  # heartbeats leave out a task list that did not change
        self._received_any = False
        self._credits = _Credits(max_outstanding_requests)
        # Whatever the fetchers can have buffered, plus one response in flight each.
        self._pool = BufferPool(MAX_BUFFERED_BYTES + MAX_RESPONSE_BYTES)
        self._max_per_request = max_outstanding_requests
        self._out: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._fetchers: dict[int, threading.Thread] = {}
        self._transports: dict[int, object] = {}
        self._finished_tasks: set[int] = set()
        # When a worker last answered (monotonic), and per task what failed since: for the warning
        # about an unreachable worker and the error when no worker answers for timeout_ms.
        self._last_answer = 0.0
        self._failing: dict[int, tuple[float, str]] = {}
        self._warned: set[int] = set()
        self._task_addresses: dict[int, str] = {}
        self._answered_at: dict[int, float] = {}  # per task, when its worker last answered (monotonic)
        # Delivery bookkeeping, keyed by (stream, split): offsets received, split sizes, what
        # changed since the last heartbeat, and revoked tasks we no longer read from.
        self._received: dict[tuple[int, int], OffsetSet] = {}
        self._totals: dict[tuple[int, int], int] = {}
        self._dirty: set = set()
        self._revoked: set[int] = set()
        self._current: list = []
        self._current_bytes = 0
        #: Where the elements of ``_current`` come from (``read_position.Segment``s).
        self._current_segments: list = []
        #: distributed_epoch: what the consumer took (``state_dict``); None in other modes. A restored read
        #: starts from the saved position, which its job's ResumePoint gave the dispatcher.
        self._position = position
        #: deterministic=True: the elements in split group order; and per task the group it sends now (None:
        #: between two groups), to know which fetcher may hold the group the order waits for.
        self._order = GroupOrder(position) if self._options.deterministic else None
        #: Elastic readers: this reader's share of the order; and where in the sequence the read starts.
        self._share = ReaderShare(self._options.num_readers, self._options.reader_index) \
            if self._options.num_readers is not None else None
        self._start_index = start_index
        self._order_lock = threading.Lock()
        self._released_at = time.monotonic()  # when the order last released elements (monotonic)
        self._task_group: dict[int, Optional[int]] = {}
        #: distributed_epoch: the workers' recent records of each group's iterator state (ElementRun.mark), group
        #: -> [(offset, JSON)], oldest first: a saved position names one for each group taken in part, where a
        #: restored read's worker seeks to. A restored read starts with the seeks it was given.
        self._marks: dict[int, list] = {g: [seek] for g, seek in position.seeks.items()} \
            if position is not None else {}
        self._pos = 0
        self._closed = False
        # stats(): the consumer's thread writes these, the heartbeat reads them (a snapshot, no lock).
        self._bytes_taken = 0
        self._waiting_since: Optional[float] = None  # the consumer waits inside next() since then
        self._ended_at: Optional[float] = None
        self._stall_s = time.monotonic() - self.started_at
        #: Static sharding: the listed workers the iteration still waits for (the heartbeat's word; "" none).
        self._waiting_for_workers = ""
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="dataservice-client-heartbeat",
                                           daemon=True)
        self._heartbeat.start()
        stop_at_exit(self.close, Stage.READERS)

    # --- consumer side ---------------------------------------------------------------
    def __iter__(self) -> "IterationReader":
        return self

    def __next__(self) -> Any:
        while self._pos >= len(self._current):
            if self._current or self._current_segments:
                self._credits.release(0, -self._current_bytes)
                if self._position is not None:
                    self._position.took(self._current_segments)
                self._current, self._current_bytes, self._current_segments, self._pos = [], 0, [], 0
            if self._closed:
                raise StopIteration
            if self._out.empty():
                self._credits.waited()  # the consumer keeps up with what arrives: read further ahead
                # A stall: the only place the consumer waits, so the only clock reads stats() costs.
                self._waiting_since = waited = time.monotonic()
                try:
                    item = self._next_item()
                finally:
                    now = time.monotonic()
                    self._waiting_since = None  # first: a concurrent stats() never counts this wait twice
                    self._stall_s += now - waited
            else:
                item = self._next_item()
            self._end_on(item)
            self._current, self._current_bytes, self._current_segments = item
            self._bytes_taken += self._current_bytes
            self._pos = 0
        element = self._current[self._pos]
        self._current[self._pos] = None  # the consumer owns it now
        self._pos += 1
        self._credits.take_one()
        return element

    def _end_on(self, item: Any) -> None:
        """Ends the read when ``item`` is the end (StopIteration) or an error (raised), closing the reader."""
        if item is _END:
            if self._share is not None:
                self._share.end()
            if self._order is not None and self._order.pending_groups():
                self.close()
                raise errors.ServiceError(
                    f"deterministic read: the iteration ended with split group(s) {self._order.pending_groups()[:10]} "
                    f"received but group {self._order.head} never complete; please report this")
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item

    def position_state(self) -> dict:
        """What ``state_dict()`` saves of this read (distributed_epoch; on the consumer's thread): the consumer's
        position (``ReadPosition.to_state``), and for a deterministic read its index in the sequence
        (``"position"``). For elastic readers that is the common position of all readers at this step,
        ``num_readers`` times what this one took, named in groups and offsets from the order's group starts."""
        if self._share is None:
            position = self._with_seeks(self.position())
            state = position.to_state()
            # -1: the dynamic order has no index in a sequence (the key is there alike: see read_position).
            state["position"] = self._start_index + self._credits.taken if self._order is not None else -1
            return state
        step = self._credits.taken * self._share.num_readers
        at = self._share.group_at(step)
        if at is None:  # nothing of the sequence passed yet: where the read started
            state = (self._position or ReadPosition()).to_state()
        else:
            group, offset = at
            done = OffsetSet([(0, group)]) if group else OffsetSet()
            position = ReadPosition(done, {group: OffsetSet([(0, offset)])} if offset else {})
            state = self._with_seeks(position).to_state()
        state["position"] = self._start_index + step
        return state

    def _with_seeks(self, position: ReadPosition) -> ReadPosition:
        """``position`` with, for each group taken in part, the latest mark at or before what was taken of it
        from its start (a worker restoring it produces nothing taken twice). Drops the marks of done groups."""
        with self._lock:
            for group in [g for g in self._marks if g in position.done]:
                del self._marks[group]
            for group in position.partial:
                prefix = position.prefix(group)
                usable = [m for m in self._marks.get(group, ()) if 0 < m[0] <= prefix]
                if usable:
                    position.seeks[group] = usable[-1]
        return position

    def position(self) -> ReadPosition:
        """What the consumer has taken so far (distributed_epoch; on the consumer's thread, between two
        ``next()``): a copy, with the part of the current answer it took."""
        if self._position is None:
            raise ValueError("this reader does not track its position: only a distributed_epoch read does")
        taken, prefix = self._pos, []
        for group, first, count, total in self._current_segments:
            if taken <= 0 and count:
                break
            n = min(count, taken)
            taken -= n
            prefix.append((group, first, n, total if n == count else -1))
        return self._position.copy_with(prefix)

    def stats(self, _monotonic: Callable[[], float] = time.monotonic,
              _of: Callable[..., ReaderStats] = ReaderStats.of) -> ReaderStats:
        """This reader's counters (see ``ReaderStats``); safe from any thread (and at interpreter exit: the
        clock and the constructor are bound as defaults, module teardown having set globals to None: see
        ``ReaderStatsRecorder.finished``)."""
        stall = self._stall_s
        waiting = self._waiting_since  # read after _stall_s: see __next__
        now = _monotonic()
        if waiting is not None:
            stall += now - waiting
        end = self._ended_at if self._ended_at is not None else now
        return _of(self._credits.taken, self._bytes_taken, stall, end - self.started_at)

    def _stats_report(self) -> dispatcher_pb2.ReaderStatsReport:
        stats = self.stats()
        elapsed_us = int(stats.elapsed_s * 1e6)
        return dispatcher_pb2.ReaderStatsReport(elements=stats.elements, bytes=stats.bytes,
                                                stall_us=min(int(stats.stall_s * 1e6), elapsed_us),
                                                elapsed_us=elapsed_us)

    def _next_item(self) -> Any:
        """The fetchers' next output; ServiceUnavailableError once no worker has answered for timeout_ms
        while we wait (a slow pipeline still answers: empty, after its wait for a first element)."""
        started = time.monotonic()
        while True:
            order = self._order
            # A deterministic read holding later groups back waits for its head's elements, not for any answer.
            held = order is not None and order.held > 0
            since = max(started, self._released_at if held else self._last_answer)
            remaining = since + self._timeout_s - time.monotonic()
            if remaining > 0:
                try:
                    return self._out.get(timeout=remaining)
                except queue.Empty:
                    continue
            try:
                return self._out.get_nowait()
            except queue.Empty:
                # Static sharding: shards of listed workers that are missing (never registered, or lost) may
                # never come, and no other worker produces them: said after timeout_ms, not awaited for ever.
                waiting = self._waiting_for_workers
                if held:
                    message = (f"deterministic read: nothing of split group {order.head} came for "
                               f"{int(self._timeout_s * 1000)} ms (timeout_ms) while {order.held} elements of the "
                               f"groups after it ({order.pending_groups()[:8]}) wait for their turn; the workers "
                               f"answer, but none sends that group. Is its worker stuck in the pipeline? Another "
                               f"reader of the job reading as the same reader_index takes what is this one's")
                    self.close()
                    raise errors.ServiceUnavailableError(message) from None
                if self._awaiting_the_end() and not waiting:
                    # Every task has delivered all it had: no worker is silent, the dispatcher's word on the
                    # end is awaited, and the heartbeat loop bounds that wait itself (timeout_ms to reach it).
                    started = time.monotonic()
                    continue
                # The message first: close() ends the fetchers, and an ended fetcher counts as finished.
                message = self._no_answer_message() if not waiting else (
                    f"static sharding: nothing came for {int(self._timeout_s * 1000)} ms (timeout_ms) and the "
                    f"epoch still needs the shards of {waiting}, which no other worker produces. Start the "
                    f"missing worker(s) at the address listed in the dispatcher's worker_addresses (a restarted "
                    f"worker produces its shard from the start)")
                self.close()
                raise errors.ServiceUnavailableError(message) from None

    def _awaiting_the_end(self) -> bool:
        """Every task this reader knows ended normally (none revoked, none failed: a failure is in the
        output already), and the reader is still open: only the dispatcher can say whether more come."""
        with self._lock:
            fetchers = list(self._fetchers)
            return (bool(fetchers) and not self._closed and not self._stop.is_set()
                    and all(t in self._finished_tasks and t not in self._revoked for t in fetchers))

    def _no_answer_message(self) -> str:
        timeout_ms = int(self._timeout_s * 1000)
        with self._lock:
            waiting = [t for t in self._fetchers if t not in self._finished_tasks and t not in self._revoked]
            tried = [f"worker {self._task_addresses.get(t, '?')}: {self._why_silent(t)}" for t in waiting]
            lost = sorted({self._task_addresses.get(t, "?") for t in self._revoked})
            skipped_all = not self._fetchers and bool(self._targeting.skipped)
        if skipped_all:
            return self._targeting.nothing_to_read(timeout_ms)
        if not tried and lost:
            # distributed_epoch: what the lost workers did not deliver waits for another worker to redo it.
            return (f"no worker served this job for {timeout_ms} ms: the dispatcher revoked the tasks of worker(s) "
                    f"{', '.join(lost)} (lost, or restarted) and no other worker has taken the job over. The rest of "
                    f"the epoch is produced when a worker registers with dispatcher {self._dispatcher.address}: is "
                    f"any running? (dataservice status --dispatcher {self._dispatcher.address})")
        if not tried:
            return (f"no worker served this job for {timeout_ms} ms: no worker has a task of it. Is any worker "
                    f"registered with dispatcher {self._dispatcher.address}? (dataservice status --dispatcher "
                    f"{self._dispatcher.address})")
        return (f"no worker answered for {timeout_ms} ms (timeout_ms); tried {'; '.join(tried)}. Check that this "
                f"client can reach the address each worker advertises (dataservice worker --worker-address) and "
                f"that the workers are not stopped or stuck")

    def _why_silent(self, task_id: int) -> str:
        """What went wrong with a task's worker, for the message above (under the lock)."""
        if task_id in self._failing:
            return self._failing[task_id][1]
        if task_id in self._answered_at:
            # It answered, then went quiet (say, SIGSTOPped): the connection is open but nothing comes.
            silent_ms = int((time.monotonic() - self._answered_at[task_id]) * 1000)
            return f"no answer for {silent_ms} ms since its last one (stopped or stuck?)"
        return "no answer yet"

    def close(self) -> None:
        """Stops fetching and releases this client at the dispatcher."""
        if self._closed:
            return
        self._closed = True
        self._ended_at = time.monotonic()
        self._stop.set()
        self._wake.set()
        with self._lock:
            transports = list(self._transports.values())
        for transport in transports:
            transport.interrupt()  # a fetcher blocked on a stuck worker must not outlive us
        try:
            self._dispatcher.release_iteration_client(self.client_id, read_key=self._read_key)
        except errors.DataServiceError as exc:
            log.info("could not release client %d: %s", self.client_id, exc)
        # The reader owns its dispatcher client from here on: closing it now, while grpc is alive (the
        # exit hook closes readers first), leaves nothing for a generator finalized after teardown.
        self._dispatcher.close()

    def __del__(self) -> None:
        try:
            self._stop.set()
            self._wake.set()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    # --- the dispatcher side ----------------------------------------------------------
    def _progress_report(self) -> tuple[list, list]:
        """What to tell the dispatcher: offsets received since the last report, and the
        revoked tasks we no longer accept elements from."""
        with self._lock:
            keys, self._dirty = self._dirty, set()
            progress = [state_pb2.SplitProgress(stream_id=k[0], split_index=k[1], ranges=self._received[k].flat(),
                                                total=self._totals.get(k, -1)) for k in sorted(keys)]
            return progress, sorted(self._revoked)

    def _heartbeat_loop(self) -> None:
        interval = 0.02  # poll fast until the first tasks show up
        while not self._stop.is_set():
            progress, stopped = self._progress_report()
            sent = time.monotonic()  # the pace after a wake counts from here (report_pause_s)
            try:
                response = self._dispatcher.client_heartbeat(self.client_id, progress, stopped, self._read_key,
                                                             stats=self._stats_report(), tasks=self._known_tasks)
            except errors.DataServiceError as exc:
                if not self._stop.is_set():
                    self._out.put(exc)
                return
            try:
                self._targeting.check_dispatcher(response.dispatcher_incarnation)
                if response.read_error:  # elastic readers restored at different positions
                    raise errors.InvalidRequestError(response.read_error)
            except errors.DataServiceError as exc:
                if not self._stop.is_set():
                    self._out.put(exc)
                return
            with self._lock:
                # Stop accepting elements from revoked tasks before saying so next time: from
                # then on what we report holding of their splits is final.
                fresh = not self._revoked.issuperset(response.revoked_tasks)  # to confirm at once
                self._revoked.update(response.revoked_tasks)
                self._waiting_for_workers = response.waiting_for_workers  # static sharding: see _next_item
                if response.iteration_finished and not self._fetchers and self._joined_existing:
                    # We joined an iteration other readers of the job already read to its end: its
                    # workers may have dropped its tasks. End of input at once, as tf.data does. (An
                    # iteration this reader created ends through its tasks, whose workers keep them for
                    # us: they may have failed at once, and the reader must raise their error.)
                    self._warn_if_read_by_others()
                    self._out.put(_END)
                    return
                new = self._targeting.select(
                    [t for t in response.tasks if t.task_id not in self._fetchers and t.task_id not in self._revoked
                     and t.task_id not in self._targeting.skipped], response.tasks)
                self._credits.fetchers = max(1, len(self._fetchers) + len(new) - len(self._finished_tasks))
                self._start_fetchers_locked(new)
                ended = self._finished_tasks | self._revoked
                all_done = bool(self._fetchers) and all(t in ended for t in self._fetchers)
                # A reader that leaves tasks to others (target_workers) waits for its own only: the
                # iteration goes on while theirs do. A revoked task of its own may still resume.
                more_expected = response.more_tasks_expected and not (
                    self._targeting.filters and not any(t in self._revoked for t in self._fetchers))
            # The end: every task we know has ended, and a heartbeat taken after that shows no new one. Or a
            # distributed_epoch iteration finished: clients hold every element of every split, so what a task of
            # ours still has (a stopped worker not yet declared lost) was delivered by another, and is not awaited.
            epoch_done = response.iteration_finished and self._fetchers and any(
                t.processing_mode == state_pb2.DISTRIBUTED_EPOCH for t in response.tasks)
            if epoch_done or (all_done and not new and not self._dirty and not more_expected):
                self._warn_if_read_by_others()
                with self._order_lock:
                    self._out.put(_END)
                return
            if fresh or (all_done and not more_expected):
                continue  # confirm the revocation, or report the last progress, at once
            interval = self._heartbeat_interval(response, interval)
            if self._wake.wait(interval):
                # Woken by a split end or a finished task: report now, but not more than MAX_HEARTBEATS_PER_S
                # times a second however fast splits end. The pace counts from the last heartbeat, not from
                # the wake: the epoch's last split end, after a quiet while, is reported at once (the
                # dispatcher ends the iteration, and tells its workers, when it hears of it); and once every
                # split is leased, every split end is (any may be the last).
                pause = report_pause_s(sent, time.monotonic(), response.all_splits_leased,
                                       response.many_splits_left)
                if pause:
                    self._stop.wait(pause)
            self._wake.clear()

    def _heartbeat_interval(self, response: dispatcher_pb2.ClientHeartbeatResponse, interval: float) -> float:
        """The wait before the next heartbeat, after one that waited ``interval``: the dispatcher's
        interval once the reader has tasks; until then a fast poll, slowing down (at most 0.5 s)."""
        steady = min(MAX_CLIENT_HEARTBEAT_INTERVAL_S, (response.heartbeat_interval_ms or 1_000) / 1000)
        return steady if self._fetchers else min(interval * 2, 0.5, steady)

    def _start_fetchers_locked(self, tasks: list) -> None:
        """Starts a fetcher thread (``_fetch``) for each task (under _lock)."""
        for task in tasks:
            self._task_addresses[task.task_id] = task.worker_address  # before any message needs it
            thread = threading.Thread(target=self._fetch, args=(task,), name=f"dataservice-fetch-{task.task_id}",
                                      daemon=True)
            self._fetchers[task.task_id] = thread
            thread.start()

    def _warn_if_read_by_others(self) -> None:
        """A second run of a script with the same job_name reads nothing: say why, and what to do."""
        if self._job_name and self._joined_existing and not self._received_any:
            log.warning(
                "job %r: its iteration %d had already been read to its end by other readers when this reader "
                "joined, so this reader gets end of input (0 elements), as in tf.data service: all readers with "
                "one job_name share one job. To read the dataset again, use a new job_name (or none), or wait "
                "until the dispatcher garbage-collects the finished job (job_gc_timeout_ms after its last reader "
                "left)", self._job_name, self._repetition)

    # --- fetchers -------------------------------------------------------------------
    def _accept(self, task_id: int, elements: list, runs) -> Optional[tuple[list, list]]:
        """The elements of a response we do not hold yet, and the segments numbering them (group, first
        offset, count, the group's total if it ended there); None once the task is revoked."""
        with self._lock:
            if task_id in self._revoked:
                return None
            keep: list = []
            segments: list = []
            i = 0
            split_ended = False
            for run in runs:
                key = (run.stream_id, run.split_index)
                held = self._received.get(key)
                if held is None:
                    held = self._received[key] = OffsetSet()
                first, end = run.first_offset, run.first_offset + run.count
                for a, b in held.missing(first, end):
                    keep.extend(elements[i + a - first:i + b - first])
                    segments.append((run.split_index, a, b - a, -1))
                held.add(first, end)
                if self._options.cross_trainer_cache is not None and first:
                    # A cached trainer never gets what it skipped (evicted before it read it): held, for
                    # the report, so that the set stays one range however often it skips. (What the worker
                    # could not deliver to this reader comes back to this reader alone, before anything
                    # later: trainer_cache.TrainerCache keys it by trainer and client id.)
                    held.add(0, first)
                if run.mark and self._position is not None:
                    marks = self._marks.setdefault(run.split_index, [])
                    if not marks or marks[-1][0] < run.mark_offset:
                        marks.append((run.mark_offset, run.mark.decode()))
                        del marks[:-MARKS_PER_GROUP]
                if run.split_total >= 0 and key not in self._totals:  # a group redone elsewhere ends twice
                    self._totals[key] = run.split_total
                    split_ended = True
                    last = segments[-1] if segments else None
                    if last is not None and last[0] == run.split_index and last[1] + last[2] == run.split_total:
                        segments[-1] = last[:3] + (run.split_total,)
                    else:
                        segments.append((run.split_index, run.split_total, 0, run.split_total))
                self._dirty.add(key)
                i += run.count
            if not runs:
                keep = elements
            if runs:
                last_run = runs[-1]
                self._task_group[task_id] = last_run.split_index if last_run.split_total < 0 else None
        if split_ended:
            self._wake.set()  # tell the dispatcher soon: it is waiting for split ends to finish the job
        return keep, segments

    def _may_hold_head(self, task_id: int) -> bool:
        """deterministic=True: whether this task may send the group the order waits for: it sends it now,
        or is between groups (its next may be it), or no task is known to send it (a group redone after a
        worker loss, queued behind others on its new task)."""
        head = self._order.head
        current = self._task_group.get(task_id)
        if current is None or current == head:
            return True
        try:  # read without the reader's lock (this runs under the credits' lock): a set may change meanwhile
            ended = self._revoked | self._finished_tasks
        except RuntimeError:
            return True  # asked again at the next wake-up
        return not any(g == head and t not in ended for t, g in list(self._task_group.items()))

    def _answered(self, task_id: int) -> None:
        self._last_answer = self._answered_at[task_id] = time.monotonic()
        if task_id in self._failing:
            with self._lock:
                self._failing.pop(task_id, None)

    def _failed(self, task: dispatcher_pb2.TaskDef, exc: TransientError) -> None:
        """Remembers why a worker did not serve the task; warns once when it stays unreachable.

        A worker that answers that it does not run the task is reachable, but its answer is no progress
        either: it does not count against ``timeout_ms`` as an answer does. It normally lasts the moment
        until the worker hears of the task or the dispatcher revokes it; for good, when whatever answers
        at the address is not the worker the dispatcher gave the task to (a wrong ``--worker-address``)."""
        now = time.monotonic()
        with self._lock:
            since = self._failing.get(task.task_id, (now, ""))[0]
            why = f"it answers that it does not run the task ({exc}): is its --worker-address the address of the " \
                  f"worker the dispatcher gave the task to?" if exc.answered else str(exc)
            self._failing[task.task_id] = (since, why)
            warn = not exc.answered and now - since >= UNREACHABLE_WARNING_S and task.task_id not in self._warned
            if warn:
                self._warned.add(task.task_id)
        if warn and not self._stop.is_set():
            log.warning("cannot reach worker %s for %.1f s (%s). Check that this client can reach the address "
                        "the worker advertises (dataservice worker --worker-address); reading fails if no worker "
                        "answers for timeout_ms=%d", task.worker_address, now - since, exc,
                        int(self._timeout_s * 1000))

    def _open_transport(self, task: dispatcher_pb2.TaskDef):
        """A fetcher's connection to the task's worker, registered so that ``close()`` interrupts it."""
        transport = connect(task, self._pool, self._protocol, self._auth, self._tls, self._options.compression,
                            in_process=self._options.target_workers == "LOCAL")
        with self._lock:
            self._transports[task.task_id] = transport
            self._task_addresses[task.task_id] = task.worker_address
        if self._stop.is_set():
            transport.interrupt()  # close() ran before we registered the transport
        return transport

    def _close_transport(self, task_id: int, transport) -> None:
        """A fetcher ends: its task counts as finished here."""
        with self._lock:
            self._transports.pop(task_id, None)
            self._finished_tasks.add(task_id)
        transport.close()
        self._wake.set()

    def _back_off(self, task: dispatcher_pb2.TaskDef, exc: TransientError, backoff: float) -> float:
        """A worker that died, stalled or restarted: the dispatcher decides (within worker_timeout_ms)
        whether its task is revoked; until then the fetcher keeps trying, after a jittered wait of about
        ``backoff`` (noted for the unreachable-worker warning). The next backoff."""
        self._failed(task, exc)
        self._stop.wait(backoff * (0.5 + random.random()))
        return min(backoff * 2, 1.0)

    def _fetch(self, task: dispatcher_pb2.TaskDef) -> None:
        task_id = task.task_id
        transport = self._open_transport(task)
        backoff = FIRST_BACKOFF_S
        read_key = task_read_key(self._read_key, task_id)
        privileged = (lambda: self._may_hold_head(task_id)) if self._order is not None else None
        try:
            while not self._stop.is_set() and task_id not in self._revoked:
                n = self._credits.acquire(self._max_per_request, timeout_s=0.5, privileged=privileged)
                if n == 0:
                    continue
                wait_ms = GET_ELEMENTS_WAIT_MS if self._credits.total >= self._credits.fetchers \
                    else SCARCE_CREDITS_WAIT_MS
                request = worker_pb2.GetElementsRequest(task_id=task_id, client_id=self.client_id, max_elements=n,
                                                        max_bytes=MAX_RESPONSE_BYTES, wait_ms=wait_ms,
                                                        read_key=read_key, trainer_id=self._options.trainer_id)
                sent = time.monotonic()
                try:
                    head, frame = transport.get(request)
                except TransientError as exc:
                    self._credits.release(n)
                    backoff = self._back_off(task, exc, backoff)
                    continue
                except errors.DataServiceError as exc:
                    self._credits.release(n)
                    self._out.put(exc)
                    return
                backoff = FIRST_BACKOFF_S
                self._answered(task_id)
                self._credits.answered(time.monotonic() - sent, head.num_elements > 0)
                alive = self._deliver(task, n, head, frame)
                head = frame = None  # nothing of this response outlives _deliver: see there
                if not alive:
                    return
        finally:
            self._close_transport(task_id, transport)

    def _deliver(self, task: dispatcher_pb2.TaskDef, n: int, head: worker_pb2.ElementChunk, frame) -> bool:
        """Hands a response's elements to the consumer; False when the task is done with. A method of
        its own so that no local of it outlives the call on the fetcher's stack: an element the consumer
        drops must free (or give back to the pool) its buffer at once, not when the next response arrives."""
        if head.error_type:
            self._credits.release(n)
            self._out.put(remote_failure(head))
            return False
        try:
            elements = frame.decode() if head.num_elements else []
        except WireFormatError as exc:
            self._credits.release(n)
            self._out.put(errors.ServiceError(f"task {task.task_id}: a malformed frame of elements from "
                                              f"{task.worker_address}: {exc}"))
            return False
        # Accepted and queued under one lock: the end of a finished epoch (_heartbeat_loop) is queued after
        # whatever was accepted, and so reported held, before it; and the order's chunks go in its order.
        with self._order_lock:
            accepted = self._accept(task.task_id, elements, head.runs)
            if accepted is None:
                self._credits.release(n)
                return False
            kept, segments = accepted
            nbytes = frame.nbytes if kept else 0
            self._credits.release(n - len(kept), nbytes)
            if kept:
                self._received_any = True
            if self._order is not None:
                head_before = self._order.head
                chunks = self._order.add(kept, nbytes, segments)
                if self._share is not None:
                    dropped = self._share.dropped
                    chunks = self._share.feed(chunks)
                    if self._share.dropped > dropped:
                        self._credits.release(self._share.dropped - dropped)  # other readers' elements
                if chunks:
                    self._released_at = time.monotonic()
                for chunk in chunks:
                    self._out.put(chunk)
                if self._order.head != head_before:
                    self._credits.wake()  # another fetcher may hold the new head
            elif kept or (segments and self._position is not None):
                self._out.put((kept, nbytes, segments))
        return not head.end_of_sequence

