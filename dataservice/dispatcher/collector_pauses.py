"""Python's garbage collector in a dispatcher process: full collections rarely, young ones as usual.

A dispatcher holds its whole state in Python objects (180,000 at 2,000 workers and 1,000 readers), and
every call allocates more: gRPC's asyncio server alone leaves a reference cycle of five objects per call
(freed by the young collections). With CPython's default thresholds (700, 10, 10), enough allocations
survived into the oldest generation that a full collection ran every 3.5-10 s, and each walked the whole
state with the event loop stopped: 165-190 ms at 2,000 workers and 1,000 readers, 140-310 ms with 10,000
readers. Every heartbeat and GetSplit in flight waited for it: the worst of the fleet's late polls.

``reduce_full_collections`` keeps the young generations' thresholds (what dies young, such as gRPC's
cycles, is still freed within milliseconds) and asks for a full collection only after
``FULL_COLLECTION_EVERY`` collections of the middle generation instead of 10: at those fleets, one every
several minutes instead of every few seconds. Cyclic garbage that lives long enough to reach the oldest
generation waits longer to be freed; the dispatcher makes little of it (its state is freed by reference
counting).

Full collections still come, rarely, and each still stops everything. At 2,000 workers and 10,000 readers
the collector tracks 230,000 objects (most of them the readers' soft state and the calls in flight), and a
full collection of them took 160-290 ms (timed at the dispatcher's exit; none came in the first 120 s of
that fleet). ``FULL_COLLECTIONS`` (``watch_full_collections``, which the dispatcher server starts) times
each one, so that a burst of late heartbeats can be told from a collection's pause: ``/metrics`` has
``dataservice_gc_full_collections_total`` and ``dataservice_gc_full_collection_seconds`` (a histogram),
``/status.json`` the latest ones ("gc").

Example::

    >>> reduce_full_collections()      # by ``dataservice dispatcher``, once, at start
    >>> gc.get_threshold()
    (700, 10, 1000)
    >>> watch_full_collections()       # by DispatchServer.start; idempotent
    >>> FULL_COLLECTIONS.snapshot().pauses.count
    0
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import gc
import time

from dataservice.service.latency_histogram import HistogramSnapshot, cumulative_snapshot

__all__ = ["reduce_full_collections", "FULL_COLLECTION_EVERY", "watch_full_collections", "FULL_COLLECTIONS",
           "FullCollections", "FullCollectionsSnapshot", "PAUSE_BOUNDS_S"]

#: Middle-generation collections between two full ones (CPython's default is 10).
FULL_COLLECTION_EVERY = 1000


def reduce_full_collections() -> None:
    """Sets this process's collector as the module docstring says. For a process that is a dispatcher:
    it changes the whole process's collector."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)


#: Upper bounds (seconds) of the pause histogram's buckets.
PAUSE_BOUNDS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: The latest full collections kept for ``/status.json``.
RECENT_KEPT = 16


@dataclasses.dataclass(frozen=True)
class FullCollectionsSnapshot:
    """Full collections since the watch began: their pauses (``pauses.count``, ``pauses.sum_s`` and the
    cumulative buckets, the last bound +Inf), and the latest ``RECENT_KEPT`` as ``(unix time it ended,
    seconds, objects collected)``."""

    pauses: HistogramSnapshot
    recent: tuple[tuple[float, float, int], ...]


class FullCollections:
    """Times this process's full (generation 2) collections, from ``gc.callbacks``.

    The callback runs inside the collector, in whichever thread allocated: it takes no lock (one held by
    the same thread, if that thread was inside ``snapshot``, would never be let go) and only adds to plain
    counters, which the GIL keeps whole. A ``snapshot`` taken during a collection may miss that one.
    """

    def __init__(self) -> None:
        self._counts = [0] * (len(PAUSE_BOUNDS_S) + 1)
        self._total_s = 0.0
        self._recent: collections.deque = collections.deque(maxlen=RECENT_KEPT)
        self._started: float | None = None
        self._installed = False

    def install(self) -> None:
        """Starts timing (idempotent)."""
        if not self._installed:
            gc.callbacks.append(self._on_collection)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._on_collection)
            self._installed = False

    def _on_collection(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return  # installed during this collection
        seconds, self._started = time.perf_counter() - self._started, None
        self._counts[bisect.bisect_left(PAUSE_BOUNDS_S, seconds)] += 1
        self._total_s += seconds
        self._recent.append((time.time(), seconds, int(info.get("collected", 0))))

    def snapshot(self) -> FullCollectionsSnapshot:
        counts, total, recent = list(self._counts), self._total_s, tuple(self._recent)
        return FullCollectionsSnapshot(cumulative_snapshot(PAUSE_BOUNDS_S, counts, total), recent)


#: This process's full collections (one collector per process, so one watch).
FULL_COLLECTIONS = FullCollections()


def watch_full_collections() -> None:
    """Starts timing this process's full collections into ``FULL_COLLECTIONS`` (idempotent)."""
    FULL_COLLECTIONS.install()
