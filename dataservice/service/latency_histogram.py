"""A small, thread-safe latency histogram with fixed bucket bounds, for ``/metrics``.

Cheap to record into (a bisect and two adds under a lock), bounded in memory, and read
at scrape time by the Prometheus collectors (``dataservice.dispatcher.metrics``).

Example::

    >>> h = LatencyHistogram()
    >>> h.observe(0.0021)
    >>> h.snapshot().count, h.snapshot().sum_s
    (1, 0.0021)
"""

from __future__ import annotations

import bisect
import dataclasses
import threading

__all__ = ["LatencyHistogram", "HistogramSnapshot", "DEFAULT_BOUNDS_S", "cumulative_snapshot"]

#: Upper bounds (seconds) of the buckets: 50 us to 10 s, for fsyncs and RPCs alike.
DEFAULT_BOUNDS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 10.0)


@dataclasses.dataclass(frozen=True)
class HistogramSnapshot:
    """Cumulative counts per upper bound (the last bound is +Inf), the count and the sum."""

    buckets: tuple[tuple[float, int], ...]
    count: int
    sum_s: float


class LatencyHistogram:
    """Durations in seconds, counted in buckets with fixed upper ``bounds``; see the module docstring."""

    def __init__(self, bounds: tuple[float, ...] = DEFAULT_BOUNDS_S):
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"bounds must be increasing and not empty, got {bounds!r}")
        self._bounds = tuple(bounds)
        self._counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        index = bisect.bisect_left(self._bounds, seconds)
        with self._lock:
            self._counts[index] += 1
            self._sum += seconds

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            counts, total = list(self._counts), self._sum
        return cumulative_snapshot(self._bounds, counts, total)


def cumulative_snapshot(bounds: tuple[float, ...], counts: list[int], sum_s: float) -> HistogramSnapshot:
    """The snapshot of per-bucket ``counts`` (one per bound, then one above every bound): cumulative, as
    Prometheus wants them.

    Example::

        >>> cumulative_snapshot((0.1, 1.0), [2, 0, 1], 3.5).buckets
        ((0.1, 2), (1.0, 2), (inf, 3))
    """
    cumulative, running = [], 0
    for bound, n in zip(tuple(bounds) + (float("inf"),), counts):
        running += n
        cumulative.append((bound, running))
    return HistogramSnapshot(tuple(cumulative), running, sum_s)
