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
"""

from __future__ import annotations

__all__ = ["client_heartbeat_s", "worker_poll_s", "CLIENT_HEARTBEATS_PER_S", "WORKER_POLLS_PER_S", "POLL_SPREAD"]

#: Reader heartbeats a second the dispatcher aims at in all, once its readers are many (each costs it
#: about 0.3 ms of CPU, most of it gRPC's own: see README "Capacity").
CLIENT_HEARTBEATS_PER_S = 250
#: Worker heartbeat polls a second the dispatcher aims at in all, once its workers are many.
WORKER_POLLS_PER_S = 125
#: A held poll lasts up to this fraction longer than its stretched wait, at random (never shorter than
#: what the worker asked, never past half of ``worker_timeout_ms``).
POLL_SPREAD = 0.5


def client_heartbeat_s(readers: int, client_timeout_ms: int) -> float:
    """How often a reader heartbeats: every second (sooner with a short ``client_timeout_ms``), stretched
    to keep ``readers`` at ``CLIENT_HEARTBEATS_PER_S`` in all, and at most a quarter of the timeout."""
    quarter = client_timeout_ms / 4000
    base = max(0.01, min(1.0, quarter))
    return max(base, min(readers / CLIENT_HEARTBEATS_PER_S, quarter))


def worker_poll_s(asked_s: float, workers: int, worker_timeout_ms: int, spread: float = 0.0) -> float:
    """How long a worker's heartbeat waits for news: what it asked, stretched to keep ``workers`` at
    ``WORKER_POLLS_PER_S`` in all, ``spread`` (0 to 1, random per poll) times ``POLL_SPREAD`` longer,
    and never past half of ``worker_timeout_ms`` (nor 60 s)."""
    half = min(worker_timeout_ms / 2000, 60.0)
    stretched = max(asked_s, workers / WORKER_POLLS_PER_S) * (1.0 + POLL_SPREAD * spread)
    return max(0.0, min(stretched, half))
