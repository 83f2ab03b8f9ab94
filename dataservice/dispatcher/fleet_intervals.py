"""Heartbeat intervals sized from the fleet, within the failure-detection budget.

At the defaults a reader heartbeats every second and a worker's heartbeat long poll is answered
after a second without news. One dispatcher answers about three thousand short calls a second on a core, so past 250
readers, or 125 workers, the intervals stretch with the fleet: the dispatcher aims at
``CLIENT_HEARTBEATS_PER_S`` reader heartbeats and ``WORKER_POLLS_PER_S`` worker polls a second in all.
They never stretch past what failure detection allows: a reader is told at most a quarter of
``client_timeout_ms`` (so three heartbeats can be missed before it is declared gone), and a worker's
poll is held at most half of ``worker_timeout_ms`` (it is seen at the start of every poll).

A worker's poll is held a little longer than that, by a random spread of up to ``POLL_SPREAD``: a new
job answers every worker's poll at once, and without the spread their next polls would all end in the
same instant forever after (500 workers: a 170 ms burst every interval, and the last answers that late).
Where that would pass the failure-detection budget (2,000 workers: every poll held the budget's 5 s), the
spread goes below it instead, by up to half of ``POLL_SPREAD``: polls held to one cap would end together.
That spread undoes a burst only slowly, though: 2,000 polls answered together by a new job still ended within
the same 1.25 s four rounds later, and those waves were late by up to half a second. So the poll that follows
an answer with news (``after_news``) is held anywhere from what the worker asked to the longest wait, at
random: one round spreads the fleet over the whole interval again.

A task asks for its splits one GetSplit at a time, so a fleet's splits cost the dispatcher a call each: 2,000
workers with a task in each of two jobs, each task through a split every 2 s, are 2,000 calls a second. Past
``SPLIT_LEASE_WORKERS`` workers one answer leases several splits (``splits_per_lease``), up to what the task
asks (``GetSplitRequest.max_splits``) and ``MAX_SPLITS_PER_LEASE``, but only while every task of the
iteration could still get as many: the epoch's end is shared out one split at a time, so no worker holds
splits it has not begun while another has none. A deterministic read (and elastic readers, which share its
order) takes one at a time, so that the group its readers wait for is never queued behind others.

A small cluster's task leases several splits too when it goes through them quickly: a 2,000-image epoch
cut into 63 splits of one batch each (so that both workers get work to the end) cost each split a
GetSplit and a reader's report, about 3 ms of CPU across the processes, 6% of the epoch's CPU. A task that
comes back for more within ``LEASE_WORK_S`` is leased what it would produce in about that long
(``splits_per_lease(..., split_s=...)``), under the same cap at the epoch's end.

What stretching costs: news still arrives at once (a long poll is answered as soon as there is some;
a reader's heartbeat is sent early when a split ends), and a dead worker or reader is still noticed
within its timeout. What waits longer is what only heartbeats carry: a reader's delivered offsets
and stats, a worker's load report and finished tasks (at most the stretched interval late).

Example::

    >>> client_heartbeat_s(readers=2_000, client_timeout_ms=60_000)
    8.0
    >>> worker_poll_s(asked_s=1.0, workers=2_000, worker_timeout_ms=10_000)
    5.0
    >>> worker_poll_s(asked_s=1.0, workers=10, worker_timeout_ms=10_000, spread=0.5)
    1.25
    >>> worker_poll_s(asked_s=1.0, workers=2_000, worker_timeout_ms=10_000, spread=0.5, after_news=True)
    3.0
    >>> splits_per_lease(asked=8, workers=2_000, splits_left=None, tasks=2_000)   # an infinite dataset
    8
    >>> splits_per_lease(asked=8, workers=2_000, splits_left=5_000, tasks=2_000)  # near the epoch's end
    2
    >>> splits_per_lease(asked=8, workers=100, splits_left=None, tasks=100)       # a small cluster
    1
"""

from __future__ import annotations

import math
from typing import Optional

__all__ = ["client_heartbeat_s", "worker_poll_s", "splits_per_lease", "PollsAfterNews", "CLIENT_HEARTBEATS_PER_S",
           "WORKER_POLLS_PER_S", "POLL_SPREAD", "AFTER_NEWS_S", "SPLIT_LEASE_WORKERS", "MAX_SPLITS_PER_LEASE"]

#: Reader heartbeats a second the dispatcher aims at in all, once its readers are many (each costs it
#: about 0.3 ms of CPU, most of it gRPC's own: see docs/how-to/capacity.md).
CLIENT_HEARTBEATS_PER_S = 250
#: Worker heartbeat polls a second the dispatcher aims at in all, once its workers are many.
WORKER_POLLS_PER_S = 125
#: A held poll lasts up to this fraction longer than its stretched wait, at random (never shorter than
#: what the worker asked, never past half of ``worker_timeout_ms``).
POLL_SPREAD = 0.5
#: A poll that comes this soon after its worker's answer with news follows it (``worker_poll_s``'s after_news).
AFTER_NEWS_S = 2.0
#: One more split per GetSplit answer for every this many registered workers (up to 250: one split a call).
SPLIT_LEASE_WORKERS = 250
#: The most splits one GetSplit answer leases.
MAX_SPLITS_PER_LEASE = 8
#: A task that took less than this per split (measured between its GetSplits) is leased about this much
#: work at once, up to ``MAX_SPLITS_PER_LEASE`` splits. Half a second: at a small cluster's pace a GetSplit
#: costs 1-2 ms of CPU on each side (``benchmarks.grpc_call_cost``), and a quarter second left a 2,000-image
#: epoch of 63 splits 26 of them; the epoch's end is shared out one split at a time whatever this is.
LEASE_WORK_S = 0.5


