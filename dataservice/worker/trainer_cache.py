"""The cross-trainer cache: one task's elements shared by every trainer of its job.

With ``distribute(..., job_name=..., cross_trainer_cache=CrossTrainerCache(trainer_id))`` several
trainers (hyperparameter-search jobs, say) read one job, and each of them is to see the elements
the job produces, not a share of them. A worker keeps, per task of such a job, a sliding window of
the elements it produced, bounded by ``WorkerConfig.cross_trainer_cache_size_bytes``, and each
trainer a position in it:

- a trainer reads from its own position on; it sees each element at most once, in the order the
  task produced them;
- the task's pipeline produces only when the fastest trainer has read the whole window (taking
  from the task's own buffer, which runs ahead of it as for any task): however many trainers read,
  it runs once;
- a new element evicts the oldest ones once the window is full, and a trainer whose position fell
  out of the window skips ahead to the oldest element kept (a new trainer starts there too) —
  which is why the dataset must be infinite: a trainer may miss elements, never run out of them;
- readers with the same ``trainer_id`` (the replicas of one trainer) share its position, first
  come first served, as the readers of a job without the cache share the job.

Elements keep their numbers (stream, split, offset), so each reader's bookkeeping — what it
holds, what it reports to the dispatcher — works as for any task. An answer that does not reach
its reader is given back to that reader alone (``TrainerView.untake``; a reader is a trainer id
and a client id), which reads it next if it is still in the window: a replica of the same trainer
may already have read later elements, and a cached reader counts everything before what it
receives as held (``IterationReader._accept``), so it would drop them. If that reader is gone, its
trainer misses them, as if evicted.

The window's bytes count against the worker's ``MemoryBudget`` (an account of its own) and are
returned when the task stops. They move from the task's buffer into the window's account at once
(``TaskRunner.take(into=...)``): the budget's total does not change, so a window never waits for
the budget. While the worker is over its budget (a task whose account is empty may always buffer
one element), a window does not grow: it evicts its oldest entries to take in new ones (the newest
entry is always kept). So however many cached tasks a worker runs, their windows together, and with
the tasks' buffers, stay within its budget (give or take one element per task), and a window may
hold less than ``limit_bytes`` while the budget is full: its trainers then skip more. This is
tf.data service's ``CrossTrainerCache`` and ``CachingTaskRunner``.

Example::

    >>> cache = TrainerCache(runner, limit_bytes=256 << 20, budget=worker.memory_budget)
    >>> elements, runs, ended, error = cache.take("trainer-a", 7, max_elements=64, max_bytes=1 << 23, wait_s=0.5)
    >>> cache.stats()["produced_elements"]    # also in the worker's /status.json, per task
    64
"""

from __future__ import annotations

import bisect
import collections
import logging
import threading
import time
from typing import Optional

from dataservice.service.processing_modes import elastic_reader_id
from dataservice.worker.memory_budget import MemoryBudget
from dataservice.worker.task_runner import SPLIT_END as _SPLIT_END, TaskRunner, add_entry, entries_of

__all__ = ["TrainerCache", "TrainerView"]

log = logging.getLogger("dataservice.worker")


