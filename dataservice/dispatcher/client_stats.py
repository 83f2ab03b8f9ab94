"""What readers and workers report about their load, as the dispatcher keeps it: soft state.

Every reader sends its counters (``iterator.stats()``: elements, bytes, the time its consumer waited for
data) in each client heartbeat, and every worker how busy its task producers were in each worker
heartbeat. ``LoadReports`` keeps the latest of each, and a short window of recent ones for the scaling
signal (``scaling.recommend``). None of it is journaled: these are metrics, so a restarted dispatcher starts
without them and learns them again from the next heartbeats (within a second), and a client or worker
that leaves takes its entry with it.

Example::

    >>> reports = LoadReports()
    >>> reports.client_reported(7, job_id=3, iteration_id=4, job_name="train", elements=100, nbytes=800,
    ...                         stall_s=0.5, elapsed_s=2.0, now=10.0, now_unix=1_700_000_000.0)
    >>> reports.client_stats()[0].stall_fraction
    0.25
"""

from __future__ import annotations

import collections
import dataclasses

__all__ = ["ClientStats", "WorkerRecommendation", "WorkerLoad", "LoadReports", "SIGNAL_WINDOW_S"]

#: How far back the scaling signal looks: stall and busy fractions are taken over the reports of the
#: last this many seconds (long enough to smooth a heartbeat's noise, short enough to follow a change).
SIGNAL_WINDOW_S = 10.0
#: Reports kept per client or worker for the window (heartbeats come about once a second).
_SAMPLES_KEPT = 64


@dataclasses.dataclass(frozen=True)
class ClientStats:
    """One reader's latest report (``DispatcherCore.client_stats``).

    ``stall_fraction`` is ``stall_s / elapsed_s`` over the reader's whole read (0 before its first
    ``next()``); ``recent_stall_fraction`` the same over the last ``SIGNAL_WINDOW_S`` of reports (what the
    scaling signal uses). ``last_report_unix`` is when the dispatcher received the report (wall clock).

    Example::

        >>> ClientStats(client_id=7, job_id=3, iteration_id=4, elements=10, bytes=80, stall_s=1.0,
        ...             elapsed_s=4.0, stall_fraction=0.25, last_report_unix=1.7e9).stall_fraction
        0.25
    """

    client_id: int
    job_id: int
    iteration_id: int
    elements: int
    bytes: int
    stall_s: float
    elapsed_s: float
    stall_fraction: float
    last_report_unix: float
    job_name: str = ""
    recent_stall_fraction: float = 0.0


@dataclasses.dataclass(frozen=True)
class WorkerLoad:
    """A worker's producers over the recent window: ``busy_fraction`` is their busy time over the window's
    wall time (capped at 1; several tasks producing at once count once), -1 when the worker never reported."""

    address: str
    busy_fraction: float
    running_tasks: int


@dataclasses.dataclass(frozen=True)
class WorkerRecommendation:
    """The scaling signal (``DispatcherCore.recommended_workers``): ``count`` workers recommended,
    ``current`` live now, and ``reason`` in words (the rule of ``scaling.recommend`` that decided).

    Example::

        >>> WorkerRecommendation(count=3, current=2, reason="clients stall 40% ...").count
        3
    """

    count: int
    current: int
    reason: str


class _Window:
    """Recent (time, a, b) samples of cumulative or per-interval counters, at most ``window_s`` old.

    ``sums()`` is kept until the next sample: a status read takes every worker's busy fraction under the
    dispatcher's lock, 2,000 of them in a large fleet, and most have not changed since the last read.
    Computed when read, not on each heartbeat: readers' windows are never summed."""

    __slots__ = ("samples", "window_s", "_sums")

    def __init__(self, window_s: float) -> None:
        self.samples: collections.deque = collections.deque(maxlen=_SAMPLES_KEPT)
        self.window_s = window_s
        self._sums: tuple[float, float] | None = None

    def add(self, now: float, a: float, b: float) -> None:
        self.samples.append((now, a, b))
        while len(self.samples) > 1 and now - self.samples[0][0] > self.window_s:
            self.samples.popleft()
        self._sums = None

    def sums(self) -> tuple[float, float]:
        """The sums of the samples' ``a`` and of their ``b``."""
        if self._sums is None:
            self._sums = (sum(s[1] for s in self.samples), sum(s[2] for s in self.samples))
        return self._sums


