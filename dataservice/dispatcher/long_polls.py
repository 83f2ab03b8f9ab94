"""Long polls that wait without a thread: per-key wakeups from the dispatcher's core to the
asyncio gRPC server.

A worker's heartbeat and a task's GetSplit are long polls: the dispatcher answers when there is
news for *that* worker or iteration, or when the poll's time is up. With a thread-per-call server
each waiting poll held a thread, so only a dozen could wait and every other worker polled twice
per interval. Here a poll is a coroutine parked on a future: thousands wait at the cost of a
future each.

The core tells ``Wakeups.notify(keys)`` which keys a committed change may concern
(``("worker", address)``, ``("iteration", id)``, or ``ALL``), under its lock. A waiter first reads
the key's generation (``generation(key)``, also under the core's lock, right where it decided there
was no news), then ``await wait(key, since, timeout_s)``: a notify that came in between is not
lost, because the generation moved on. Waking one key wakes only that key's waiters, so a GetSplit
commit on one iteration does not wake two thousand idle workers' heartbeats.

Some changes do concern thousands of waiters at once: a new job is news to every worker (the core
notifies its workers as one fan-out, ``DispatcherCore._fan_out_tasks``; past the first ``WAKE_BATCH``, a
distributed_epoch task is made by the pass that answers its worker's woken poll). Such a fan-out is woken
``FAN_OUT_BATCH`` waiters at a time, ``WAKE_SPACING_S`` apart: each woken poll's pass takes about 0.4 ms,
and its worker then asks for a split, so two thousand woken together held every other call, and every
poll whose time was up, for most of a second (and their next polls, sent in that burst, waited in
gRPC's queue as long). Woken in a turn of the loop each, as before, the batches still came back to back.
Paced 32 at a time, a burst took about half the loop while it lasted. At 2,000 workers and 1,000 readers
the worker heartbeats' lateness at p99 went from 340-470 ms to 38 ms, and ClientHeartbeat's and GetSplit's
p99 from 86-195 ms to 25-27 ms; at 500 workers, from 147 to 9 ms. But a dispatcher already at 0.75 of a
core (2,000 workers, 10,000 readers, no journal) had no half loop to give: the fan-out's second ran it at 0.94-0.99,
and 135-846 reader heartbeats came over 100 ms late there (five runs). Paced 8 at a time, that second ran
at 0.63-0.77 and none came late (three runs). A poll the fan-out has not reached yet still hears the news
when its own time is up (its pass runs then too), so at 2,000 workers, whose polls end about 400 a second,
the fan-out adds 160 a second to those. A notification of ``WAKE_BATCH`` waiters or fewer (one worker's
news, an iteration's freed split) wakes them at once, even while a fan-out is being paced.

Example::

    >>> wakeups = Wakeups()
    >>> seen = wakeups.generation(("worker", "w1:5051"))      # under the core's lock, with "no news"
    >>> await wakeups.wait(("worker", "w1:5051"), seen, 5.0)   # True when woken, False on timeout
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Hashable, Iterable

__all__ = ["Wakeups", "ALL", "WAKE_BATCH", "FAN_OUT_BATCH", "WAKE_SPACING_S", "wait_or_timeout"]

#: A notification of this many waiters or fewer wakes them all at once; a larger one is a fan-out, paced.
WAKE_BATCH = 32
#: Waiters of a fan-out woken per turn of the event loop (each runs a pass of its poll, about 0.4 ms).
FAN_OUT_BATCH = 8
#: The pause between two batches of one large fan-out (more than WAKE_BATCH waiters notified at once).
#: A woken worker's poll answers (about 0.4 ms), and its new task asks for a split (as much again):
#: 8 in 50 ms keep a burst's work near an eighth of the loop, whatever the fleet, so that a dispatcher
#: already busy still answers the polls whose time is up meanwhile within tens of ms. The price: a worker
#: hears of a new job when woken or when its poll's time is up, whichever comes first, so half of 500
#: workers hear within about 1 s and the last within about 3 s, half of 2,000 within about 1.6 s and the
#: last within one poll, about 4.5 s (32 at a time: 0.8 and 3 s for the last; tf.data service's workers
#: learn of tasks at their next heartbeat); a fleet of 32 or fewer hears at once.
WAKE_SPACING_S = 0.05

#: A key that wakes every waiter (a change whose reach the core does not narrow down, say a rolled-back state).
ALL = ("all",)


class Wakeups:
    """Generations per key, and the asyncio futures waiting on them. Thread-safe: the core notifies
    from executor threads, waiters park on the server's event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generations: dict[Hashable, int] = {}
        self._everything = 0  # bumped by ALL: every key's generation is (its own, this)
        self._waiters: dict[Hashable, list] = {}
        # Futures notified but not woken yet, per event loop, and the loops whose drain is scheduled.
        self._to_wake: dict[asyncio.AbstractEventLoop, collections.deque] = {}
        self._draining: set = set()
        #: Turns of the event loops that woke waiters of a paced fan-out, and such fan-outs (tests read them).
        self.wake_turns = 0
        self.fan_outs = 0

    def generation(self, key: Hashable) -> tuple[int, int]:
        """``key``'s generation now; from now on ``notify`` counts its changes (until ``forget``)."""
        with self._lock:
            return self._generations.setdefault(key, 0), self._everything

    def notify(self, keys: Iterable[Hashable]) -> None:
        """Wakes the waiters of ``keys`` (``ALL``: every waiter)."""
        woken = []
        with self._lock:
            for key in keys:
                if key == ALL:
                    self._everything += 1
                    for waiters in self._waiters.values():
                        woken.extend(waiters)
                    self._waiters.clear()
                    break
                if key in self._waiters:
                    woken.extend(self._waiters.pop(key))
                # Only keys a poll has read need counting: the others are not remembered at all.
                if key in self._generations:
                    self._generations[key] += 1
        if woken:
            self._wake_in_batches(woken)

    def _wake_in_batches(self, woken: list) -> None:
        if len(woken) <= WAKE_BATCH:
            # Targeted news (one worker's, one iteration's) never waits behind a large fan-out being paced.
            by_loop: dict = {}
            for loop, future in woken:
                by_loop.setdefault(loop, []).append(future)
            for loop, futures in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_wake_all, futures)
                except RuntimeError:  # the loop is closed: its waiters are gone with it
                    pass
            return
        start = []
        with self._lock:
            self.fan_outs += 1
            for loop, future in woken:
                self._to_wake.setdefault(loop, collections.deque()).append(future)
                if loop not in self._draining:
                    self._draining.add(loop)
                    start.append(loop)
        for loop in start:
            try:
                loop.call_soon_threadsafe(self._drain, loop)
            except RuntimeError:  # the loop is closed: its waiters are gone with it
                with self._lock:
                    self._to_wake.pop(loop, None)
                    self._draining.discard(loop)

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: wakes up to FAN_OUT_BATCH of its notified waiters, and comes back for the rest later."""
        with self._lock:
            queue = self._to_wake[loop]
            batch = [queue.popleft() for _ in range(min(FAN_OUT_BATCH, len(queue)))]
            more = bool(queue)
            if not more:
                del self._to_wake[loop]
                self._draining.discard(loop)
            self.wake_turns += 1
        for future in batch:
            _wake(future)
        if more:
            loop.call_later(WAKE_SPACING_S, self._drain, loop)  # what the batch caused is answered first

    def forget(self, key: Hashable) -> None:
        """Drops ``key``'s generation (a worker or iteration removed for good): bounded memory over months."""
        with self._lock:
            if key not in self._waiters:
                self._generations.pop(key, None)

    def waiting(self) -> int:
        """How many polls wait now (GetStatus and the tests read it)."""
        with self._lock:
            return sum(len(w) for w in self._waiters.values())

    async def wait(self, key: Hashable, since: tuple[int, int], timeout_s: float) -> bool:
        """Waits until ``key`` changes after generation ``since`` or ``timeout_s`` passes; whether it changed."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        entry = (loop, future)
        with self._lock:
            if (self._generations.setdefault(key, 0), self._everything) != since:
                return True
            self._waiters.setdefault(key, []).append(entry)
        try:
            return await wait_or_timeout(future, timeout_s)
        finally:
            with self._lock:
                waiters = self._waiters.get(key)
                if waiters is not None and entry in waiters:
                    waiters.remove(entry)
                    if not waiters:
                        del self._waiters[key]


async def wait_or_timeout(future: asyncio.Future, timeout_s: float) -> bool:
    """Whether ``future`` was set within ``timeout_s`` (its result is not read). Unlike ``asyncio.wait_for``,
    a timeout raises nothing: most of a fleet's polls end without news, and ``wait_for``'s cancellation and
    TimeoutError cost twice the CPU (29 against 14 us per timed-out wait on this machine).

    Example::

        >>> await wait_or_timeout(loop.create_future(), 0.01)
        False
    """
    loop = asyncio.get_running_loop()
    timer = loop.call_later(max(0.0, timeout_s), _time_out, future)
    try:
        return await future is not _TIMED_OUT
    finally:
        timer.cancel()


#: The result a timed-out wait's future is given.
_TIMED_OUT = object()


def _time_out(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(_TIMED_OUT)


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _wake_all(futures: list) -> None:
    for future in futures:
        _wake(future)
