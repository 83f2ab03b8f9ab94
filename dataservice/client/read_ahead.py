"""How far a reader reads ahead of its consumer: adaptive, so that the readers of a shared job share it.

A reader's *read-ahead* is what it has asked the workers for and its consumer has not taken yet
(requested, in flight, or buffered). A large read-ahead keeps a fast consumer fed with large, cheap
requests; but in a shared job (``job_name``) whatever one reader has asked for is gone for the others:
with a fixed read-ahead of 1,024 elements, the first reader of a 1,000-element job took all of it.
``ReadAhead`` keeps it at about what the consumer takes while the next answer is in flight:

- it starts at ``INITIAL_READ_AHEAD`` elements;
- whenever the consumer finds nothing buffered (it keeps up with all that arrives), it doubles, at most
  once per round trip, so that a fast consumer reaches large requests within a few round trips;
- it follows ``consumption rate x round trip x SAFETY_FACTOR``: it rises with it, and when the consumer
  was never kept waiting since the last measurement it falls towards it (at most halving each time);
- it never exceeds ``most`` (``max_outstanding_requests``, the memory bound).

Readers of a shared job then each hold a few round trips' worth of elements, and ask for more as their
consumers take them, so they take the job's elements at the rates their consumers take them.

The round trip is the median of the recent answers that carried elements (a long poll of a worker with
nothing ready says nothing about the network). The consumption rate is the highest of the last few rates,
each measured over at least a round trip: a consumer taking elements in bursts (a client-side ``batch``)
needs its burst rate.

The class is pure bookkeeping, given the time: the reader calls it under its credits' lock.

Example::

    >>> ahead = ReadAhead(most=1024)
    >>> ahead.limit
    8
    >>> ahead.answered(round_trip_s=0.001, carried_elements=True, taken=0, now=0.0)
    8
    >>> ahead.waited(now=0.002)  # the consumer took all that arrived: ask for more
    16
"""

from __future__ import annotations

import collections
import math
import statistics
from typing import Optional

__all__ = ["ReadAhead", "INITIAL_READ_AHEAD", "SAFETY_FACTOR"]

#: Elements a reader asks for ahead of its consumer at first. Small, so that a shared job's first reader
#: does not take what the others would read; one request of a few elements costs about what one of one does.
INITIAL_READ_AHEAD = 8
#: The read-ahead aimed at is this many times what the consumer takes during one round trip.
SAFETY_FACTOR = 2.0
#: Round trips the median is taken over.
ROUND_TRIP_SAMPLES = 16
#: Consumption rates the highest is taken of.
RATE_SAMPLES = 4
#: The shortest interval a consumption rate is measured over (a round trip on a local host is shorter).
MIN_RATE_INTERVAL_S = 0.005


class ReadAhead:
    """The read-ahead of one reader, in elements: ``limit``. See the module docstring."""

    def __init__(self, most: int, initial: int = INITIAL_READ_AHEAD, safety: float = SAFETY_FACTOR):
        if not isinstance(most, int) or most < 1:
            raise ValueError(f"the most elements to read ahead must be a positive integer, got {most!r}")
        if not isinstance(initial, int) or initial < 1:
            raise ValueError(f"the initial read-ahead must be a positive integer, got {initial!r}")
        if not safety >= 1:
            raise ValueError(f"the safety factor must be at least 1, got {safety!r}")
        self.most = most
        self.floor = min(most, initial)
        self.safety = safety
        #: The elements the reader may have asked for and its consumer not taken yet.
        self.limit = self.floor
        #: The median recent round trip of answers that carried elements; None before the first.
        self.round_trip_s: Optional[float] = None
        self._round_trips: collections.deque = collections.deque(maxlen=ROUND_TRIP_SAMPLES)
        self._rates: collections.deque = collections.deque(maxlen=RATE_SAMPLES)
        self._mark: Optional[tuple[float, int]] = None  # (when, elements taken then): the current interval
        self._waited = False  # whether the consumer found nothing buffered during the current interval
        self._grown_at = -math.inf

    @property
    def rate(self) -> float:
        """Elements per second the consumer takes (the highest recent measurement; 0 before any)."""
        return max(self._rates, default=0.0)

    def target(self) -> int:
        """``rate x round trip x safety``, in elements (0 before both are measured)."""
        if self.round_trip_s is None:
            return 0
        return math.ceil(self.rate * self.round_trip_s * self.safety)

    def answered(self, round_trip_s: float, carried_elements: bool, taken: int, now: float) -> int:
        """A worker answered a request after ``round_trip_s``; ``taken`` counts the elements the consumer
        has taken so far. Returns the new limit."""
        if carried_elements:
            self._round_trips.append(max(0.0, round_trip_s))
            self.round_trip_s = statistics.median(self._round_trips)
        if self._mark is None:
            self._mark = (now, taken)
            return self.limit
        since, taken_then = self._mark
        elapsed = now - since
        if self.round_trip_s is None or elapsed < max(self.round_trip_s, MIN_RATE_INTERVAL_S):
            return self.limit
        self._rates.append((taken - taken_then) / elapsed)
        self._mark = (now, taken)
        target = self.target()
        if target > self.limit:
            self.limit = min(self.most, target)
        elif not self._waited:
            # The read-ahead sufficed throughout: give back what the consumer does not need (slowly,
            # as one measurement can be low by chance).
            self.limit = max(self.floor, target, self.limit // 2)
        self._waited = False
        return self.limit

    def waited(self, now: float) -> int:
        """The consumer found nothing buffered and waits for elements. Returns the new limit."""
        self._waited = True
        # Before a first answer there is nothing to learn from (the task may still be starting), and one
        # doubling per round trip is as fast as an answer can show whether it helped.
        if self.round_trip_s is None or now - self._grown_at < self.round_trip_s:
            return self.limit
        self._grown_at = now
        self.limit = min(self.most, max(self.limit * 2, self.target()))
        return self.limit