class TrainerCache:
    """The sliding-window cache of one task (see the module docstring). Thread-safe.

    ``limit_bytes``: the window's most (``WorkerConfig.cross_trainer_cache_size_bytes``); with a
    ``budget`` (the one ``runner`` was made with) it also holds no more than the budget has room for
    (a warning says so, once)."""

    def __init__(self, runner: TaskRunner, limit_bytes: int, budget: Optional[MemoryBudget] = None,
                 readers: int = 0):
        if not isinstance(limit_bytes, int) or isinstance(limit_bytes, bool) or limit_bytes <= 0:
            raise ValueError(f"a cross-trainer cache needs a positive size in bytes, got {limit_bytes!r}")
        #: Elastic readers (``distribute(..., num_readers=N)``): the trainers are ``elastic_reader_id(i)``, i < N, and
        #: the window loses nothing: an entry leaves it once every one of them has read it, and the window
        #: stops growing at ``limit_bytes`` until the slowest has (0: the cross-trainer cache, which evicts).
        self.readers = readers
        self._runner = runner
        self.limit_bytes = limit_bytes
        self._budget = budget
        self._account = budget.account() if budget is not None else None
        self._allowed = limit_bytes  # what the window may hold while a batch goes in (see _extend)
        self._warned = False
        self._cond = threading.Condition()
        # The window: entries (element, size, stream, split, offset), the oldest first; entry i of the
        # task's sequence sits at _entries[i - _start].
        self._entries: collections.deque = collections.deque()
        self._start = 0
        self._bytes = 0
        # Where the window's runs of consecutive offsets start: [first index, stream, split, first offset
        # (None: a split end), count], oldest first — a few per task, not one per element (see _index).
        self._segments: collections.deque = collections.deque()
        self._cursors: dict[str, int] = {}      # trainer -> next index it reads
        # (trainer, client) -> sorted indices given back, read first by that reader alone
        self._returned: dict[tuple, list] = {}
        self._extending = False                 # a trainer is taking from the task (one at a time)
        self._ended = False
        self._error: Optional[BaseException] = None
        self._closed = False
        self._produced = self._evicted = self._skipped = self._split_ends = 0
        self._served: dict[str, int] = {}      # trainer -> elements served to its readers

    # --- reading ---------------------------------------------------------------------
    def take(self, trainer_id: str, client_id: int, max_elements: int, max_bytes: int, wait_s: float
             ) -> tuple[list, list, bool, Optional[BaseException]]:
        """What ``TaskRunner.take`` returns, for the reader ``client_id`` of ``trainer_id``: up to
        ``max_elements`` elements its trainer has not read (at least one unless none came within
        ``wait_s``), what was given back for this reader first; their runs; whether the task ended for
        it (with the task's error, if it failed). Nothing once the cache is closed."""
        reader = (trainer_id, client_id)
        deadline = time.monotonic() + wait_s
        tried = False  # one extension even with no time to wait: it takes what the task has buffered
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return [], [], False, None
                    if self._ready(reader):
                        return self._serve(reader, max_elements, max_bytes)
                    if self._ended:
                        return [], [], True, self._error
                    remaining = deadline - time.monotonic()
                    full = self.readers and self._bytes >= self.limit_bytes  # lossless: the slowest must read first
                    if not self._extending and not full and (remaining > 0 or not tried):
                        self._extending = True  # this trainer is the fastest: it makes the window grow
                        break
                    if remaining <= 0:
                        return [], [], False, None
                    self._cond.wait(remaining)  # another trainer is extending the window
            tried = True
            self._extend(max_elements, max_bytes, max(0.0, remaining))

    def _extend(self, max_elements: int, max_bytes: int, wait_s: float) -> None:
        """Takes the next elements from the task (outside the lock: it waits for the producer) and
        appends them. At most half the window at once, so that a batch never evicts its own start."""
        try:
            batch_bytes = min(max_bytes, max(1, self.limit_bytes // 2))
            elements, runs, ended, error = self._runner.take(max_elements, batch_bytes, wait_s, into=self._account)
        except BaseException:
            with self._cond:
                self._extending = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._extending = False
            self._cond.notify_all()
            if self._closed:
                return
            entries = entries_of(elements, runs)
            account = self._account
            if account is not None:
                # The account holds these bytes now (take moved them). Over the budget, the window does
                # not grow by the excess: old entries make way for new ones.
                incoming = sum(e[1] for e in entries)
                over = max(0, self._budget.used_bytes - self._budget.limit_bytes)
                self._allowed = min(self.limit_bytes, self._bytes + max(0, incoming - over))
                if over and self._allowed < min(self.limit_bytes, self._bytes + incoming) \
                        and not self._warned:  # the budget, not the window's limit, makes it evict
                    self._warned = True
                    log.warning("task %d: its cross-trainer cache holds %d bytes, less than its %d "
                                "(cross_trainer_cache_size_bytes), because the worker's memory budget (%d bytes) "
                                "is full: trainers that fall behind skip more. Raise --memory-budget-bytes, or "
                                "lower --cross-trainer-cache-size-bytes when a worker runs several cached jobs",
                                self._runner.task_id, self._bytes, self.limit_bytes, self._budget.limit_bytes)
            for entry in entries:
                self._append(entry)
            if account is not None:
                # The account holds the window's bytes exactly: what was evicted goes back.
                held = account.used_bytes
                if held > self._bytes:
                    account.release(held - self._bytes)
                elif held < self._bytes:
                    account.charge(self._bytes - held)
            self._produced += len(elements)
            if ended:
                self._ended = True
                self._error = error
            if self._runner.stopped:
                self._close_locked()

    def _append(self, entry: tuple) -> None:
        """Adds an entry at the window's end, evicting the oldest ones first while it would not fit
        (the newest entry is always kept, however large); lossless (elastic readers): evicting nothing."""
        size = entry[1]
        while not self.readers and self._entries and self._bytes + size > self._allowed:
            old = self._entries.popleft()
            self._start += 1
            self._bytes -= old[1]
            if old[0] is not _SPLIT_END:
                self._evicted += 1
            else:
                self._split_ends -= 1
        segments = self._segments
        while segments and segments[0][0] + segments[0][4] <= self._start:
            segments.popleft()  # evicted whole
        index = self._start + len(self._entries)
        offset = None if entry[0] is _SPLIT_END else entry[4]
        last = segments[-1] if segments else None
        if offset is not None and last is not None and last[3] is not None and last[1] == entry[2] \
                and last[2] == entry[3] and last[3] + last[4] == offset and last[0] + last[4] == index:
            last[4] += 1
        else:
            segments.append([index, entry[2], entry[3], offset, 1])
        self._entries.append(entry)
        self._bytes += size
        if offset is None:
            self._split_ends += 1

    def _ready(self, reader: tuple) -> bool:
        """The reader has something to read (under the lock); moves its trainer into the window first."""
        trainer_id = reader[0]
        cursor = self._cursors.get(trainer_id)
        if cursor is None or cursor < self._start:
            if cursor is not None:
                self._skipped += self._start - cursor  # evicted before it read them (split ends included)
            cursor = self._cursors[trainer_id] = self._start
        returned = self._returned.get(reader)
        if returned:
            drop = bisect.bisect_left(returned, self._start)
            del returned[:drop]
        return bool(returned) or cursor < self._start + len(self._entries)

    def _serve(self, reader: tuple, max_elements: int, max_bytes: int
               ) -> tuple[list, list, bool, Optional[BaseException]]:
        """Hands the reader what its trainer has not read (under the lock): what was given back for
        this reader first, then from the trainer's position on; runs as ``TaskRunner.take`` makes them."""
        out: list = []
        runs: list = []
        taken_bytes = 0
        start, entries = self._start, self._entries
        returned = self._returned.get(reader) or []
        while returned and len(out) < max_elements and not (out and taken_bytes >= max_bytes):
            entry = entries[returned.pop(0) - start]
            taken_bytes += add_entry(entry, out, runs)
        if not returned:
            self._returned.pop(reader, None)
        trainer_id = reader[0]
        cursor = self._cursors[trainer_id]
        end = start + len(entries)
        while cursor < end:
            entry = entries[cursor - start]
            if entry[0] is not _SPLIT_END and (len(out) >= max_elements or (out and taken_bytes >= max_bytes)):
                break
            taken_bytes += add_entry(entry, out, runs)
            cursor += 1
        self._cursors[trainer_id] = cursor
        self._served[trainer_id] = self._served.get(trainer_id, 0) + len(out)
        ended = self._ended and cursor >= end and not returned
        if self.readers:
            self._trim()
        return out, runs, ended, self._error if ended else None

    def _trim(self) -> None:
        """Lossless: drops the entries every reader has read (under the lock); a reader not seen yet has read
        none, and what was given back to a reader is kept for it."""
        low = self._start + len(self._entries)
        for i in range(self.readers):
            low = min(low, self._cursors.get(elastic_reader_id(i), self._start))
        for (trainer, _), returned in self._returned.items():
            if returned:
                low = min(low, returned[0])
        dropped = 0
        while self._start < low:
            old = self._entries.popleft()
            self._start += 1
            dropped += old[1]
            if old[0] is _SPLIT_END:
                self._split_ends -= 1
        if dropped:
            self._bytes -= dropped
            segments = self._segments
            while segments and segments[0][0] + segments[0][4] <= self._start:
                segments.popleft()
            if self._account is not None:
                self._account.release(min(dropped, self._account.used_bytes))
            self._cond.notify_all()  # a reader waiting for the window to have room may extend it now

    def untake(self, trainer_id: str, client_id: int, runs: list) -> None:
        """An answer to the reader ``client_id`` of ``trainer_id`` did not reach it: that reader reads
        those of its elements still in the window again, before going on."""
        with self._cond:
            if self._closed:
                return
            # Readers gone with elements still given back: forget those once evicted.
            for key in [k for k, v in self._returned.items() if not v or v[-1] < self._start]:
                del self._returned[key]
            indices = []
            for stream, split, first, count, total in runs:
                for offset in range(first, first + count):
                    i = self._index(stream, split, offset)
                    if i is not None:
                        indices.append(i)
                if total >= 0:
                    i = self._index(stream, split, None)
                    if i is not None:
                        indices.append(i)
            returned = self._returned.setdefault((trainer_id, client_id), [])
            for i in indices:
                if i not in returned:
                    bisect.insort(returned, i)
            self._cond.notify_all()

    def _index(self, stream: int, split: int, offset: Optional[int]) -> Optional[int]:
        """Where element ``offset`` (None: the end) of split (stream, split) sits in the task's sequence,
        if it is still in the window (under the lock). The newest segments first: what is given back
        was usually served moments ago."""
        for first, s, p, first_offset, count in reversed(self._segments):
            if s != stream or p != split or (first_offset is None) != (offset is None):
                continue
            if offset is None:
                i = first
            elif first_offset <= offset < first_offset + count:
                i = first + offset - first_offset
            else:
                continue
            return i if i >= self._start else None
        return None

    def view(self, trainer_id: str, client_id: int) -> "TrainerView":
        """The cache as the task of one reader of a trainer (what a response gives its elements back to)."""
        return TrainerView(self, trainer_id, client_id)

    # --- lifecycle -------------------------------------------------------------------
    def close(self) -> None:
        """Drops the window and returns its bytes to the worker's budget (the task stopped). Idempotent."""
        with self._cond:
            self._close_locked()

    def _close_locked(self) -> None:
        self._closed = True
        self._entries.clear()
        self._segments.clear()
        self._returned.clear()
        self._bytes = 0
        self._split_ends = 0
        if self._account is not None:
            self._account.close()
        self._cond.notify_all()

    def stats(self) -> dict:
        """What the cache holds and did, for the worker's ``/status.json`` (per task) and tests:
        ``limit_bytes`` (the window's), ``produced_elements`` taken from the task (once, for all
        trainers), ``evicted_elements``, ``skipped_elements`` (entries trainers jumped past because they
        were evicted before they read them, split ends included, summed over trainers),
        ``cached_elements`` and ``cached_bytes`` now, ``trainers`` (trainer ids seen), ``served_elements``
        (summed over trainers) and ``served_by_trainer``. Constant time per trainer."""
        with self._cond:
            return {"limit_bytes": self.limit_bytes, "produced_elements": self._produced,
                    "evicted_elements": self._evicted, "skipped_elements": self._skipped,
                    "cached_elements": len(self._entries) - self._split_ends, "cached_bytes": self._bytes,
                    "trainers": len(self._cursors), "served_elements": sum(self._served.values()),
                    "served_by_trainer": dict(self._served)}


class TrainerView:
    """One reader's side of a task's cache: what ``responses.Prepared.give_back`` returns an
    undelivered answer to (it has the ``untake`` of a ``TaskRunner``)."""

    def __init__(self, cache: TrainerCache, trainer_id: str, client_id: int):
        self.cache = cache
        self.trainer_id = trainer_id
        self.client_id = client_id

    def untake(self, elements: list, runs: list) -> None:
        self.cache.untake(self.trainer_id, self.client_id, runs)