def client_heartbeat_s(readers: int, client_timeout_ms: int) -> float:
    """How often a reader heartbeats: every second (sooner with a short ``client_timeout_ms``), stretched
    to keep ``readers`` at ``CLIENT_HEARTBEATS_PER_S`` in all, and at most a quarter of the timeout."""
    quarter = client_timeout_ms / 4000
    base = max(0.01, min(1.0, quarter))
    return max(base, min(readers / CLIENT_HEARTBEATS_PER_S, quarter))


def worker_poll_s(asked_s: float, workers: int, worker_timeout_ms: int, spread: float = 0.0,
                  after_news: bool = False) -> float:
    """How long a worker's heartbeat waits for news: what it asked, stretched to keep ``workers`` at
    ``WORKER_POLLS_PER_S`` in all, ``spread`` (0 to 1, random per poll) times ``POLL_SPREAD`` longer,
    and never past half of ``worker_timeout_ms`` (nor 60 s): past it, ``spread`` times half of
    ``POLL_SPREAD`` shorter than that half instead (but not shorter than what the worker asked).
    ``after_news``: the poll follows an answer with news; it is held ``spread`` of the way from what the
    worker asked to the longest of those waits."""
    half = min(worker_timeout_ms / 2000, 60.0)
    if after_news:
        shortest = min(asked_s, half)
        longest = min(max(asked_s, workers / WORKER_POLLS_PER_S) * (1.0 + POLL_SPREAD), half)
        return max(0.0, shortest + (longest - shortest) * spread)
    stretched = max(asked_s, workers / WORKER_POLLS_PER_S) * (1.0 + POLL_SPREAD * spread)
    if stretched > half:
        stretched = max(min(asked_s, half), half * (1.0 - POLL_SPREAD / 2 * spread))
    return max(0.0, stretched)


class PollsAfterNews:
    """Which workers were last answered with news, so that their next poll is spread widely
    (``worker_poll_s(after_news=True)``). Used on the server's event loop only.

    Example::

        >>> polls = PollsAfterNews()
        >>> polls.answered("w1:5051", news=True, now=10.0, workers=2)
        >>> polls.follows_news("w1:5051", now=10.1), polls.follows_news("w1:5051", now=10.2)
        (True, False)
    """

    def __init__(self) -> None:
        self._news_at: dict[str, float] = {}  # address -> when its last poll was answered with news

    def answered(self, address: str, news: bool, now: float, workers: int) -> None:
        if not news:
            return
        if len(self._news_at) > 2 * workers + 1_000:
            self._news_at.clear()  # workers gone for good leave entries that are never read
        self._news_at[address] = now

    def follows_news(self, address: str, now: float) -> bool:
        """Whether this poll of ``address`` follows its answer with news (read once: the next one does not)."""
        return now - self._news_at.pop(address, -math.inf) < AFTER_NEWS_S


def splits_per_lease(asked: int, workers: int, splits_left: Optional[int], tasks: int,
                     split_s: Optional[float] = None) -> int:
    """How many new splits one GetSplit answer leases: one per ``SPLIT_LEASE_WORKERS`` registered ``workers``
    (rounded up), or, for a task that took ``split_s`` per split since its last GetSplit, what it produces in
    ``LEASE_WORK_S``, whichever is more; at most what the task ``asked`` for (0: one) and
    ``MAX_SPLITS_PER_LEASE``, and no more than each of the iteration's ``tasks`` could still take of the
    ``splits_left`` (None: an infinite dataset).

    Example::

        >>> splits_per_lease(8, 2, 60, 2), splits_per_lease(8, 2, 60, 2, split_s=0.1)
        (1, 5)
        >>> splits_per_lease(8, 2, 60, 2, split_s=1.0), splits_per_lease(8, 2, 5, 2, split_s=0.1)
        (1, 2)
    """
    by_fleet = math.ceil(workers / SPLIT_LEASE_WORKERS)
    # (A hair over the quotient: 0.5 / 0.1 is 4.999... in binary, and a 100 ms split should get 5.)
    by_pace = math.floor(LEASE_WORK_S / split_s + 1e-9) if split_s is not None and split_s > 0 else 1
    count = min(max(1, asked), MAX_SPLITS_PER_LEASE, max(1, by_fleet, by_pace))
    if splits_left is not None:
        count = min(count, max(1, splits_left // max(1, tasks)))
    return count
