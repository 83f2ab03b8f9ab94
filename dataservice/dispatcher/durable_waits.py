"""Calls that wait on the event loop for the journal's group commit.

In fault-tolerant mode a call answers only once what it committed (or could have read) is fsynced.
Waiting for that on the server's thread pool cost every call a thread hop: a pool thread woken to
block on the journal's condition, woken again by the fsync, then a wake-up of the loop to answer.

Here a waiting call costs a future in a heap ordered by sequence number. The journal's flusher
calls one listener per fsync (``Journal.add_durable_listener``), which schedules ``_wake`` on the
loop: it resolves every future whose records are now durable. So the loop wakes once per fsync,
however many calls the fsync covers. Only when that does not settle it (the write failed, or the
fsync takes longer than ``timeout_s``) does a call fall back to the blocking wait on the pool,
which rolls the state back and raises as before.

Example::

    >>> waits = DurableWaits(server.run)           # one per server, used on its loop
    >>> wait = core.durability()
    >>> if wait is not None:
    ...     await waits.wait(wait)                 # returns once durable; JournalError if not
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
from typing import Awaitable, Callable

from dataservice.dispatcher.journal import DurableWait, Journal
from dataservice.dispatcher.long_polls import wait_or_timeout

__all__ = ["DurableWaits", "DURABLE_TIMEOUT_S"]

#: How long a call waits on the loop before it hands the wait to the pool, where ``Journal.wait_durable``
#: waits as long again and then raises: an fsync this slow is a sick disk, and the caller hears so.
DURABLE_TIMEOUT_S = 30.0


class DurableWaits:
    """Futures of the calls waiting for an fsync, per journal; see the module docstring.
    Used from one event loop only (the server's)."""

    def __init__(self, run_blocking: Callable[[Callable[[], None]], Awaitable]):
        self._run_blocking = run_blocking
        # Per journal (a rollback opens a new one): (seq, arrival, future), the lowest seq first.
        self._waiting: dict[Journal, list[tuple[int, int, asyncio.Future]]] = {}
        self._arrivals = itertools.count()
        #: Wake-ups from the journal's listener, and calls released by them: tests read these.
        self.wakeups = 0
        self.released = 0

    async def wait(self, pending: DurableWait, timeout_s: float = DURABLE_TIMEOUT_S) -> None:
        """Returns once ``pending``'s records are durable; JournalError (after a rollback) if writing failed."""
        journal, seq = pending.journal, pending.seq
        loop = asyncio.get_running_loop()
        heap = self._waiting.get(journal)
        if heap is None and not journal.failed:
            # Registered before the check below: an fsync that ends after it always wakes us.
            heap = self._waiting[journal] = []
            journal.add_durable_listener(functools.partial(loop.call_soon_threadsafe, self._wake, journal))
        if heap is not None and not journal.is_durable(seq) and not journal.failed:
            future = loop.create_future()
            heapq.heappush(heap, (seq, next(self._arrivals), future))
            await wait_or_timeout(future, timeout_s)  # on a timeout, the blocking wait below says why
        if not journal.is_durable(seq):
            await self._run_blocking(pending)

    def _wake(self, journal: Journal) -> None:
        heap = self._waiting.get(journal)
        if heap is None:
            return
        self.wakeups += 1
        failed = journal.failed
        while heap and (failed or journal.is_durable(heap[0][0])):
            future = heapq.heappop(heap)[2]
            if not future.done():  # a call cancelled meanwhile left its future behind
                future.set_result(None)
                self.released += 1
        if failed:
            del self._waiting[journal]  # a rollback opens another journal; this one takes no more records