@dataclasses.dataclass
class _ClientEntry:
    stats: ClientStats
    window: _Window
    seen: float


@dataclasses.dataclass
class _WorkerEntry:
    window: _Window
    running_tasks: int
    seen: float


class LoadReports:
    """The latest reports of clients and workers (in memory, never journaled), and a window of
    ``window_s`` seconds of recent ones for the scaling signal. Not thread-safe: the dispatcher's core
    calls it under its lock."""

    def __init__(self, window_s: float = SIGNAL_WINDOW_S) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be a positive number of seconds, got {window_s!r}")
        self.window_s = window_s
        self._clients: dict[int, _ClientEntry] = {}
        self._workers: dict[str, _WorkerEntry] = {}

    # --- clients --------------------------------------------------------------------------------
    def client_reported(self, client_id: int, job_id: int, iteration_id: int, job_name: str, elements: int,
                        nbytes: int, stall_s: float, elapsed_s: float, now: float, now_unix: float) -> None:
        """Records a reader's cumulative counters, received at ``now`` (the dispatcher's monotonic clock)."""
        entry = self._clients.get(client_id)
        if entry is None:
            entry = self._clients[client_id] = _ClientEntry(None, _Window(self.window_s), now)  # type: ignore
        elif elapsed_s < entry.window.samples[-1][1]:
            entry.window = _Window(self.window_s)  # counters that went back: another read (never from our readers)
        entry.window.add(now, elapsed_s, stall_s)
        entry.seen = now
        _, first_elapsed, first_stall = entry.window.samples[0]
        span = elapsed_s - first_elapsed
        # Over the window when it spans some time, else over the whole read (the first report).
        recent = (stall_s - first_stall) / span if span > 0 else (stall_s / elapsed_s if elapsed_s > 0 else 0.0)
        entry.stats = ClientStats(
            client_id=client_id, job_id=job_id, iteration_id=iteration_id, elements=elements, bytes=nbytes,
            stall_s=stall_s, elapsed_s=elapsed_s, stall_fraction=_fraction(stall_s, elapsed_s),
            last_report_unix=now_unix, job_name=job_name, recent_stall_fraction=min(1.0, max(0.0, recent)))

    def forget_client(self, client_id: int) -> None:
        """The client left (released, or timed out): its report goes with it."""
        self._clients.pop(client_id, None)

    def client_stats(self) -> list[ClientStats]:
        """Every current client's latest report, in no particular order (sorting 10,000 of them is left to the
        caller, outside the dispatcher's lock: each report is replaced by the next, never changed)."""
        return [e.stats for e in self._clients.values()]

    def recent_clients(self, now: float) -> list[ClientStats]:
        """The clients that reported within the window (a client whose consumer is gone stops counting), in no
        particular order."""
        return [e.stats for e in self._clients.values() if now - e.seen <= self.window_s]

    # --- workers --------------------------------------------------------------------------------
    def worker_reported(self, address: str, interval_s: float, busy_s: float, running_tasks: int,
                        now: float) -> None:
        """Records one worker heartbeat's load report (per interval, not cumulative)."""
        entry = self._workers.get(address)
        if entry is None:
            entry = self._workers[address] = _WorkerEntry(_Window(self.window_s), 0, now)
        entry.window.add(now, max(0.0, interval_s), max(0.0, busy_s))
        entry.running_tasks = running_tasks
        entry.seen = now

    def forget_worker(self, address: str) -> None:
        self._workers.pop(address, None)

    def worker_load(self, address: str) -> WorkerLoad:
        """The worker's busy fraction over the window's reports (-1: it never reported one)."""
        entry = self._workers.get(address)
        if entry is None:
            return WorkerLoad(address, -1.0, 0)
        interval, busy = entry.window.sums()
        return WorkerLoad(address, min(1.0, busy / interval) if interval > 0 else 0.0, entry.running_tasks)


def _fraction(part: float, whole: float) -> float:
    return min(1.0, max(0.0, part / whole)) if whole > 0 else 0.0
